"""The tuner's loop: candidates from the search, each refused by the planner, measured, or replayed from
the state of an earlier run; a progress line per candidate; the winner or the closest miss at the end."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ornith_stack.profiles.model import Profile
from ornith_stack.tune.candidates import Axis, Candidate, planner_verdict
from ornith_stack.tune.measure import Engine, EngineCrash, Launcher, LoadPlan, Measured, measure
from ornith_stack.tune.search import rank, search
from ornith_stack.tune.state import Record, State, save_state

Say = Callable[[str], None]
# Loads a healthy engine and returns its levels (measure.measure: the bench's serving suite at rising rates).
Measure = Callable[[Engine, LoadPlan, Path, Say], Measured]


@dataclass(frozen=True)
class Limits:
    budget_s: float
    max_candidates: int | None = None


@dataclass(frozen=True)
class Outcome:
    records: list[Record]
    winner: Record | None  # the highest goodput under the SLO; None when nothing met it
    closest: Record | None  # when nothing met it: the candidate nearest to the SLO
    measured_now: int  # engines started by this run


def tune(profile: Profile, axes: tuple[Axis, ...], plan: LoadPlan, launcher: Launcher, state: State, out: Path,
         limits: Limits, say: Say, clock: Callable[[], float] = time.monotonic, load: Measure = measure) -> Outcome:
    measured_now = 0

    def started() -> int:
        return sum(r.status != "refused" for r in state.records.values())

    def evaluate(candidate: Candidate) -> Record | None:
        nonlocal measured_now
        if candidate.key in state.records:
            record = state.records[candidate.key]
            say(f"{record.name}: measured before ({_summary(record)})")
            return record
        verdict = planner_verdict(candidate)
        if not verdict.fits:
            record = _record(candidate, "refused", verdict.why, reason=f"planner: {verdict.why}")
            say(f"{candidate.name}: not started, the planner says it does not fit: {verdict.why}")
        else:
            left = limits.budget_s - state.spent_s
            estimate = max((r.duration_s for r in state.records.values() if r.status != "refused"), default=0.0)
            if left < estimate or left <= 0 or (limits.max_candidates is not None and started() >= limits.max_candidates):
                return None
            say(f"{candidate.name}: starting ({candidate_flags(candidate)}); {left / 60:.1f} min of budget left")
            record = _measure(candidate, verdict.why, plan, launcher, out, say, clock, load)
            measured_now += 1
        state.records[candidate.key] = record
        save_state(out, state)
        left = max(0.0, limits.budget_s - state.spent_s)
        say(f"{record.name}: {_summary(record)}; {left / 60:.1f} min of budget left")
        return record

    records = search(profile, axes, evaluate)
    meeting = [r for r in records if r.goodput is not None]
    winner = max(meeting, key=rank) if meeting else None
    tried = [r for r in records if r.levels]
    closest = None if winner or not tried else min(tried, key=lambda r: r.closest_miss)
    return Outcome(records, winner, closest, measured_now)


def _measure(candidate: Candidate, planner: str, plan: LoadPlan, launcher: Launcher, out: Path, say: Say,
             clock: Callable[[], float], load: Measure) -> Record:
    workdir = out / "candidates" / _slug(candidate.name)
    workdir.mkdir(parents=True, exist_ok=True)
    began = clock()
    start_s = None
    try:
        with launcher(candidate.profile, workdir) as engine:
            start_s = clock() - began
            say(f"  healthy after {start_s:.0f} s")
            measured = load(engine, plan, workdir, say)
    except EngineCrash as crash:
        return _record(candidate, "crashed", planner, reason=crash.reason, log_tail=crash.log_tail,
                       duration_s=clock() - began, start_s=start_s)
    return _record(candidate, "measured", planner, duration_s=clock() - began, start_s=start_s,
                   levels=measured.levels, acceptance_length=measured.acceptance_length)


def _record(candidate: Candidate, status: str, planner: str, **fields: object) -> Record:
    return Record(key=candidate.key, name=candidate.name, settings=dict(candidate.settings),
                  args=candidate.profile.model_dump(mode="json")["serve"]["args"], status=status, planner=planner,
                  **fields)  # type: ignore[arg-type]


def candidate_flags(candidate: Candidate) -> str:
    return ", ".join(f"{k}={'default' if v is None else v}" for k, v in sorted(candidate.settings.items())) or \
        "the profile's flags"


def _summary(record: Record) -> str:
    if record.status == "refused":
        return "refused by the planner"
    if record.status == "crashed":
        return f"crashed: {record.reason}"
    best = record.goodput
    if best is None:
        return f"no rate met the SLO (closest: {record.closest_miss:.0%} over)"
    return f"goodput {record.goodput_tok_s:,.1f} tok/s at {best.rate:g} req/s"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in name)[:80] or "candidate"


def result_json(outcome: Outcome) -> dict[str, object]:
    return {"winner": outcome.winner.key if outcome.winner else None,
            "closest": outcome.closest.key if outcome.closest else None,
            "records": [asdict(r) for r in outcome.records]}
