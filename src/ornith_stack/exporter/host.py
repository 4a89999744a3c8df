"""The host's own collectors beside the engines' figures: the GPUs through NVML, the model cache's disk.

Each is one concern and makes fresh families per scrape (ExporterCollector runs them after the engine
collectors and times each). They read the machine the exporter runs on: in compose and on an Ansible host
the engines' host (the exporter's container gets the GPUs with the NVIDIA runtime's utility capability and
the model cache read-only), in Kubernetes the engine pod (the sidecar).

NVML is started once (ornith_stack.nvml, as the doctor starts it) and kept; a failure shuts it down so the
next scrape starts it again. A GPU listed once is reported until the exporter restarts: one that stops
answering, or that NVML no longer lists, reads `ornith_gpu_up` 0 instead of vanishing.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import Metric as Family

from ornith_stack.deployment import GPU_METRICS_OFF, GPU_METRICS_REQUIRED
from ornith_stack.exporter import catalogue as C
from ornith_stack.exporter.collectors import family as _family
from ornith_stack.nvml import NoGpu, absent, nvml_module, text, why_failed

log = logging.getLogger(__name__)
Families = Iterator[Family]

@dataclass(frozen=True)
class Gpu:
    """One GPU as the last scrape found it; figures are None where NVML does not report them."""

    index: int
    uuid: str
    name: str
    up: bool
    memory_used: float | None = None
    memory_total: float | None = None
    utilization: float | None = None


@dataclass(frozen=True)
class GpuReading:
    state: str  # one of C.GPU_STATES
    reason: str  # why, where the state is not ok
    gpus: tuple[Gpu, ...] = ()


class GpuCollector:
    """Memory and utilization of every GPU NVML lists, whether NVML answered, and its state."""

    def __init__(self, profile: str, mode: str, nvml: Any = None) -> None:
        self.profile, self.required = profile, mode == GPU_METRICS_REQUIRED
        self._nvml = nvml  # a module shaped like pynvml (tests); None: ornith_stack.nvml's
        self._started = False
        self._seen: dict[str, tuple[int, str]] = {}  # uuid -> (index, name) of every GPU listed since start
        self._lock = threading.Lock()  # answers render in several threads; NVML is asked by one at a time
        self._logged = ("ok", "")

    def read(self) -> GpuReading:
        with self._lock:
            reading = self._read()
        if (reading.state, reading.reason) != self._logged:
            self._logged = (reading.state, reading.reason)
            if reading.state == "ok":
                log.warning("GPU metrics: NVML answers again (%d GPUs)", len(reading.gpus))
            else:
                log.warning("GPU metrics: %s (%s)", reading.state, reading.reason)
        return reading

    def collect(self) -> Families:
        reading = self.read()
        state, up = _family(C.GPU_NVML_STATE), _family(C.GPU_UP)
        used, total, busy = _family(C.GPU_MEMORY_USED), _family(C.GPU_MEMORY_TOTAL), _family(C.GPU_UTILIZATION)
        for name in C.GPU_STATES:
            state.add_metric([self.profile, name], 1.0 if name == reading.state else 0.0)
        for gpu in reading.gpus:
            labels = [self.profile, str(gpu.index), gpu.uuid, gpu.name]
            up.add_metric(labels, 1.0 if gpu.up else 0.0)
            for fam, value in ((used, gpu.memory_used), (total, gpu.memory_total), (busy, gpu.utilization)):
                if value is not None:
                    fam.add_metric(labels, value)
        yield from (state, up, used, total, busy)

    def _module(self) -> Any:
        return self._nvml if self._nvml is not None else nvml_module()

    def _read(self) -> GpuReading:
        try:
            nvml = self._module()
        except NoGpu as exc:
            return self._without(str(exc), no_driver=True)
        if not self._started:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                return self._without(why_failed(nvml, exc), no_driver=absent(nvml, exc))
            self._started = True
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            self._stop(nvml)
            return self._without(f"NVML started but cannot count GPUs ({exc})", no_driver=False)
        if count == 0 and not self._seen:
            self._stop(nvml)
            return self._without("NVML lists no GPU", no_driver=True)
        gpus = [self._one(nvml, index) for index in range(min(count, C.MAX_GPUS))]
        answered = {gpu.uuid for gpu in gpus}
        gpus += [Gpu(index, uuid, name, up=False) for uuid, (index, name) in self._seen.items() if uuid not in answered]
        return GpuReading("ok", "", tuple(sorted(gpus, key=lambda g: (g.index, g.uuid))))

    def _without(self, reason: str, no_driver: bool) -> GpuReading:
        """No answer from NVML at all: "no GPU" where the host has none (and never had one while this exporter
        ran, nor must have one), else an error; every GPU seen before is reported lost."""
        lost = tuple(Gpu(index, uuid, name, up=False) for uuid, (index, name) in sorted(self._seen.items()))
        quiet = no_driver and not self.required and not self._seen
        return GpuReading("no_gpu" if quiet else "error", reason, lost)

    def _stop(self, nvml: Any) -> None:
        with suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
        self._started = False

    def _one(self, nvml: Any, index: int) -> Gpu:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid, name = text(nvml.nvmlDeviceGetUUID(handle)), text(nvml.nvmlDeviceGetName(handle))
        except nvml.NVMLError:
            # A GPU that cannot say who it is: the one last seen at its index, if any.
            uuid, (_, name) = next(((u, v) for u, v in self._seen.items() if v[0] == index), ("", (index, "unknown")))
            return Gpu(index, uuid, name, up=False)
        self._seen[uuid] = (index, name)
        up, used, total, busy = True, None, None, None
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            used, total = float(memory.used), float(memory.total)
        except nvml.NVMLError_NotSupported:
            pass  # unified memory (DGX Spark): no memory of its own
        except nvml.NVMLError:
            up = False
        try:
            busy = min(max(float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0, 0.0), 1.0)
        except nvml.NVMLError_NotSupported:
            pass
        except nvml.NVMLError:
            up = False
        return Gpu(index, uuid, name, up, used, total, busy)


@dataclass(frozen=True)
class CacheDisk:
    path: str
    readable: bool
    size: float | None = None
    free: float | None = None


class ModelCacheCollector:
    """Size and free bytes of the file system under each model cache path, and whether it could be read."""

    def __init__(self, profile: str, paths: Sequence[str],
                 statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> None:
        self.profile, self.paths, self._statvfs = profile, tuple(paths), statvfs

    def read(self) -> list[CacheDisk]:
        disks = []
        for path in self.paths:
            try:
                st = self._statvfs(path)
            except OSError as exc:
                log.debug("model cache %s: %s", path, exc)
                disks.append(CacheDisk(path, False))
                continue
            disks.append(CacheDisk(path, True, float(st.f_blocks * st.f_frsize), float(st.f_bavail * st.f_frsize)))
        return disks

    def collect(self) -> Families:
        size, free = _family(C.MODEL_CACHE_SIZE), _family(C.MODEL_CACHE_FREE)
        readable = _family(C.MODEL_CACHE_READABLE)
        for disk in self.read():
            labels = [self.profile, disk.path]
            readable.add_metric(labels, 1.0 if disk.readable else 0.0)
            if disk.readable:
                size.add_metric(labels, disk.size)
                free.add_metric(labels, disk.free)
        yield from (size, free, readable)


def host_collectors(profile: str, gpu_metrics: str, model_cache: Sequence[str],
                    nvml: Any = None) -> list[tuple[str, GpuCollector | ModelCacheCollector]]:
    """The host collectors an exporter runs, by name (C.HOST_COLLECTORS): none for `--gpu-metrics off` and no
    `--model-cache`."""
    found: list[tuple[str, GpuCollector | ModelCacheCollector]] = []
    if gpu_metrics != GPU_METRICS_OFF:
        found.append(("gpu", GpuCollector(profile, gpu_metrics, nvml)))
    if model_cache:
        found.append(("model_cache", ModelCacheCollector(profile, model_cache)))
    return found
