"""Which candidates to measure, in what order: the budget goes where goodput can still improve.

Not a grid. First the profile as it is (the seed) and the engine's own defaults (the seed's caps removed);
then, from the best so far, one axis at a time, a hill climb along the axis's values in both directions that
stops in a direction as soon as goodput stops improving (coordinate descent, coarse values); then one
finer step: the midpoints between the best value of each numeric axis and its neighbours. `evaluate`
measures a candidate, or answers from the state of an earlier run, or returns None when the budget is spent,
which ends the search. The order depends only on the answers, so a resumed run retraces it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ornith_stack.profiles.model import Profile
from ornith_stack.tune.candidates import Axis, AxisValue, Candidate, build
from ornith_stack.tune.state import Record

Evaluate = Callable[[Candidate], Record | None]


class BudgetSpent(Exception):
    """evaluate said no: nothing more is measured."""


def rank(record: Record) -> tuple[float, float]:
    """Higher is better: goodput first, then (for candidates that met nothing) how close they came."""
    return record.goodput_tok_s, -record.closest_miss


def search(profile: Profile, axes: tuple[Axis, ...], evaluate: Evaluate) -> list[Record]:
    """Every record evaluated, in order (the seed first)."""
    seen: dict[str, Record] = {}

    def run(candidate: Candidate) -> Record | None:
        if candidate.key in seen:
            return seen[candidate.key]
        record = evaluate(candidate)
        if record is None:
            raise BudgetSpent
        seen[candidate.key] = record
        return record

    try:
        _climb(profile, axes, run)
    except BudgetSpent:
        pass
    return list(seen.values())


def _climb(profile: Profile, axes: tuple[Axis, ...], run: Callable[[Candidate], Record | None]) -> None:
    best_settings: dict[str, AxisValue] = {}
    best = run(build(profile, axes, {}, "seed"))
    caps = {a.name: None for a in axes if a.cap}
    if caps:
        defaults = run(build(profile, axes, caps, "engine defaults"))
        if defaults and best and rank(defaults) > rank(best):
            best, best_settings = defaults, dict(caps)

    def attempt(axis: Axis, value: AxisValue) -> bool:
        """Measure one step along `axis`; True while the climb should go on (the step was no worse: a
        plateau, such as an explicit value equal to the engine's default, is crossed, not stopped at)."""
        nonlocal best, best_settings
        settings = {**best_settings, axis.name: value}
        record = run(build(profile, axes, settings))
        if record is None or best is None:
            return False
        if rank(record) > rank(best):
            best, best_settings = record, settings
        return rank(record) >= rank(best)

    for axis in axes:  # coarse: hill-climb each axis from the best so far
        current = best_settings.get(axis.name, axis.current(profile))
        if None in axis.values and current is not None:
            attempt(axis, None)
        numbers = sorted(v for v in axis.values if v is not None)
        current = best_settings.get(axis.name, axis.current(profile))
        start = _nearest(numbers, current)
        if numbers and start < len(numbers) and numbers[start] != current:
            attempt(axis, numbers[start])  # --try left the profile's own value out: start from the nearest
        for direction in (1, -1):
            index = start + direction
            while 0 <= index < len(numbers) and attempt(axis, numbers[index]):
                index += direction
    for axis in axes:  # fine: between the best value and its neighbours
        numbers = sorted(v for v in axis.values if v is not None)
        current = best_settings.get(axis.name, axis.current(profile))
        if current is None or not numbers or axis.speculative and current == 0:
            continue
        for value in _midpoints(numbers, current):
            attempt(axis, value)


def outline(profile: Profile, axes: tuple[Axis, ...]) -> list[Candidate]:
    """What the search starts from, without measuring (`tune --dry-run`): the seed, the engine's defaults,
    then every value of each axis from the seed (the coarse pass before a measurement moves the best; the
    climb stops early in a direction that does not improve, and the fine step follows the best). Each
    distinct set of flags once."""
    caps = {a.name: None for a in axes if a.cap}
    listed = [build(profile, axes, {}, "seed")]
    if caps:
        listed.append(build(profile, axes, caps, "engine defaults"))
    for axis in axes:
        listed += [build(profile, axes, {axis.name: v}) for v in axis.values if v != axis.current(profile)]
    distinct: dict[str, Candidate] = {}
    for candidate in listed:
        distinct.setdefault(candidate.key, candidate)
    return list(distinct.values())


def _nearest(numbers: list[float | int], value: AxisValue) -> int:
    if not numbers:
        return 0
    if value is None:
        return len(numbers)  # the engine default is usually the largest: climb down from above
    return min(range(len(numbers)), key=lambda i: abs(math.log((numbers[i] or 0.5) / (value or 0.5))))


def _midpoints(numbers: list[float | int], value: float | int) -> list[float | int]:
    """Geometric midpoints between `value` and the values beside it (rounded for whole-number axes)."""
    below = [n for n in numbers if n < value]
    above = [n for n in numbers if n > value]
    found: list[float | int] = []
    for other in ([below[-1]] if below else []) + ([above[0]] if above else []):
        if other <= 0 or value <= 0:
            continue
        mid = math.sqrt(other * value)
        point: float | int = round(mid) if isinstance(value, int) and isinstance(other, int) else round(mid, 3)
        if point not in (value, other):
            found.append(point)
    return found
