"""The table of NVIDIA GPUs (gpus.yaml beside this module): what NVML calls each one and what it has.

The doctor's `--profile auto`, the shipped profiles (`hardware.gpu.models`) and `profiles new` all
identify GPUs here, so a GPU's NVML name patterns and memory are written once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml

from ornith_stack.errors import UserError

TABLE = Path(str(resources.files(__package__))) / "gpus.yaml"
Interconnect = Literal["nvswitch", "nvlink", "pcie"]
_INTERCONNECTS = ("nvswitch", "nvlink", "pcie")


@dataclass(frozen=True)
class GpuModel:
    key: str
    name: str  # marketing name
    nvml: tuple[str, ...]  # regular expressions over the NVML name without its "NVIDIA " prefix
    memory_gib: float  # as the card reports it (NVML total); unified parts: the host's MemTotal
    compute_capability: str
    memory_bandwidth_gbps: float
    datacenter: bool
    interconnect: Interconnect
    host_arch: str = "x86_64"
    per_host: int = 8

    def matches(self, nvml_name: str) -> bool:
        bare = re.sub(r"^nvidia\s+", "", nvml_name.strip(), flags=re.IGNORECASE)
        return any(re.fullmatch(pattern, bare, flags=re.IGNORECASE) for pattern in self.nvml)


@cache
def gpu_table() -> dict[str, GpuModel]:
    """Every known GPU by key, in file order."""
    data = yaml.safe_load(TABLE.read_text())
    return {key: _model(key, entry) for key, entry in data.items()}


def _model(key: str, entry: dict[str, object]) -> GpuModel:
    interconnect = entry["interconnect"]
    if interconnect not in _INTERCONNECTS:
        raise ValueError(f"{TABLE}: {key}: interconnect {interconnect!r} is not one of {_INTERCONNECTS}")
    return GpuModel(
        key=key,
        name=str(entry["name"]),
        nvml=tuple(str(p) for p in entry["nvml"]),  # type: ignore[attr-defined]
        memory_gib=float(entry["memory_gib"]),  # type: ignore[arg-type]
        compute_capability=str(entry["compute_capability"]),
        memory_bandwidth_gbps=float(entry["memory_bandwidth_gbps"]),  # type: ignore[arg-type]
        datacenter=bool(entry["datacenter"]),
        interconnect=interconnect,  # type: ignore[arg-type]
        host_arch=str(entry.get("host_arch", "x86_64")),
        per_host=int(entry.get("per_host", 8)),  # type: ignore[call-overload]
    )


def identify(nvml_name: str) -> GpuModel | None:
    """The table's entry for a GPU NVML names so; None for a GPU the table does not know."""
    return next((m for m in gpu_table().values() if m.matches(nvml_name)), None)


def lookup(key_or_name: str) -> GpuModel:
    """A GPU by table key (`h100-sxm`) or by its NVML name (`NVIDIA H100 80GB HBM3`); UserError otherwise."""
    table = gpu_table()
    found = table.get(key_or_name.lower()) or identify(key_or_name)
    if found is None:
        raise UserError(f"unknown GPU {key_or_name!r}; known: {', '.join(table)} (or an NVML name such as "
                        "'NVIDIA H100 80GB HBM3')")
    return found
