"""The plan request a profile describes: its flags through the engine adapter, its shape from configs/."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError
from ornith_stack.gpus import gpu_table
from ornith_stack.profiles.model import Profile
from ornith_stack.sizing.model import PlanRequest
from ornith_stack.sizing.shapes import ModelShape, load_shape, shipped_shapes


def request_for_profile(
    profile: Profile,
    *,
    gpu_memory_gib: float | None = None,
    gpu_count: int | None = None,
    model_config: str | None = None,
    draft_config: str | None = None,
    setting_overrides: dict[str, Any] | None = None,
    **extra: Any,
) -> PlanRequest:
    """The plan request a profile describes; overrides replace the profile's GPU memory, shapes or flags."""
    gpu = profile.hardware.gpu
    if gpu is None and gpu_memory_gib is None:
        raise UserError(
            f"profile {profile.name!r} runs without a GPU: there is nothing to plan "
            "(use the general form: plan --engine ... --model-config ... --gpu-memory-gib ...)"
        )
    shape_name = model_config or profile.model.shape
    if shape_name is None:
        raise UserError(
            f"profile {profile.name!r} has no model.shape; pass --model-config PATH_OR_NAME "
            f"(shipped: {', '.join(shipped_shapes())})"
        )
    adapter = adapter_for(profile)
    settings = adapter.settings(profile)
    overrides = {k: v for k, v in (setting_overrides or {}).items() if v is not None}
    settings = replace(settings, **overrides)
    if gpu_count is None:
        gpu_count = max(gpu.count if gpu else settings.tp, settings.tp)
    draft_name = draft_config or (profile.draft.shape if profile.draft else None)
    draft = _draft_shape(draft_name)
    notes = extra.pop("notes", ())
    if gpu is not None:
        if extra.get("compute_capability") is None:  # the doctor passes the real GPU's when NVML gave it
            extra["compute_capability"] = gpu.compute_capability
        table = gpu_table()
        extra.setdefault("unified_memory", any(table[m].unified_memory for m in gpu.models if m in table))
        per_host = [table[m].per_host for m in gpu.models if m in table]
        extra.setdefault("gpus_per_host", max(per_host) if per_host else None)
    if draft_name and draft is None:
        missing = (
            f"draft shape {draft_name!r} is not shipped in sizing/configs: draft weights and "
            "draft KV are not counted (pass --draft-config PATH)"
        )
        notes = (*notes, missing)
    return PlanRequest(
        engine=profile.engine.kind,
        engine_version=profile.engine.version,
        shape=load_shape(shape_name),
        draft=draft,
        settings=settings,
        gpu_memory_gib=gpu.memory_gib if gpu_memory_gib is None and gpu else gpu_memory_gib or 0,
        gpu_count=gpu_count,
        profile=profile.name,
        notes=tuple(notes),
        reserve_holds_context=adapter.reserve_holds_context,
        **extra,
    )


def _draft_shape(name: str | None) -> ModelShape | None:
    if name is None:
        return None
    if name not in shipped_shapes() and "/" not in name and not name.endswith(".json"):
        return None  # a profile naming a draft shape that is not shipped: the plan says so in its notes
    return load_shape(name)
