"""One adapter per engine; `adapter_for` is the only place that looks at the engine kind."""

from __future__ import annotations

from typing import Any

from ornith_stack.engines.base import (
    EngineAdapter,
    EngineInfo,
    KeyHandoff,
    MetricNames,
    PanelQuery,
    PromQL,
    ReportedAcceptance,
    ServedProfile,
    ServeSettings,
    SpecCounters,
    acceptance_length,
    render_flag,
    shell_join,
)
from ornith_stack.engines.flag_types import arg_problems
from ornith_stack.engines.sglang import SglangAdapter
from ornith_stack.engines.vllm import VllmAdapter
from ornith_stack.wire.metrics import Samples

ADAPTERS: dict[str, EngineAdapter] = {a.kind: a for a in (VllmAdapter(), SglangAdapter())}


def adapter_for(profile_or_kind: ServedProfile | str) -> EngineAdapter:
    kind = profile_or_kind if isinstance(profile_or_kind, str) else profile_or_kind.engine.kind
    return ADAPTERS[kind]


def detect_adapter(samples: Samples) -> EngineAdapter | None:
    """The adapter of the engine that produced a scrape, recognised by its metric names."""
    return next((a for a in ADAPTERS.values() if a.owns(samples)), None)


def engine_arg_problems(kind: str, args: dict[str, Any]) -> list[str]:
    """One line per flag of a profile whose value the engine `kind` would refuse (none for unknown kinds)."""
    adapter = ADAPTERS.get(kind)
    return arg_problems(kind, adapter.flags, args) if adapter else []


def models_named(argv: list[str]) -> list[tuple[str | None, str | None]]:
    """(model, revision) of every model an engine argv names, as each engine spells them (any engine's argv)."""
    flags = {w: argv[i + 1] for i, w in enumerate(argv[:-1]) if w.startswith("--")}
    serve = argv[argv.index("serve") + 1] if "serve" in argv[:-1] else None
    return [model for adapter in ADAPTERS.values() for model in adapter.models_named(flags, serve)]


def launch_args(profile: ServedProfile, host: str = "0.0.0.0", port: int | None = None) -> list[str]:
    return adapter_for(profile).launch_args(profile, host=host, port=port)


__all__ = [
    "ADAPTERS",
    "EngineAdapter",
    "EngineInfo",
    "KeyHandoff",
    "MetricNames",
    "PanelQuery",
    "PromQL",
    "ReportedAcceptance",
    "ServeSettings",
    "ServedProfile",
    "SpecCounters",
    "acceptance_length",
    "adapter_for",
    "detect_adapter",
    "engine_arg_problems",
    "launch_args",
    "models_named",
    "render_flag",
    "shell_join",
]
