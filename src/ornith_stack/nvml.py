"""The project's one way into NVML (`nvidia-ml-py`, imported as `pynvml`): the doctor's GPU probe and the
exporter's GPU collector both start it here, so "no GPU" means the same thing to both and is explained the
same way.

Only a missing `pynvml`, a missing NVML library (no driver on the host, or a container without the NVIDIA
runtime) and zero devices mean "no GPU". Anything else NVML answers (driver not loaded, no permission, a GPU
lost) is an error of a GPU host.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any


class NoGpu(Exception):
    """No NVIDIA GPU is usable: NVML missing, no driver, no permission, or zero devices."""


def nvml_module() -> ModuleType:
    """The `pynvml` module; NoGpu when the package is not installed."""
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError as exc:  # the package is a dependency, but an image may lack it
        raise NoGpu(f"nvidia-ml-py is not installed ({exc})") from None
    return pynvml


def absent(nvml: Any, exc: Exception) -> bool:
    """Whether NVML's failure to start says this host (or container) has no NVIDIA driver at all, rather
    than a GPU host whose driver or devices fail."""
    return isinstance(exc, nvml.NVMLError_LibraryNotFound)


def why_failed(nvml: Any, exc: Exception) -> str:
    """What NVML's failure to start means, in words an operator can act on."""
    if isinstance(exc, nvml.NVMLError_LibraryNotFound):
        return ("NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this host, or the container "
                "runs without the NVIDIA runtime (docker --gpus all, compose 'gpus: all', Kubernetes "
                "runtimeClassName: nvidia)")
    if isinstance(exc, nvml.NVMLError_DriverNotLoaded):
        return "the NVIDIA kernel driver is not loaded: install it, or reboot after installing it"
    if isinstance(exc, nvml.NVMLError_NoPermission):
        return "no permission to open the GPU device files (/dev/nvidia*): run as a user who may"
    return f"NVML could not start ({exc})"


def text(value: str | bytes) -> str:
    """An NVML string (older bindings answer bytes)."""
    return value.decode() if isinstance(value, bytes) else value
