"""Container image references, parsed once: `[registry/]name[:tag][@sha256:digest]`.

The registry is the first path component when it holds a dot or a colon or is `localhost` (Docker's
rule), so `registry:5000/name:tag` keeps its port out of the tag. A reference is pinned when it
carries a digest, or a tag other than `latest`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    r"^(?:(?P<registry>[A-Za-z0-9.-]+(?::[0-9]+)?)/)?"
    rf"(?P<path>{_NAME}(?:/{_NAME})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


@dataclass(frozen=True)
class ImageRef:
    registry: str | None
    path: str  # the name within the registry, e.g. "lmsysorg/sglang"
    tag: str | None
    digest: str | None  # "sha256:<64 hex>"

    @property
    def repository(self) -> str:
        """Registry and name, what Helm's `image.repository` and `docker pull` before the tag take."""
        return f"{self.registry}/{self.path}" if self.registry else self.path

    @property
    def pinned(self) -> bool:
        return self.digest is not None or (self.tag is not None and self.tag != "latest")

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.repository}{tag}{digest}"


def parse_image(reference: str) -> ImageRef:
    """`reference` as its parts; ValueError names what is wrong with it."""
    match = _REFERENCE.match(reference)
    if match is None:
        raise ValueError(
            f"image {reference!r} is not a reference of the form [registry/]name[:tag][@sha256:<64 hex digits>]"
        )
    registry = match["registry"]
    path = match["path"]
    if registry is not None and not ("." in registry or ":" in registry or registry == "localhost"):
        if not re.fullmatch(_NAME, registry):
            raise ValueError(f"image {reference!r}: {registry!r} is neither a registry nor a lower-case name")
        path, registry = f"{registry}/{path}", None  # "lmsysorg/sglang": a Docker Hub namespace
    return ImageRef(registry=registry, path=path, tag=match["tag"], digest=match["digest"])


def parse_pinned_image(reference: str) -> ImageRef:
    """A reference that names one image for good: a digest, or a tag other than `latest`."""
    ref = parse_image(reference)
    if ref.tag == "latest" and ref.digest is None:
        raise ValueError(f"image {reference!r} uses 'latest'; pin a version tag or a digest")
    if not ref.pinned:
        raise ValueError(f"image {reference!r} has no tag; pin it, e.g. 'repo/name:v1.2.3' or 'repo/name@sha256:...'")
    return ref
