"""Candidates: a profile with some of its engine flags replaced, and whether the planner says it fits.

An axis is one thing `tune` varies (a running-request limit, a speculative depth); its values are written
into the profile's `serve.args` through the profile model, so a candidate is a validated profile like any
other and its engine command comes from `launch_args`. A value of None removes the flag (the engine's own
default); a speculative depth of 0 turns speculation off.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ornith_stack.engines import ADAPTERS, adapter_for
from ornith_stack.errors import UserError, shown
from ornith_stack.planner import plan_profile, request_for_profile
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
    running: bool = False  # the running-request limit: the caps follow it (re-planned on the card)
    pool: bool = False  # moves the static pool: the caps are re-planned

    @property
    def replans(self) -> bool:
        """Whether a value of this axis re-plans the caps (state slots, verify buffers, KV pool)."""
        return self.running or self.speculative or self.pool

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
    kind: tuple(Axis(a.name, a.flag, a.values, a.speculative, a.cap, a.running, a.pool) for a in adapter.tune_axes)
    for kind, adapter in ADAPTERS.items()
}


def _known_axes(profile: Profile) -> tuple[Axis, ...]:
    """The engine's axes, the depth axis on the flag the profile speculates with (the adapter's
    `depth_flag`: gb300x2 speculates with the draft-token count, not the block size)."""
    adapter, args = adapter_for(profile), dict(profile.serve.args)
    return tuple(replace(a, flag=adapter.depth_flag(args, a.flag)) if a.speculative else a
                 for a in AXES[profile.engine.kind])


def axes_for(profile: Profile, tries: Mapping[str, tuple[AxisValue, ...]] | None = None) -> tuple[Axis, ...]:
    """The axes of the profile's engine, each with its values (`tries` replaces them, and then only the axes
    named there are varied), the profile's own value included, in search order."""
    known = _known_axes(profile)
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
        chosen.append(replace(axis, values=ordered))
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
    if any(by_name[k].replans for k in settings) and profile.hardware.gpu is not None:
        _replan_caps(profile, data, settings)
    changed = {k: v for k, v in settings.items() if v != by_name[k].current(profile)}
    label = name or ", ".join(f"{k}={'default' if v is None else v}" for k, v in sorted(changed.items())) or "seed"
    return Candidate(label, changed, from_data(data, Path(f"{profile.name}.yaml")))


def _replan_caps(profile: Profile, data: dict[str, Any], settings: Settings) -> None:
    """Size the candidate's caps on the profile's card for its running requests, as `profiles new` sizes a
    profile's: the state slots and verify buffers of that many requests (none with speculation off) and
    the KV pool that remains; the running axis at `default` removes every cap."""
    running_axis = next((a for a in _known_axes(profile) if a.running), None)
    if running_axis is None:
        return
    running = settings.get(running_axis.name, running_axis.current(profile))
    draft = from_data(data, Path(f"{profile.name}.yaml"))
    try:
        caps = adapter_for(draft).tune_caps(request_for_profile(draft), None if running is None else int(running))
    except UserError:
        return  # a request the planner cannot make: the verdict says so
    args = data["serve"]["args"]
    for flag, value in caps.items():
        if value is None:
            args.pop(flag, None)
        else:
            args[flag] = value


def _set_depth(data: dict[str, Any], args: dict[str, Any], flag: str, depth: AxisValue) -> None:
    if adapter_for(data["engine"]["kind"]).set_speculative_depth(args, flag, depth):
        data.pop("draft", None)


@dataclass(frozen=True)
class Verdict:
    """The planner's word on a candidate: started when `fits`; `why` names the problem or why unplanned."""

    fits: bool
    why: str
    running: int | None = None  # running requests the planner resolves (per replica)
    kv_tokens: int | None = None


def planner_verdict(candidate: Candidate) -> Verdict:
    """Does the planner say the candidate fits? A profile it cannot plan (no GPU: the CPU demo) is started."""
    profile = candidate.profile
    if profile.hardware.gpu is None:
        return Verdict(True, "not planned: a CPU profile has no GPU memory to account")
    try:
        plan = plan_profile(profile)
    except UserError as exc:
        return Verdict(True, f"not planned: {exc}")
    limit = plan.engine_details.get("max_running_requests")
    running = limit if isinstance(limit, int) else int(plan.max_concurrency)
    if plan.problems:
        return Verdict(False, "; ".join(p.line() for p in plan.problems), running, plan.kv_cache_tokens)
    return Verdict(True, f"{plan.verdict}: {running} running requests, {plan.kv_cache_tokens:,} KV tokens", running,
                   plan.kv_cache_tokens)


def flag_changes(profile: Profile, candidate: Candidate) -> str:
    """The candidate's flags against the profile's: `--flag value` set or changed, `-flag` removed."""
    before, after = profile.serve.args, candidate.profile.serve.args
    words = [f"--{k} {json.dumps(v) if isinstance(v, dict) else v}" for k, v in after.items() if before.get(k) != v]
    words += [f"-{k}" for k in before if k not in after]
    return " ".join(words) or "the profile's flags"
