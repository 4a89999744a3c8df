"""The memory an engine finds free on each GPU when it sizes its pools, from the card's total.

SGLang sizes its static pool from the memory free after its CUDA context and its collective library
(NCCL) have started (`pre_model_load_memory`); vLLM must find its pin, weights and graphs there too. The
table's figure is NVML's total, which neither engine can have. What lies between, measured on one H200
(driver 580.159.04, 143,771 MiB = 140.40 GiB; FACTS.md section 13 and the SGLang recordings under
tests/fixtures/engines/sglang-0.5.17/):

| step | GiB free | taken | how |
|---|---|---|---|
| NVML total | 140.40 | | measured |
| NVML free, no process | 139.80 | 0.60 driver | measured |
| after the CUDA context | 139.19 | 0.61 | measured |
| SGLang tp 1, before loading weights | 139.09 | 0.10 torch.distributed | measured (SGLang's log, three runs) |
| SGLang tp 2, before loading weights | 138.18 | 1.01 NCCL + custom allreduce | measured (SGLang's log, rank 0) |
| a bare NCCL init at tp 1 | 138.63 | 0.56 | measured (FACTS 13), below what SGLang itself logs |

tp 4 and tp 8 are estimates (NCCL's buffers grow with its channels and peers): 1.5 and 2.0 GiB. The
driver and context shares are taken as the same on every card (estimated elsewhere than the H200).

The slack belongs to the caps (issue 41). A computed profile's caps are sized on what an idle card
leaves the engine less SLACK_GIB (0.5 GiB: the bare NCCL figure, 0.46 GiB below SGLang's own at tp 1, a
few hundred MiB held by a display server or a monitoring agent, run-to-run noise). The doctor plans on
what NVML shows at check time and does not take the slack off again: an idle card, or one where other
processes hold less than the slack, plans at least the caps; a card short of them by a little is a
warning naming what the engine clamps to (the accounting's `clamp` lines), only a large shortfall fails.

Idle memory NVML shows on real cards (no process), as the project has recorded it (IDLE_RECORDINGS).

Unified memory (GB10): the GPU has no memory of its own and the figure is what the host can still give,
MemAvailable (+ SwapFree) as the doctor reads it (doctor/gpu.py), the table's figure being that reading on
an idle DGX Spark. MemAvailable already leaves out what the host and its driver hold, so no driver share is
taken off it; the engine's CUDA context and collective library come out of it as on any card. SGLang sizes
from the same quantity there: utils/common.py `get_available_gpu_memory` (0.5.17 and 0.5.21) reads
`psutil.virtual_memory().available` when `torch.cuda.get_device_properties(gpu).is_integrated` ("On these
devices, which use sysmem as device mem, torch.cuda.mem_get_info() only reports "free" memory ... So we use
the system available memory metric instead").
"""

from __future__ import annotations

from dataclasses import dataclass

DRIVER_RESERVED_GIB = 0.60  # measured, H200: NVML total 140.40 - free 139.80 with no process
CUDA_CONTEXT_GIB = 0.61  # measured, H200: 139.80 -> 139.19 once a process holds a CUDA context
# Collective library at each tensor-parallel size: (GiB, measured?).
COLLECTIVE_GIB: dict[int, tuple[float, bool]] = {1: (0.10, True), 2: (1.01, True), 4: (1.5, False),
                                                 8: (2.0, False)}
# Kept below the idle card's figure by every computed profile's caps; the doctor does not subtract it.
SLACK_GIB = 0.5
# What SGLang 0.5.17's start holds when it sizes its pools beyond what the planner counts (the weights and
# `load_extras` in engines/sglang/accounting.py: RoPE caches, deepstack mergers, DFlash's fused KV weights):
# the caching allocator's partly filled segments (a checkpoint's 1-10 MiB tensors share 20 MiB segments: the
# vision tower's 27 blocks leave ~40 MiB, by a replay of PyTorch's allocator) and CUDA's own. Measured: the
# 35B at real shapes on the H200 (tests/fixtures/engines/sglang-0.5.17/realsize-h200, cold start: 292,330 KV
# tokens from 139.07 GiB before loading) took 66.856 GiB before SGLang profiled, 0.056 +- 0.004 more than
# counted; the tiny model's recordings (tp1, uncapped-tp1, tp2 beside it) 0.03, 0.03 and 0.00. Taken as 0.05.
SGLANG_LOAD_UNTRACKED_GIB = 0.05


@dataclass(frozen=True)
class IdleRecording:
    """What NVML showed on one real card with no process, and where it was recorded."""

    gpu: str  # NVML name
    driver: str
    total_mib: int
    free_gib: float
    smi_used_mib: int  # nvidia-smi's "Memory-Usage" (the driver's reservation is not counted there)
    source: str

    @property
    def reserved_gib(self) -> float:
        return round(self.total_mib / 1024 - self.free_gib, 2)


IDLE_RECORDINGS = (
    IdleRecording("NVIDIA H200", "580.159.04", 143_771, 139.80, 0,
                  "FACTS.md section 13; tests/fixtures/engines/sglang-0.5.17/machine-h200x1.txt and machine.txt "
                  "(nvidia-smi: 0MiB / 143771MiB on each of one and two H200s)"),
)


def idle_recording(gpu: str, driver: str | None = None) -> IdleRecording | None:
    """The recorded idle figures of this card (same driver first, else any driver), None when none."""
    found = [r for r in IDLE_RECORDINGS if r.gpu.lower() == gpu.lower()]
    return next((r for r in found if r.driver == driver), found[0] if found else None)


def idle_used_gib(gpu: str, driver: str | None = None) -> tuple[float, bool]:
    """(GiB NVML shows used on an idle card, whether recorded on that card): the recording, else the
    H200's driver share."""
    found = idle_recording(gpu, driver)
    return (found.reserved_gib, True) if found else (DRIVER_RESERVED_GIB, False)


@dataclass(frozen=True)
class EngineMemory:
    """Free memory per GPU an engine sizes from, and how it was reached from what is known."""

    start_gib: float  # the total (no observation) or NVML's free memory (the doctor's)
    observed_free: bool
    tp: int
    driver_gib: float
    context_gib: float
    collective_gib: float
    collective_measured: bool
    margin_gib: float  # the caps' slack (SLACK_GIB) when sized on the total; 0 on what NVML shows
    unified: bool = False  # the GPU shares the host's memory: start_gib is what the host can still give

    @property
    def free_gib(self) -> float:
        left = self.start_gib - self.driver_gib - self.context_gib - self.collective_gib - self.margin_gib
        return max(round(left, 4), 0.0)

    def note(self) -> str:
        if self.unified:
            start = (f"the host's available {self.start_gib:g} GiB (unified memory: MemAvailable + SwapFree)"
                     + ("" if self.observed_free else " on an idle host"))
        elif self.observed_free:
            start = f"NVML's free {self.start_gib:g} GiB"
        else:
            start = f"total {self.start_gib:g} GiB - driver {self.driver_gib:g} (measured on the H200)"
        collective = "measured on the H200" if self.collective_measured else "estimated"
        context = (f" - CUDA context {self.context_gib:g} (measured on the H200)" if self.context_gib
                   else " (CUDA context inside the reserve)")
        slack = (f" - slack {self.margin_gib:g} (kept by the caps, not taken again by the doctor)" if self.margin_gib
                 else " (no slack taken off: planned on what was observed)")
        return (f"pools sized from {self.free_gib:.2f} GiB per GPU: {start}{context} - collective start at tp "
                f"{self.tp} {self.collective_gib:g} ({collective}){slack}")


def collective_gib(tp: int) -> tuple[float, bool]:
    """(GiB the collective library takes at `tp`, whether it was measured); sizes between the listed
    ones take the next listed one."""
    for size in sorted(COLLECTIVE_GIB):
        if tp <= size:
            return COLLECTIVE_GIB[size]
    return COLLECTIVE_GIB[max(COLLECTIVE_GIB)]


def engine_memory(total_gib: float, tp: int, nvml_free_gib: float | None = None, context: bool = True,
                  unified: bool = False) -> EngineMemory:
    """What an engine at `tp` finds free: from NVML's free memory when observed (no slack taken off), else
    from the total less the driver's share and the caps' slack.
    `context` False: the caller's reserve already holds the CUDA context (vLLM's, from seed 003).
    `unified`: the figures are what the host can still give (no driver share: MemAvailable leaves it out)."""
    collective, measured = collective_gib(tp)
    observed = nvml_free_gib is not None
    return EngineMemory(start_gib=nvml_free_gib if nvml_free_gib is not None else total_gib,
                        observed_free=observed, tp=tp,
                        driver_gib=0.0 if observed or unified else DRIVER_RESERVED_GIB,
                        context_gib=CUDA_CONTEXT_GIB if context else 0.0, collective_gib=collective, collective_measured=measured,
                        margin_gib=0.0 if observed else SLACK_GIB, unified=unified)
