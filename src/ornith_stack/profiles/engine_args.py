"""The types of the engine flags a profile may set, per engine: a typo'd value fails at load time.

Flags not listed here pass through as the seed wrote them (strings such as --reasoning-parser). A
number may be written as a YAML number or as the string the seed's shell line had ("0.85").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

# A check returns None when the value is fine, else what was expected.
Check = Callable[[Any], str | None]


def _integer(minimum: int) -> Check:
    def check(value: Any) -> str | None:
        try:
            number = int(value) if not isinstance(value, (bool, float)) else None
        except (TypeError, ValueError):
            number = None
        if number is None or number < minimum:
            return f"an integer >= {minimum}"
        return None

    return check


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


def _choice(*choices: str) -> Check:
    def check(value: Any) -> str | None:
        return None if value in choices else f"one of {', '.join(choices)}"

    return check


def _speculative_config(value: Any) -> str | None:
    if not isinstance(value, dict):
        return "a mapping, e.g. {method: dflash, num_speculative_tokens: 15}"
    tokens = value.get("num_speculative_tokens", 0)
    return None if _integer(0)(tokens) is None else "num_speculative_tokens as an integer >= 0"


POSITIVE_INT, COUNT = _integer(1), _integer(0)

ENGINE_ARGS: dict[str, dict[str, Check]] = {
    # sglang/srt/server_args.py (0.5.17): types and choices of the flags the planner and seeds use.
    "sglang": {
        "tp-size": POSITIVE_INT, "tp": POSITIVE_INT, "tensor-parallel-size": POSITIVE_INT,
        "dp-size": POSITIVE_INT, "pp-size": POSITIVE_INT, "context-length": POSITIVE_INT,
        "max-total-tokens": POSITIVE_INT, "max-running-requests": POSITIVE_INT, "page-size": POSITIVE_INT,
        "max-mamba-cache-size": POSITIVE_INT, "chunked-prefill-size": _integer(-1),
        "speculative-dflash-block-size": POSITIVE_INT, "speculative-num-draft-tokens": POSITIVE_INT,
        "speculative-num-steps": POSITIVE_INT, "speculative-eagle-topk": POSITIVE_INT,
        "mem-fraction-static": _fraction, "mamba-full-memory-ratio": _positive,
        "mamba-radix-cache-strategy": _choice("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"),
        "mamba-scheduler-strategy": _choice("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"),
        "mamba-ssm-dtype": _choice("float32", "bfloat16", "float16"),
        "disable-radix-cache": _switch, "disable-overlap-schedule": _switch, "trust-remote-code": _switch,
        "enable-metrics": _switch,
    },
    # vllm/engine/arg_utils.py (0.24.0).
    "vllm": {
        "tensor-parallel-size": POSITIVE_INT, "tp": POSITIVE_INT, "pipeline-parallel-size": POSITIVE_INT,
        "data-parallel-size": POSITIVE_INT, "max-model-len": POSITIVE_INT, "kv-cache-memory-bytes": POSITIVE_INT,
        "max-num-batched-tokens": POSITIVE_INT, "max-num-seqs": POSITIVE_INT, "block-size": POSITIVE_INT,
        "gpu-memory-utilization": _fraction, "speculative-config": _speculative_config,
        "enable-prefix-caching": _switch, "no-enable-prefix-caching": _switch, "trust-remote-code": _switch,
        "enforce-eager": _switch,
    },
}


def engine_arg_problems(kind: str, args: dict[str, Any]) -> list[str]:
    """One line per flag whose value the engine would refuse: "serve.args.FLAG: expected X, got V"."""
    checks = ENGINE_ARGS.get(kind, {})
    problems = []
    for flag, value in args.items():
        expected = checks[flag](value) if flag in checks else None
        if expected:
            problems.append(f"serve.args.{flag}: {kind} expects {expected}, got {value!r}")
    return problems
