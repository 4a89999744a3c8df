"""GPU probe: what NVML (`nvidia-ml-py`, started through ornith_stack.nvml) says about each GPU, asked one
query at a time.

Only a failure to start NVML, or zero devices, means "no GPU". Any other query may fail on its
own (NVML raises a subclass of `pynvml.NVMLError` per return code) and is recorded with the GPU:
- memory: total and free (what an engine starting now would find: SGLang sizes its pools from the
  free memory before it loads). Unified-memory parts (DGX Spark's GB10) answer NOT_SUPPORTED because
  the GPU has no memory of its own; the GPU then gets what the host can still give, MemAvailable +
  SwapFree of /proc/meminfo (NVIDIA's guidance for DGX Spark, as llama.cpp reads it), not MemTotal;
- NVLink remote device types tell whether the GPU's links end at NVSwitches (HGX boards);
- the GPU fabric state (Hopper and later) tells whether nvidia-fabricmanager has registered the
  GPU with the NVSwitch fabric: without it CUDA fails with error 802 although NVML answers;
- the brand (nvmlDeviceGetBrand) decides whether CUDA forward compatibility may run an image whose
  CUDA is newer than the driver: datacenter brands only (ornith_stack.cuda_requirement).
"""

from __future__ import annotations

import ctypes
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ornith_stack.nvml import NoGpu, nvml_module, text, why_failed
from ornith_stack.planner import GIB

MEMINFO = Path("/proc/meminfo")
NVML_MEMORY = "NVML"
HOST_MEMORY = "host MemAvailable + SwapFree (unified memory: NVML reports no GPU memory of its own)"
# cuInit's answer on NVSwitch systems whose fabric manager is not running.
CUDA_ERROR_SYSTEM_NOT_READY = 802


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_gib: float | None  # None: NVML could not say and the host memory does not apply
    compute_capability: str
    driver_version: str
    memory_source: str = NVML_MEMORY
    free_gib: float | None = None  # NVML's free memory at check time; None: not known
    nvswitch: bool = False  # an NVLink of this GPU ends at an NVSwitch
    fabric_state: str | None = None  # "not started", "in progress", "completed", ...; None: no fabric
    unanswered: tuple[str, ...] = ()  # NVML queries that failed, with NVML's reason
    brand: str | None = None  # NVML's brand as NVIDIA_REQUIRE_CUDA names it ("nvidia", "geforce", ...)

    @property
    def driver_branch(self) -> str:
        return self.driver_version.split(".")[0]


def probe_gpus() -> list[GpuInfo]:
    """Every GPU NVML sees; NoGpu (never a traceback) when there is no NVML, driver or device."""
    nvml = nvml_module()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NoGpu(why_failed(nvml, exc)) from None
    try:
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise NoGpu(f"NVML started but cannot count GPUs ({exc})") from None
        if count == 0:
            raise NoGpu("NVML reports 0 GPUs")
        try:
            driver = text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError as exc:
            driver = f"unknown ({exc})"
        return [_probe_one(nvml, i, driver) for i in range(count)]
    finally:
        with suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _probe_one(nvml: Any, index: int, driver: str) -> GpuInfo:
    unanswered: list[str] = []

    def ask(what: str, query: Any, *args: Any) -> Any:
        try:
            return query(*args)
        except nvml.NVMLError as exc:
            unanswered.append(f"{what}: {exc}")
            return None

    handle = ask("device handle", nvml.nvmlDeviceGetHandleByIndex, index)
    if handle is None:
        return GpuInfo(index, "unknown", None, "unknown", driver, unanswered=tuple(unanswered))
    name = ask("name", nvml.nvmlDeviceGetName, handle)
    capability = ask("compute capability", nvml.nvmlDeviceGetCudaComputeCapability, handle)
    memory, free, source = _memory(nvml, handle, unanswered)
    brand = ask("brand", nvml.nvmlDeviceGetBrand, handle)
    return GpuInfo(
        index=index,
        name=text(name) if name is not None else "unknown",
        memory_gib=memory,
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else "unknown",
        driver_version=driver,
        memory_source=source,
        free_gib=free,
        nvswitch=_links_to_nvswitch(nvml, handle),
        fabric_state=_fabric_state(nvml, handle),
        unanswered=tuple(unanswered),
        brand=None if brand is None else brand_name(nvml, brand),
    )


def brand_name(nvml: Any, brand: int) -> str:
    """NVML's nvmlBrandType_t as NVIDIA_REQUIRE_CUDA's `brand=` clauses and `nvidia-smi -q` ("Product Brand",
    lower case without spaces) name it; an unnamed value reads "unknown"."""
    names = {
        nvml.NVML_BRAND_UNKNOWN: "unknown",
        nvml.NVML_BRAND_QUADRO: "quadro",
        nvml.NVML_BRAND_TESLA: "tesla",
        nvml.NVML_BRAND_NVS: "nvs",
        nvml.NVML_BRAND_GRID: "grid",
        nvml.NVML_BRAND_GEFORCE: "geforce",
        nvml.NVML_BRAND_TITAN: "titan",
        nvml.NVML_BRAND_NVIDIA_VAPPS: "vapps",
        nvml.NVML_BRAND_NVIDIA_VPC: "vpc",
        nvml.NVML_BRAND_NVIDIA_VCS: "vcs",
        nvml.NVML_BRAND_NVIDIA_VWS: "vws",
        nvml.NVML_BRAND_NVIDIA_CLOUD_GAMING: "cloudgaming",
        nvml.NVML_BRAND_QUADRO_RTX: "quadrortx",
        nvml.NVML_BRAND_NVIDIA_RTX: "nvidiartx",
        nvml.NVML_BRAND_NVIDIA: "nvidia",
        nvml.NVML_BRAND_GEFORCE_RTX: "geforcertx",
        nvml.NVML_BRAND_TITAN_RTX: "titanrtx",
    }
    return names.get(brand, "unknown")


def _memory(nvml: Any, handle: Any, unanswered: list[str]) -> tuple[float | None, float | None, str]:
    """(total GiB, free GiB, where the figures come from)."""
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
    except nvml.NVMLError_NotSupported:
        return host_memory_gib(), None, HOST_MEMORY
    except nvml.NVMLError as exc:
        unanswered.append(f"memory: {exc}")
        return None, None, NVML_MEMORY
    return round(info.total / GIB, 2), round(info.free / GIB, 2), NVML_MEMORY


def host_memory_gib(meminfo: Path | None = None) -> float | None:
    """MemAvailable + SwapFree of /proc/meminfo in GiB: what a unified-memory GPU can still allocate;
    None when MemAvailable cannot be read."""
    fields: dict[str, int] = {}
    try:
        for line in (meminfo or MEMINFO).read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("MemAvailable", "SwapFree"):
                fields[key] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if "MemAvailable" not in fields:
        return None
    return round((fields["MemAvailable"] + fields.get("SwapFree", 0)) * 1024 / GIB, 2)


def _links_to_nvswitch(nvml: Any, handle: Any) -> bool:
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link) == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                return True
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            return False  # no NVLink on this GPU, or a driver without the query
        except nvml.NVMLError:
            continue  # a link index the GPU does not have, or a link that is down
    return False


def _fabric_state(nvml: Any, handle: Any) -> str | None:
    info = nvml.c_nvmlGpuFabricInfo_t()
    try:
        nvml.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    except nvml.NVMLError:
        return None  # not supported: no NVSwitch fabric for this GPU (or a GPU before Hopper)
    states = {
        nvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "not started",
        nvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in progress",
        nvml.NVML_GPU_FABRIC_STATE_COMPLETED: "completed",
    }
    state = states.get(info.state)
    if state is None:
        return None
    if state == "completed" and info.status != nvml.NVML_SUCCESS:
        return f"completed with error ({nvml.NVMLError(info.status)})"
    return state


def cuda_init_error() -> int | None:
    """cuInit's error code on this host (0 when CUDA starts); None when libcuda cannot be loaded."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    return int(libcuda.cuInit(0))
