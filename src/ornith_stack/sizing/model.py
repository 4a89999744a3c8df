"""What the planner takes and what it returns; each engine's accounting lives in engines/*/accounting.py."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ornith_stack.errors import UserError
from ornith_stack.sizing.engine_memory import EngineMemory, engine_memory
from ornith_stack.sizing.settings import ServeSettings
from ornith_stack.sizing.shapes import ModelShape, dtype_bytes

GIB = 1 << 30

# CUDA-graph and activation reserve for the 35B family: seed 003 reports a working set of ~82 GiB
# with 65.53 GiB of weights and an 8 GiB KV pin (vLLM 0.24, 8,192 batched tokens), which leaves
# 82 - 65.53 - 8 = 8.47 GiB for activations, CUDA graphs and the non-torch allocations. The planner
# scales it with the hidden size (activations are tokens x hidden); `--reserve-gib` overrides it.
RESERVE_GIB_AT_HIDDEN_2048 = 82 - 65.53 - 8
RESERVE_REFERENCE_HIDDEN = 2048

# The largest memory one GPU can report: no NVIDIA part has more than 1 TiB (GB300: 288 GB; a DGX Spark's
# unified memory: 128 GB). Bounding it keeps every product with GIB well inside float and int range.
MAX_GPU_MEMORY_GIB = 1024.0
# A plan is for one deployment: no engine splits a model over more GPUs than a large NVLink domain
# (NVL576) holds, and no drafter proposes more than a few dozen tokens a step (DFlash's block is 16).
MAX_GPUS = 576
MAX_SPECULATIVE_TOKENS = 256
MIN_GPU_MEMORY_GIB = 1 / 1024  # 1 MiB: below it every ratio against the GPU's memory leaves float range


def check_number(name: str, value: float | None, *, low: float, high: float, low_inclusive: bool = False) -> None:
    """Refuse a number that is not finite or lies outside (low, high] ([low, high] with low_inclusive)."""
    if value is None:
        return
    if not math.isfinite(value):
        raise UserError(f"{name} must be a finite number, got {value}")
    below = value < low if low_inclusive else value <= low
    if below or value > high:
        left = "[" if low_inclusive else "("
        raise UserError(f"{name} must be in {left}{low:g}, {high:g}], got {value:g}")


@dataclass(frozen=True)
class PlanRequest:
    engine: str  # "vllm" or "sglang"
    engine_version: str | None
    shape: ModelShape
    settings: ServeSettings
    gpu_memory_gib: float  # per GPU
    gpu_count: int
    draft: ModelShape | None = None
    weights_bytes: int | None = None  # loaded weights of the whole model, e.g. from a checkpoint
    draft_weights_bytes: int | None = None
    reserve_gib: float | None = None
    dtype: str | None = None  # weight dtype; None: settings.dtype (--dtype), else the config's
    profile: str | None = None
    notes: tuple[str, ...] = ()  # said in the plan, e.g. a profile's draft shape that is not shipped
    # NVML's free memory on each GPU at check time (the doctor); None: an idle GPU (the total less the
    # driver's share). The engine finds less: its CUDA context and collective library take their share
    # (engine_memory.py, measured on the H200), and the plan keeps a margin below that.
    free_memory_gib: float | None = None
    # What the engine itself logged free before loading (SGLang's "Load weight begin. avail mem"): used
    # as is, without the estimates above (checks against a recording).
    engine_memory_gib: float | None = None
    compute_capability: str | None = None  # the GPU's, as "9.0"; None: not known (flags are not checked)
    # The GPU shares the host's memory (GB10): gpu_memory_gib is what the host can still give (the table's
    # idle MemAvailable, or the doctor's reading), no driver share is taken off it.
    unified_memory: bool = False
    # The most GPUs one host of this card holds (the GPU table's per_host; the doctor: the GPUs it sees): a
    # suggested fix never needs more. None: not known (a fix may name any tp up to 8).
    gpus_per_host: int | None = None
    # The reserve already holds the engine's CUDA context (its adapter's `reserve_holds_context`).
    reserve_holds_context: bool = False

    def __post_init__(self) -> None:
        s = self.settings
        # Every number is checked before any arithmetic: a huge reserve or GPU times GIB overflows.
        check_number("GPU memory (GiB)", self.gpu_memory_gib, low=MIN_GPU_MEMORY_GIB, high=MAX_GPU_MEMORY_GIB,
                     low_inclusive=True)
        check_number("free GPU memory (GiB)", self.free_memory_gib, low=MIN_GPU_MEMORY_GIB,
                     high=self.gpu_memory_gib, low_inclusive=True)
        check_number("engine free memory (GiB)", self.engine_memory_gib, low=MIN_GPU_MEMORY_GIB,
                     high=self.gpu_memory_gib, low_inclusive=True)
        check_number("--reserve-gib", self.reserve_gib, low=0, high=self.gpu_memory_gib, low_inclusive=True)
        for name, number in (("--mem-fraction-static", s.mem_fraction_static),
                             ("--gpu-memory-utilization", s.gpu_memory_utilization)):
            check_number(name, number, low=0, high=1)
        check_number("mamba_full_memory_ratio", s.mamba_full_memory_ratio, low=0, high=1e6)
        if self.gpu_count < 1:
            raise UserError(f"the plan needs at least one GPU, got {self.gpu_count}")
        if s.max_model_len is not None and s.max_model_len > self.shape.max_position_embeddings:
            raise UserError(
                f"context length {s.max_model_len:,} exceeds the model's max_position_embeddings "
                f"{self.shape.max_position_embeddings:,} ({self.shape.name}): {self.engine} refuses a longer "
                "context than the model was trained for"
            )
        if s.tp < 1:
            raise UserError(f"--tp must be at least 1, got {s.tp}")
        if self.gpu_count < s.tp:
            raise UserError(f"--tp {s.tp} needs {s.tp} GPUs, the plan has {self.gpu_count}")
        for name, value in (
            ("--kv-cache-memory-bytes", s.kv_cache_memory_bytes),
            ("--max-model-len", s.max_model_len),
            ("--max-total-tokens", s.max_total_tokens),
            ("--max-running-requests", s.max_running_requests),
            ("block_size (KV tokens per block or page)", s.block_size),
            ("max_mamba_cache_size", s.max_mamba_cache_size),
        ):
            if value is not None and value <= 0:
                raise UserError(f"{name} must be positive, got {value}")
        if s.num_speculative_tokens < 0:
            raise UserError(f"--num-speculative-tokens must be >= 0, got {s.num_speculative_tokens}")
        if self.weights_bytes is not None and self.weights_bytes <= 0:
            raise UserError(f"weights must be positive, got {self.weights_bytes} bytes")

    @property
    def model_dtype(self) -> str:
        return self.dtype or self.settings.dtype or self.shape.dtype

    @property
    def model_dtype_bytes(self) -> int:
        dtype = self.model_dtype
        return dtype_bytes(self.shape.dtype if dtype == "auto" else dtype, "--dtype")

    @property
    def kv_dtype_bytes(self) -> int:
        kv = self.settings.kv_cache_dtype
        return self.model_dtype_bytes if kv in ("auto", None) else dtype_bytes(kv, "--kv-cache-dtype")

    @property
    def engine_memory(self) -> EngineMemory | None:
        """How the free memory the engine sizes from follows from the total or NVML's free; None when
        the engine's own figure was given."""
        if self.engine_memory_gib is not None:
            return None
        return engine_memory(self.gpu_memory_gib, self.settings.tp, self.free_memory_gib,
                             context=not self.reserve_holds_context, unified=self.unified_memory)

    @property
    def memory_before_load_gib(self) -> float:
        """What the engine finds free on each GPU before it loads: its own figure when given, else the
        total (or NVML's free) less the CUDA context, the collective library and the margin."""
        found = self.engine_memory
        if found is None and self.engine_memory_gib is not None:
            return self.engine_memory_gib
        return max(found.free_gib if found else self.gpu_memory_gib, MIN_GPU_MEMORY_GIB)

    @property
    def max_model_len(self) -> int:
        return self.settings.max_model_len or self.shape.max_position_embeddings

    @property
    def reserve_bytes(self) -> int:
        if self.reserve_gib is not None:
            return int(self.reserve_gib * GIB)
        scale = self.shape.hidden_size / RESERVE_REFERENCE_HIDDEN
        return int(RESERVE_GIB_AT_HIDDEN_2048 * scale * GIB)

    def weights_per_gpu(self) -> int:
        loaded_params = self.shape.text_params + self.shape.vision_params
        total = self.weights_bytes or int(loaded_params * self.weight_bytes_per_param())
        return total // self.settings.tp

    def draft_weights_per_gpu(self) -> int:
        if self.draft_weights_bytes is not None:
            return self.draft_weights_bytes // self.settings.tp
        return self.draft.loaded_weight_bytes() // self.settings.tp if self.draft else 0

    def weight_bytes_per_param(self) -> float:
        """Bytes per weight as loaded: the checkpoint's (FP8: one), or --dtype's when it is given."""
        if (self.dtype or self.settings.dtype) in (None, "auto"):
            return self.shape.weight_bytes_per_param
        return float(self.model_dtype_bytes)

    def with_settings(self, **changes: Any) -> PlanRequest:
        return replace(self, settings=replace(self.settings, **changes))


@dataclass(frozen=True)
class Caps:
    """Engine flags sized to one card for a computed profile: a value sets the flag, None removes it.
    `running` is 0 when the card has no room for one request (`why` says why)."""

    flags: dict[str, int | float | None]
    running: int
    kv_tokens: int
    why: str
    reasons: dict[str, str] = field(default_factory=dict)  # why a flag has its value, where not just "sized"


@dataclass(frozen=True)
class Problem:
    component: str  # what overflows: "KV cache", "weights", "mamba state cache", ...
    message: str
    fix: str

    def line(self) -> str:
        return f"{self.component}: {self.message}; fix: {self.fix}"


@dataclass
class Plan:
    """Per-GPU figures and the engine's own accounting. `to_json` keys are stable."""

    engine: str
    engine_version: str | None
    profile: str | None
    model: str
    draft: str | None
    tp: int
    gpu_memory_gib: float
    max_model_len: int
    weights_bytes: int
    draft_weights_bytes: int
    reserve_bytes: int
    kv_bytes_per_token: int
    state_bytes_per_sequence: int
    kv_pool_bytes: int
    block_size: int
    page_size_bytes: int
    num_blocks: int
    blocks_per_request: int
    max_concurrency: float
    kv_cache_tokens: int
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    engine_details: dict[str, Any] = field(default_factory=dict)
    suggestion: str | None = None
    # What the plan could not know (e.g. a draft shape guessed, not read): no problem found, but no "fits".
    unknowns: list[str] = field(default_factory=list)
    # What the engine starts with but clamps (and logs a warning for): a small shortfall against a cap, e.g.
    # SGLang's "max_total_tokens=... is larger than the profiled value ...". Not a problem: the engine serves.
    warnings: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """"does not fit" (a problem), "unknown" (none found, but a figure is a guess) or "fits"."""
        if self.problems:
            return "does not fit"
        return "unknown" if self.unknowns else "fits"

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        # true only when it fits, false when it does not, null when the verdict is unknown (a figure guessed).
        data["fits"] = None if self.verdict == "unknown" else self.fits
        data["verdict"] = self.verdict
        data["max_concurrency"] = round(self.max_concurrency, 2)
        data["problems"] = [asdict(p) | {"line": p.line()} for p in self.problems]
        return data


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
