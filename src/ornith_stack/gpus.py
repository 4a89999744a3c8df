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

from ornith_stack.errors import UserError, shown

TABLE = Path(str(resources.files(__package__))) / "gpus.yaml"
# A profile's hardware.gpu.models entry for a card the table lacks: `nvml:` and the name NVML reports.
NVML_PREFIX = "nvml:"
# Bandwidth assumed for a described card when none is given (GB/s): only the roofline reads it.
DEFAULT_BANDWIDTH_GBPS = 1000.0
MAX_BANDWIDTH_GBPS = 100_000  # per GPU; HBM4 cards are near 20,000
# A compute capability as NVML and the profiles write it: ASCII digits (\d takes any script's), MAJOR.MINOR.
COMPUTE_CAPABILITY = r"[0-9]{1,2}\.[0-9]{1,2}"
Interconnect = Literal["nvswitch", "nvlink", "pcie"]
_INTERCONNECTS = ("nvswitch", "nvlink", "pcie")


@dataclass(frozen=True)
class GpuModel:
    key: str
    name: str  # marketing name
    nvml: tuple[str, ...]  # regular expressions over the NVML name without its "NVIDIA " prefix
    memory_gib: float  # as the card reports it (NVML total); unified parts: the idle host's MemAvailable
    compute_capability: str
    memory_bandwidth_gbps: float
    interconnect: Interconnect
    host_arch: str = "x86_64"
    per_host: int = 8
    unified_memory: bool = False

    @property
    def geforce(self) -> bool:
        """A GeForce board: no PCIe peer-to-peer between cards (NCCL's P2P path hangs on 4090s)."""
        return "geforce" in self.name.lower()

    @property
    def sm(self) -> tuple[int, int]:
        """The compute capability as (major, minor)."""
        major, _, minor = self.compute_capability.partition(".")
        return int(major), int(minor or 0)

    @property
    def profile_models(self) -> list[str]:
        """What a profile's hardware.gpu.models names this GPU by: its table key, or `nvml:NAME` for a
        card described on the command line (the doctor then matches NVML's name exactly)."""
        return [self.key] if self.key in gpu_table() else [f"{NVML_PREFIX}{self.nvml[0]}"]

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
        interconnect=interconnect,  # type: ignore[arg-type]
        host_arch=str(entry.get("host_arch", "x86_64")),
        per_host=int(entry.get("per_host", 8)),  # type: ignore[call-overload]
        unified_memory=bool(entry.get("unified_memory", False)),
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


def describe(name: str, memory_gib: float, compute_capability: str, bandwidth_gbps: float | None = None,
             count: int = 8) -> GpuModel:
    """A card the table lacks, as the operator describes it (`profiles new --memory-gib ...
    --compute-capability ...`): PCIe, x86_64, up to `count` per host, matched by its exact NVML name."""
    if not re.fullmatch(COMPUTE_CAPABILITY, compute_capability):
        raise UserError(f"--compute-capability must be MAJOR.MINOR such as 8.9, got {shown(compute_capability)}")
    if not 1 <= memory_gib <= 1024:
        raise UserError(f"--memory-gib must be from 1 to 1024 (GiB per GPU, as NVML reports it), got {memory_gib:g}")
    if bandwidth_gbps is not None and not 1 <= bandwidth_gbps <= MAX_BANDWIDTH_GBPS:
        # 0 once meant "not given" and became the default: a card described as 0 GB/s is a mistake.
        raise UserError(f"--bandwidth-gbps must be from 1 to {MAX_BANDWIDTH_GBPS:,} GB/s per GPU, got {bandwidth_gbps:g}")
    bare = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.IGNORECASE)
    key = re.sub(r"[^a-z0-9]+", "-", bare.lower()).strip("-") or "gpu"
    return GpuModel(key=key, name=name.strip(), nvml=(re.escape(bare),), memory_gib=memory_gib,
                    compute_capability=compute_capability,
                    memory_bandwidth_gbps=bandwidth_gbps or DEFAULT_BANDWIDTH_GBPS, interconnect="pcie",
                    per_host=max(count, 1))


def known_model(entry: str) -> bool:
    """A valid hardware.gpu.models entry: a table key, or `nvml:NAME` for a described card."""
    return entry in gpu_table() or (entry.startswith(NVML_PREFIX) and len(entry) > len(NVML_PREFIX))


def entry_matches(entry: str, nvml_name: str) -> bool:
    """Whether a hardware.gpu.models entry names the GPU NVML calls `nvml_name`."""
    if entry.startswith(NVML_PREFIX):
        bare = re.sub(r"^nvidia\s+", "", nvml_name.strip(), flags=re.IGNORECASE)
        return re.fullmatch(entry[len(NVML_PREFIX):], bare, flags=re.IGNORECASE) is not None
    found = identify(nvml_name)
    return found is not None and found.key == entry
