"""Candidates: a profile with some of its engine flags replaced, and whether the planner says it fits.

An axis is one thing `tune` varies (a running-request limit, a speculative depth); its values are written
into the profile's `serve.args` through the profile model, so a candidate is a validated profile like any
other and its engine command comes from `launch_args`. A value of None removes the flag (the engine's own
default); a speculative depth of 0 turns speculation off.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ornith_stack.engines import ADAPTERS, adapter_for
from ornith_stack.errors import UserError, shown
from ornith_stack.planner import plan_profile
from ornith_stack.profiles import from_data
from ornith_stack.profiles.model import Profile

AxisValue = int | float | None
Settings = Mapping[str, AxisValue]


@dataclass(frozen=True)
class Axis:
    """One tunable: `flag` in serve.args; `speculative` axes set the depth (0: speculation off)."""

    name: str
    flag: str
    values: tuple[AxisValue, ...]
    speculative: bool = False
    cap: bool = False  # removed in the "engine defaults" baseline (the seed's caps gone)

    def current(self, profile: Profile) -> AxisValue:
        args = profile.serve.args
        if self.speculative:
            return adapter_for(profile).speculative_depth(dict(args), self.flag)
        value = args.get(self.flag)
        return _number(value) if value is not None else None


def _number(value: Any) -> AxisValue:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    number = float(value)
    return int(number) if number.is_integer() and "." not in str(value) else number


# What each engine lets `tune` vary, with coarse default values (the profile's own value is always added):
# its adapter's axes. The speculative axis is offered only when the profile speculates.
AXES: dict[str, tuple[Axis, ...]] = {
    kind: tuple(Axis(a.name, a.flag, a.values, a.speculative, a.cap) for a in adapter.tune_axes)
    for kind, adapter in ADAPTERS.items()
}


def axes_for(profile: Profile, tries: Mapping[str, tuple[AxisValue, ...]] | None = None) -> tuple[Axis, ...]:
    """The axes of the profile's engine, each with its values (`tries` replaces them, and then only the axes
    named there are varied), the profile's own value included, in search order."""
    known = AXES[profile.engine.kind]
    names = {a.name for a in known}
    unknown = [n for n in tries or {} if n not in names]
    if unknown:
        raise UserError(f"--try {shown(unknown[0])}: {profile.engine.kind} axes are {', '.join(sorted(names))}")
    chosen = []
    for axis in known:
        if tries and axis.name not in tries:
            continue
        if axis.speculative and not axis.current(profile):
            if tries and axis.name in tries:
                raise UserError(f"--try {axis.name}: profile {profile.name!r} does not speculate; nothing to vary")
            continue
        values = (tries or {}).get(axis.name, axis.values)
        own = axis.current(profile)
        ordered = tuple(dict.fromkeys((*values, own) if not tries else values))
        chosen.append(Axis(axis.name, axis.flag, ordered, axis.speculative, axis.cap))
    return tuple(chosen)


def parse_tries(pairs: list[str] | None) -> dict[str, tuple[AxisValue, ...]]:
    """`--try AXIS=V1,V2`: numbers, `default` (the engine's own: the flag removed) or `off` (depth 0)."""
    tries: dict[str, tuple[AxisValue, ...]] = {}
    for pair in pairs or []:
        name, sep, text = pair.partition("=")
        values: list[AxisValue] = []
        for word in text.split(","):
            word = word.strip().lower()
            if word in ("default", "none"):
                values.append(None)
            elif word == "off":
                values.append(0)
            else:
                try:
                    number = float(word)
                except ValueError:
                    number = -1.0
                if number < 0 or number != number:
                    raise UserError(f"--try {shown(pair)}: expected AXIS=V1,V2 with numbers, default or off")
                values.append(int(number) if number.is_integer() else number)
        if not sep or not name or not values:
            raise UserError(f"--try {shown(pair)}: expected AXIS=V1,V2, e.g. --try max-num-seqs=4,16")
        tries[name.strip()] = tuple(dict.fromkeys(values))
    return tries


@dataclass(frozen=True)
class Candidate:
    """The profile with `settings` (axis name -> value) applied; `key` names its effective flags."""

    name: str
    settings: dict[str, AxisValue]
    profile: Profile

    @property
    def key(self) -> str:
        draft = self.profile.draft.repo if self.profile.draft else None
        return json.dumps({"args": self.profile.serve.args, "draft": draft}, sort_keys=True, default=str)


def build(profile: Profile, axes: tuple[Axis, ...], settings: Settings, name: str = "") -> Candidate:
    """`profile` with each axis of `settings` written into serve.args, validated as a profile."""
    data = profile.model_dump(mode="json", exclude_none=True)
    args: dict[str, Any] = dict(data["serve"]["args"])
    by_name = {a.name: a for a in axes}
    for axis_name, value in settings.items():
        axis = by_name[axis_name]
        if axis.speculative:
            _set_depth(data, args, axis.flag, value)
        elif value is None:
            args.pop(axis.flag, None)
        else:
            args[axis.flag] = value
    data["serve"]["args"] = args
    changed = {k: v for k, v in settings.items() if v != by_name[k].current(profile)}
    label = name or ", ".join(f"{k}={'default' if v is None else v}" for k, v in sorted(changed.items())) or "seed"
    return Candidate(label, changed, from_data(data, Path(f"{profile.name}.yaml")))


def _set_depth(data: dict[str, Any], args: dict[str, Any], flag: str, depth: AxisValue) -> None:
    if adapter_for(data["engine"]["kind"]).set_speculative_depth(args, flag, depth):
        data.pop("draft", None)


@dataclass(frozen=True)
class Verdict:
    """The planner's word on a candidate: started when `fits`; `why` names the problem or why unplanned."""

    fits: bool
    why: str


def planner_verdict(candidate: Candidate) -> Verdict:
    """Does the planner say the candidate fits? A profile it cannot plan (no GPU: the CPU demo) is started."""
    profile = candidate.profile
    if profile.hardware.gpu is None:
        return Verdict(True, "not planned: a CPU profile has no GPU memory to account")
    try:
        plan = plan_profile(profile)
    except UserError as exc:
        return Verdict(True, f"not planned: {exc}")
    if plan.problems:
        return Verdict(False, "; ".join(p.line() for p in plan.problems))
    return Verdict(True, f"{plan.verdict}: {plan.kv_cache_tokens:,} KV tokens")
