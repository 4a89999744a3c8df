"""What was measured, kept in --out/tune-state.json so an interrupted run resumes without measuring twice.

Each record is keyed by the candidate's effective flags (Candidate.key); the state also holds what the
run was asked (profile, SLO, workload, rates), and a resumed run with a different question starts afresh
rather than mixing answers to two questions.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ornith_stack.errors import UserError, shown
from ornith_stack.reading import parse_json, read_text

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


@dataclass(frozen=True)
class StateFile:
    """tune-state.json as written by save_state; read back through the bench's checking decoder."""

    format: str
    question: dict[str, Any]
    records: tuple[Record, ...] = ()


STATUSES = ("measured", "refused", "crashed")


def load_state(out: Path, question: dict[str, Any], axes: Collection[str] = ()) -> State:
    """The state in `out` for this question; an empty one when there is none or it answered another. A file
    that is not a state this version wrote (a list, deep nesting, a string rate, a candidate on an axis this
    run does not have) is one error naming it, never a traceback in the middle of the run."""
    path = out / STATE_FILE
    if not path.is_file():
        return State(question)
    where = f"{path}: not a tune state file"
    data = parse_json(read_text(path), where)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"{where} ({FORMAT}); remove it or choose another --out")
    # The bench's decoder, imported here: the bench package brings httpx, which the tuner's HTTP does without.
    from ornith_stack.bench.codec import Malformed, from_json

    try:
        saved = from_json(StateFile, data)
    except Malformed as exc:
        raise UserError(f"{where} ({exc}); remove it or choose another --out") from None
    if saved.question != question:
        return State(question)
    for record in saved.records:
        problem = _problem(record, axes)
        if problem:
            raise UserError(f"{where} (candidate {shown(record.key)}: {problem}); remove it or choose another --out")
    return State(question, {r.key: r for r in saved.records})


def _problem(record: Record, axes: Collection[str]) -> str | None:
    unknown = sorted(set(record.settings) - set(axes)) if axes else []
    if unknown:
        return f"axis {shown(unknown[0])}, which this run does not vary"
    if record.status not in STATUSES:
        return f"status {shown(record.status)}, not {', '.join(STATUSES)}"
    if any(math.isnan(lv.rate) or lv.rate <= 0 for lv in record.levels):
        return "a request rate that is not above 0"
    return None


def save_state(out: Path, state: State) -> None:
    """Written to a temporary file and renamed, so an interrupt never leaves half a state."""
    path = out / STATE_FILE
    data = {"format": FORMAT, "question": state.question, "records": [asdict(r) for r in state.records.values()]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
