"""The types of engine flags: what a profile may write for a flag, so that a typo'd value fails at load time.

Each engine's flags.py names its flags with these types. A number may be written as a YAML number or as
the string the seed's shell line had ("0.85"). `TEXT` flags pass through as the seed wrote them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FlagType:
    """What the engine's parser makes of a flag's value (`parsed`: int, float, bool for a switch, str, or
    dict for JSON) and which values it accepts (`check` returns None, else what was expected)."""

    parsed: type
    check: Callable[[Any], str | None]
    choices: tuple[str, ...] = ()


def _integer_check(minimum: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        try:
            number = int(value) if not isinstance(value, (bool, float)) else None
        except (TypeError, ValueError):
            number = None
        if number is None or number < minimum:
            return f"an integer >= {minimum}"
        return None

    return check


def integer(minimum: int) -> FlagType:
    return FlagType(int, _integer_check(minimum))


def _fraction(value: Any) -> str | None:
    number = _float(value)
    return None if number is not None and 0 < number <= 1 else "a number in (0, 1]"


def _positive(value: Any) -> str | None:
    number = _float(value)
    return None if number is not None and number > 0 else "a positive number"


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _switch(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false (a switch)"


def choice(*choices: str) -> FlagType:
    def check(value: Any) -> str | None:
        return None if value in choices else f"one of {', '.join(choices)}"

    return FlagType(str, check, choices)


def _speculative_config(value: Any) -> str | None:
    if not isinstance(value, dict):
        return "a mapping, e.g. {method: dflash, num_speculative_tokens: 15}"
    tokens = value.get("num_speculative_tokens", 0)
    return None if _integer_check(0)(tokens) is None else "num_speculative_tokens as an integer >= 0"


POSITIVE_INT, COUNT = integer(1), integer(0)
FRACTION = FlagType(float, _fraction)
POSITIVE = FlagType(float, _positive)
SWITCH = FlagType(bool, _switch)


def unchecked(parsed: type) -> FlagType:
    """A flag whose value a profile does not set or is not checked here (the adapter writes it, or any
    text passes through as the seed wrote it); the engine's parser still makes `parsed` of it."""
    return FlagType(parsed, lambda value: None)


TEXT = unchecked(str)
SPECULATIVE_CONFIG = FlagType(dict, _speculative_config)


def arg_problems(kind: str, flags: dict[str, FlagType], args: dict[str, Any]) -> list[str]:
    """One line per flag whose value the engine would refuse: "serve.args.FLAG: KIND expects X, got V"."""
    problems = []
    for flag, value in args.items():
        expected = flags[flag].check(value) if flag in flags else None
        if expected:
            problems.append(f"serve.args.{flag}: {kind} expects {expected}, got {value!r}")
    return problems
