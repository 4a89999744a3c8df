"""One adapter per engine; `adapter_for` is the only place that looks at the engine kind."""

from __future__ import annotations

from ornith_stack.engines.base import (
    EngineAdapter,
    EngineInfo,
    KeyHandoff,
    MetricNames,
    ReportedAcceptance,
    ServeSettings,
    SpecCounters,
    acceptance_length,
    render_flag,
    shell_join,
)
from ornith_stack.engines.sglang import SglangAdapter
from ornith_stack.engines.vllm import VllmAdapter
from ornith_stack.profiles.model import Profile
from ornith_stack.wire.metrics import Samples

ADAPTERS: dict[str, EngineAdapter] = {a.kind: a for a in (VllmAdapter(), SglangAdapter())}


def adapter_for(profile_or_kind: Profile | str) -> EngineAdapter:
    kind = profile_or_kind if isinstance(profile_or_kind, str) else profile_or_kind.engine.kind
    return ADAPTERS[kind]


def detect_adapter(samples: Samples) -> EngineAdapter | None:
    """The adapter of the engine that produced a scrape, recognised by its metric names."""
    return next((a for a in ADAPTERS.values() if a.owns(samples)), None)


def launch_args(profile: Profile, host: str = "0.0.0.0", port: int | None = None) -> list[str]:
    return adapter_for(profile).launch_args(profile, host=host, port=port)


__all__ = [
    "ADAPTERS",
    "EngineAdapter",
    "EngineInfo",
    "KeyHandoff",
    "MetricNames",
    "ReportedAcceptance",
    "ServeSettings",
    "SpecCounters",
    "acceptance_length",
    "adapter_for",
    "detect_adapter",
    "launch_args",
    "render_flag",
    "shell_join",
]
