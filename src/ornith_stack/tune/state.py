"""What was measured, kept in --out/tune-state.json so an interrupted run resumes without measuring twice.

Each record is keyed by the candidate's effective flags (Candidate.key); the state also holds what the
run was asked (profile, SLO, workload, rates), and a resumed run with a different question starts afresh
rather than mixing answers to two questions.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ornith_stack.errors import UserError

STATE_FILE = "tune-state.json"
FORMAT = "ornith-stack-tune/1"


@dataclass(frozen=True)
class LevelResult:
    """One request rate of one candidate: the serving suite's figures and whether the SLO held."""

    rate: float
    output_tok_s: float | None
    ttft_p99_ms: float | None
    tpot_p99_ms: float | None
    ttft_median_ms: float | None = None
    failed: int = 0
    meets: bool = False
    miss: float = math.inf  # relative excess over the SLO (0: met)


@dataclass(frozen=True)
class Record:
    """One candidate's outcome: measured (levels), refused by the planner, or crashed (its log tail)."""

    key: str
    name: str
    settings: dict[str, Any]
    args: dict[str, Any]
    status: str  # measured | refused | crashed
    planner: str = ""
    reason: str = ""
    log_tail: str = ""
    duration_s: float = 0.0
    start_s: float | None = None
    levels: tuple[LevelResult, ...] = ()
    acceptance_length: float | None = None  # the engine's, over every level

    @property
    def goodput(self) -> LevelResult | None:
        """The highest rate that met the SLO with every lower rate meeting it too, if any."""
        best = None
        for level in sorted(self.levels, key=lambda lv: lv.rate):
            if not level.meets:
                break
            best = level
        return best

    @property
    def goodput_tok_s(self) -> float:
        best = self.goodput
        return (best.output_tok_s or 0.0) if best else 0.0

    @property
    def closest_miss(self) -> float:
        return min((lv.miss for lv in self.levels), default=math.inf)


@dataclass
class State:
    question: dict[str, Any]
    records: dict[str, Record] = field(default_factory=dict)

    @property
    def spent_s(self) -> float:
        return sum(r.duration_s for r in self.records.values())


def load_state(out: Path, question: dict[str, Any]) -> State:
    """The state in `out` for this question; an empty one when there is none or it answered another."""
    path = out / STATE_FILE
    if not path.is_file():
        return State(question)
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT or data.get("question") != question:
            return State(question)
        records = {r["key"]: _record(r) for r in data["records"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a tune state file ({exc}); remove it or choose another --out") from None
    return State(question, records)


def _record(data: dict[str, Any]) -> Record:
    levels = tuple(LevelResult(**lv) for lv in data.pop("levels", ()))
    return Record(**data, levels=levels)


def save_state(out: Path, state: State) -> None:
    """Written to a temporary file and renamed, so an interrupt never leaves half a state."""
    path = out / STATE_FILE
    data = {"format": FORMAT, "question": state.question, "records": [asdict(r) for r in state.records.values()]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
