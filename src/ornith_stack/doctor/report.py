"""The doctor's report: one finding per line, `ready` when no finding is a problem."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ornith_stack.doctor.gpu import GpuInfo
from ornith_stack.planner import Plan
from ornith_stack.planner.layout import Layout

Level = Literal["ok", "warn", "problem"]


@dataclass(frozen=True)
class Finding:
    level: Level
    topic: str
    message: str

    def line(self) -> str:
        tag = {"ok": "ok", "warn": "warn", "problem": "FAIL"}[self.level]
        return f"{tag:>4}  {self.topic}: {self.message}"


@dataclass
class Report:
    profile: str | None
    profile_reason: str | None
    gpus: list[GpuInfo] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    plan: Plan | None = None
    # `--profile auto` computed the profile for this host (not a saved one): `up` saves it before it starts.
    computed: Layout | None = None

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "problem"]

    @property
    def ready(self) -> bool:
        return not self.problems

    def add(self, level: Level, topic: str, message: str) -> None:
        self.findings.append(Finding(level, topic, message))

    def to_json(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "profile": self.profile,
            "profile_reason": self.profile_reason,
            "gpus": [asdict(g) for g in self.gpus],
            "findings": [asdict(f) for f in self.findings],
            "problems": [f"{f.topic}: {f.message}" for f in self.problems],
            "plan": self.plan.to_json() if self.plan else None,
            "computed": self.computed is not None,
        }
