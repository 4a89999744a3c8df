"""One adapter per engine; `adapter_for` is the only place that looks at the engine kind."""

from __future__ import annotations

from ornith_stack.engines.base import (
    EngineAdapter,
    MetricNames,
    ServeSettings,
    SpecCounters,
    acceptance_length,
    render_flag,
    shell_join,
)
from ornith_stack.engines.sglang import SglangAdapter
from ornith_stack.engines.vllm import VllmAdapter
from ornith_stack.profiles.model import Profile

ADAPTERS: dict[str, EngineAdapter] = {a.kind: a for a in (VllmAdapter(), SglangAdapter())}


def adapter_for(profile_or_kind: Profile | str) -> EngineAdapter:
    kind = profile_or_kind if isinstance(profile_or_kind, str) else profile_or_kind.engine.kind
    return ADAPTERS[kind]


def launch_args(profile: Profile, host: str = "0.0.0.0", port: int | None = None) -> list[str]:
    return adapter_for(profile).launch_args(profile, host=host, port=port)


__all__ = [
    "ADAPTERS",
    "EngineAdapter",
    "MetricNames",
    "ServeSettings",
    "SpecCounters",
    "acceptance_length",
    "adapter_for",
    "launch_args",
    "render_flag",
    "shell_join",
]
