"""`plan`'s options as one record, and the plan request they describe (a profile, or the general form).

The command only parses and prints; every choice about what an option means lives here: which
profile value it replaces, what a draft config implies for the speculative method, and which
numbers are impossible before any accounting runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from ornith_stack.engines import ADAPTERS
from ornith_stack.errors import UserError, shown
from ornith_stack.planner.profile_request import request_for_profile
from ornith_stack.profiles import load_profile
from ornith_stack.sizing.model import (
    MAX_GPU_MEMORY_GIB,
    MAX_GPUS,
    MAX_SPECULATIVE_TOKENS,
    MIN_GPU_MEMORY_GIB,
    PlanRequest,
    check_number,
)
from ornith_stack.sizing.settings import ServeSettings
from ornith_stack.sizing.shapes import load_shape


@dataclass(frozen=True)
class PlanOptions:
    """Everything `ornith-stack plan` accepts; None means "the profile's value, else the engine's"."""

    profile: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    model_config: str | None = None
    draft_config: str | None = None
    gpu_memory_gib: float | None = None
    gpu_count: int | None = None
    reserve_gib: float | None = None
    # Engine flags, named like ServeSettings fields.
    tp: int | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    enable_prefix_caching: bool | None = None
    num_speculative_tokens: int | None = None
    speculative_method: str | None = None
    mem_fraction_static: float | None = None
    max_total_tokens: int | None = None
    max_running_requests: int | None = None

    def __post_init__(self) -> None:
        for name in ("gpu_memory_gib", "reserve_gib", "gpu_memory_utilization", "mem_fraction_static"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise UserError(f"--{name.replace('_', '-')} must be a finite number, got {value}")
        if self.gpu_memory_gib is not None and self.gpu_memory_gib <= 0:
            raise UserError(f"--gpu-memory-gib must be positive, got {self.gpu_memory_gib:g}")
        check_number("--gpu-memory-gib", self.gpu_memory_gib, low=MIN_GPU_MEMORY_GIB, high=MAX_GPU_MEMORY_GIB,
                     low_inclusive=True)
        check_number("--reserve-gib", self.reserve_gib, low=0, high=MAX_GPU_MEMORY_GIB, low_inclusive=True)
        if self.gpu_count is not None and self.gpu_count < 1:
            raise UserError(f"--gpu-count must be at least 1, got {self.gpu_count}")
        # Past these the figures overflowed into negative plans (2^63 draft tokens, tp 10^30).
        for name, value, high in (("--gpu-count", self.gpu_count, MAX_GPUS), ("--tp", self.tp, MAX_GPUS),
                                  ("--num-speculative-tokens", self.num_speculative_tokens, MAX_SPECULATIVE_TOKENS)):
            if value is not None and value > high:  # too low: each has its own message further on
                raise UserError(f"{name} must be at most {high}, got {shown(value)}")

    def setting_overrides(self) -> dict[str, Any]:
        """The engine flags given, as ServeSettings fields (DFlash's block follows the draft tokens)."""
        names = {f.name for f in fields(ServeSettings)}
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name in names}
        values = {k: v for k, v in values.items() if v is not None}
        if self.num_speculative_tokens is not None:
            values["draft_block_size"] = self.num_speculative_tokens + 1
        return values


def build_request(options: PlanOptions) -> PlanRequest:
    """The plan request `options` describe: a profile with its values replaced, or the general form."""
    if options.profile is not None:
        if options.engine is not None:
            raise UserError("--engine comes from the profile; drop it or drop the profile name")
        req = request_for_profile(
            load_profile(options.profile),
            gpu_memory_gib=options.gpu_memory_gib,
            gpu_count=options.gpu_count,
            model_config=options.model_config,
            draft_config=options.draft_config,
            setting_overrides=options.setting_overrides(),
            reserve_gib=options.reserve_gib,
        )
        return replace(req, engine_version=options.engine_version) if options.engine_version else req
    return _general_request(options)


def _general_request(options: PlanOptions) -> PlanRequest:
    if options.engine is None or options.model_config is None:
        raise UserError("give a PROFILE, or --engine vllm|sglang and --model-config PATH_OR_NAME")
    if options.gpu_memory_gib is None:
        raise UserError("--gpu-memory-gib is required without a profile")
    draft = load_shape(options.draft_config) if options.draft_config else None
    values = options.setting_overrides()
    if draft is not None:
        values.setdefault("speculative_method", "dflash")
        if "num_speculative_tokens" not in values and draft.block_size:
            values["num_speculative_tokens"] = draft.block_size - 1
            values["draft_block_size"] = draft.block_size
    elif values.get("num_speculative_tokens"):
        values.setdefault("speculative_method", "ngram")
    settings = ServeSettings(**values)
    engine = ADAPTERS.get(options.engine)  # an unknown engine is refused by plan_request, naming the known ones
    return PlanRequest(
        engine=options.engine,
        engine_version=options.engine_version,
        shape=load_shape(options.model_config),
        draft=draft,
        settings=settings,
        gpu_memory_gib=options.gpu_memory_gib,
        gpu_count=options.gpu_count or settings.tp,
        reserve_gib=options.reserve_gib,
        reserve_holds_context=engine.reserve_holds_context if engine else False,
    )
