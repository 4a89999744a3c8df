"""Which NVIDIA drivers a CUDA image accepts, read from its `NVIDIA_REQUIRE_CUDA` declaration.

NVIDIA's CUDA base images set `NVIDIA_REQUIRE_CUDA`, and the NVIDIA container runtime refuses to
start a container on a host that satisfies none of its space-separated alternatives:
- `cuda>=X.Y`: the driver supports CUDA X.Y natively, i.e. it is at least the minimum driver the
  CUDA X.Y toolkit release notes list (`CUDA_MINIMUM_DRIVER`);
- `brand=B,driver>=N,driver<M`: a driver of branch N on a GPU of brand B (NVML's nvmlDeviceGetBrand,
  named as below); this is CUDA forward compatibility through the image's cuda-compat libraries,
  which NVIDIA supports on datacenter GPUs only: elsewhere CUDA fails at start with error 804.
This module is a leaf: profiles, the doctor and the generated Ansible variables read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Minimum Linux x86_64/aarch64 driver of each CUDA toolkit release (the GA release of each minor
# version), from the CUDA toolkit release notes' table "CUDA Toolkit and Corresponding Driver Versions".
CUDA_MINIMUM_DRIVER: dict[tuple[int, int], str] = {
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}
# Datacenter GPUs, the only ones forward compatibility runs on: NVML calls their brand TESLA (older
# boards) or NVIDIA (`nvidia-smi -q` "Product Brand : NVIDIA" on T4, A100, H100, GH200), and the images'
# declarations name both. GeForce, Titan and the RTX/Quadro workstation brands need a driver >= the floor.
DATACENTER_BRANDS = ("nvidia", "tesla")

_CUDA = re.compile(r"^cuda>=(\d+)\.(\d+)$")
_BRANCH = re.compile(r"^brand=(\w+),driver>=(\d+),driver<(\d+)$")


def version_tuple(text: str) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6); non-numeric parts are ignored."""
    return tuple(int(p) for p in text.split(".") if p.isdigit())


@dataclass(frozen=True)
class BranchRange:
    """`brand=B,driver>=low,driver<high`: one driver branch the image accepts on brand B."""

    brand: str
    low: int
    high: int

    def admits(self, driver: str) -> bool:
        return self.low <= version_tuple(driver)[0] < self.high


@dataclass(frozen=True)
class DriverVerdict:
    ok: bool
    rule: str  # the alternative of the declaration that matched, or why none did


@dataclass(frozen=True)
class CudaRequirement:
    """A parsed `NVIDIA_REQUIRE_CUDA` value."""

    declaration: str
    cuda: tuple[int, int]
    branches: tuple[BranchRange, ...]

    @property
    def floor(self) -> str:
        """The least driver that runs the image natively (the CUDA version's own minimum)."""
        return CUDA_MINIMUM_DRIVER[self.cuda]

    @property
    def cuda_text(self) -> str:
        return f"{self.cuda[0]}.{self.cuda[1]}"

    @property
    def datacenter_branches(self) -> list[int]:
        """Driver branches below the floor that datacenter GPUs may keep (forward compatibility)."""
        return sorted({b.low for b in self.branches if b.brand in DATACENTER_BRANDS})

    @property
    def datacenter_brands(self) -> list[str]:
        """The datacenter brands the declaration names: the GPUs forward compatibility runs on."""
        return sorted({b.brand for b in self.branches if b.brand in DATACENTER_BRANDS})

    def check(self, driver: str, brand: str | None = None) -> DriverVerdict:
        """Does `driver` (e.g. '570.195.03') run this image on a GPU of `brand` (NVML's, as the declaration
        names it; None: unknown, judged as a datacenter GPU)?"""
        if version_tuple(driver) >= version_tuple(self.floor):
            return DriverVerdict(True, f"cuda>={self.cuda_text}: driver >= {self.floor}, CUDA "
                                       f"{self.cuda_text}'s minimum")
        for branch in self.branches:
            if branch.brand == (brand or "tesla") and branch.brand in DATACENTER_BRANDS and branch.admits(driver):
                return DriverVerdict(True, f"brand={branch.brand},driver>={branch.low},driver<{branch.high}: "
                                           "datacenter forward compatibility")
        accepted = ", ".join(str(b) for b in self.datacenter_branches) or "none"
        below = f"below the floor {self.floor} (cuda>={self.cuda_text})"
        if brand is not None and brand not in DATACENTER_BRANDS:
            return DriverVerdict(False, f"{below} on a {brand} GPU: forward compatibility (branches {accepted}) "
                                        f"runs on datacenter GPUs only (brand {' or '.join(DATACENTER_BRANDS)}), "
                                        "elsewhere CUDA fails at start with error 804")
        return DriverVerdict(False, f"{below} and in none of the datacenter branches the image accepts ({accepted})")


def parse_requirement(declaration: str) -> CudaRequirement:
    """Parse `cuda>=X.Y brand=B,driver>=N,driver<M ...`; ValueError names the word it cannot read."""
    cuda: tuple[int, int] | None = None
    branches: list[BranchRange] = []
    for word in declaration.split():
        if match := _CUDA.match(word):
            cuda = (int(match[1]), int(match[2]))
        elif match := _BRANCH.match(word):
            branches.append(BranchRange(match[1], int(match[2]), int(match[3])))
        else:
            raise ValueError(f"NVIDIA_REQUIRE_CUDA: cannot read {word!r}")
    if cuda is None:
        raise ValueError("NVIDIA_REQUIRE_CUDA: no cuda>=X.Y alternative")
    if cuda not in CUDA_MINIMUM_DRIVER:
        raise ValueError(f"NVIDIA_REQUIRE_CUDA: CUDA {cuda[0]}.{cuda[1]} has no known minimum driver; "
                         "add it to CUDA_MINIMUM_DRIVER from the CUDA toolkit release notes")
    return CudaRequirement(declaration, cuda, tuple(branches))
