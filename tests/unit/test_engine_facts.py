"""Engine knowledge lives in engines/ only: no other module of the package names an engine metric or flag.

Every .py file under src/ornith_stack outside engines/ is read, comments and docstrings included, for the
engines' raw metric names (the `sglang:` and `vllm:` prefixes) and for the `--flag` spellings listed in
engines/*/flags.py. What is left is listed below, each with its reason; a listed exception that no longer
occurs fails the test, so the list only shrinks.
"""

from __future__ import annotations

import re
from pathlib import Path

from ornith_stack.cli import eager_commands
from ornith_stack.engines import ADAPTERS

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "ornith_stack"
ENGINES = PACKAGE / "engines"
METRIC = re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(a.metric_prefix) for a in ADAPTERS.values()) + r")\w+")
FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*(?![\w-])")
# (file under src/ornith_stack, what it names) -> why it may.
EXCEPTIONS: dict[tuple[str, str], str] = {
    # (bench/suites.py's context-length hint names vLLM's --max-model-len and SGLang's --context-length: both are
    # also ornith-stack's own options, `plan --max-model-len` and `profiles new --context-length`.)
}


def own_options() -> set[str]:
    """Every option of ornith-stack itself: `plan --mem-fraction-static`, `launch-args --port`, `bench --model`
    are the project's own options, named after the engine flag they set; a message naming one names it."""
    commands = list(eager_commands().values())
    for group in list(commands):  # a group's sub-commands too: `profiles new --context-length`
        commands += list(getattr(group, "commands", {}).values())
    return {
        opt
        for command in commands
        for param in command.params
        for opt in (*param.opts, *param.secondary_opts)
        if opt.startswith("--")
    }


def engine_flags() -> set[str]:
    return {f"--{flag}" for adapter in ADAPTERS.values() for flag in adapter.flags}


def findings() -> dict[tuple[str, str], list[int]]:
    """(file, metric name or flag) -> the lines naming it, outside engines/."""
    flags = engine_flags() - own_options()
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(ENGINES):
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            named = METRIC.findall(line) + [f for f in FLAG.findall(line) if f in flags]
            for name in named:
                found.setdefault((rel, name), []).append(number)
    return found


def test_no_engine_metric_or_flag_outside_engines() -> None:
    unexpected = {
        f"{rel}:{lines[0]} {name}" for (rel, name), lines in findings().items() if (rel, name) not in EXCEPTIONS
    }
    assert not unexpected, "engine knowledge outside engines/ (move it into the adapter): " + ", ".join(
        sorted(unexpected)
    )


def test_every_exception_is_still_needed() -> None:
    assert set(EXCEPTIONS) <= set(findings()), set(EXCEPTIONS) - set(findings())


def test_the_search_finds_what_it_looks_for() -> None:
    """The patterns find a metric name and a flag spelled as the engines spell them (not a silent pass)."""
    sample = f"rate({ADAPTERS['vllm'].metrics.generation_tokens}[5m]) with --speculative-dflash-block-size 16"
    assert METRIC.findall(sample) == [ADAPTERS["vllm"].metrics.generation_tokens]
    assert "--speculative-dflash-block-size" in set(FLAG.findall(sample)) & engine_flags()
    assert "--mem-fraction-static" in own_options()  # `plan`'s own option, named after SGLang's flag
