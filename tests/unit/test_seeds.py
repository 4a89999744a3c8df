"""`launch-args` reproduces the seeds' commands flag for flag and value for value.

The seeds in ../shared/seeds/ are parsed here, not copied: a profile edit that drifts from its
seed fails this test.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from ornith_stack.cli import main
from ornith_stack.engines import adapter_for
from ornith_stack.profiles import load_profile

# (profile, seed file prefix, which command in that seed)
CASES = [("a100x2", "000_", 0), ("gpu96", "000_", 1), ("gb300x2", "004_", 0)]
LAUNCHERS = re.compile(r"(python3? -m sglang\.launch_server|sglang serve)")
# Spellings the engine reads as one flag: SGLang's argparse accepts `--tp` only as the unambiguous
# abbreviation of `--tp-size`, which is what the generated commands spell out.
ALIASES = {"--tp": "--tp-size"}


def seed_commands(path: Path) -> list[list[str]]:
    """The launch commands in a seed: continuation lines joined, the page's line numbers dropped."""
    commands, current = [], None
    for raw in path.read_text().splitlines():
        line = re.sub(r"^\d+(?=\s*(python|--|sglang))", "", raw.strip())
        if current is None and LAUNCHERS.search(line):
            current = []
        if current is None:
            continue
        current.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            commands.append(shlex.split(" ".join(current)))
            current = None
    return commands


def flags(argv: list[str]) -> dict[str, str]:
    """--flag value / --switch pairs as a mapping (the launcher words before the first flag dropped)."""
    result: dict[str, str] = {}
    words = argv[next(i for i, w in enumerate(argv) if w.startswith("--")):]
    for i, word in enumerate(words):
        if word.startswith("--"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            result[ALIASES.get(word, word)] = nxt if nxt is not None and not nxt.startswith("--") else "<switch>"
    return result


@pytest.mark.parametrize(("profile", "seed_prefix", "index"), CASES)
def test_launch_args_equal_the_seed_command(
    shared: Path, capsys: pytest.CaptureFixture[str], profile: str, seed_prefix: str, index: int
) -> None:
    seed_file = next((shared / "seeds").glob(f"{seed_prefix}*.txt"))
    seed = flags(seed_commands(seed_file)[index])
    assert main(["launch-args", profile, "--json"]) == 0
    ours = flags(json.loads(capsys.readouterr().out))
    serving = {f"--{f}" for f in adapter_for(load_profile(profile)).serving_flags}
    # Every seed flag with the seed's value, and nothing else but the serving flags (listen address
    # and SGLang's --enable-metrics, which the exporter needs).
    assert {k: v for k, v in ours.items() if k not in serving} == seed
    assert serving <= set(ours)


@pytest.mark.parametrize(("profile", "seed_prefix", "index"), CASES)
def test_generated_commands_spell_tp_size_in_full(
    shared: Path, capsys: pytest.CaptureFixture[str], profile: str, seed_prefix: str, index: int
) -> None:
    assert main(["launch-args", profile, "--json"]) == 0
    argv = json.loads(capsys.readouterr().out)
    assert "--tp-size" in argv and "--tp" not in argv


def test_the_seed_parser_finds_every_command(shared: Path) -> None:
    found = {p.name[:4]: len(seed_commands(p)) for p in (shared / "seeds").glob("*.txt")}
    assert found["000_"] == 2 and found["004_"] == 1
