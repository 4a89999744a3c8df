"""The Docker CLI's recorded answers (tests/fixtures/docker/, its README says how each was made), replayed
through the Runner that `ornith-stack up` and the day-2 commands call."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from ornith_stack.stack.shell import Result

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "docker"


def recorded(name: str, returncode: int = 0) -> Result:
    """A recorded command's stdout (`name.out` or `name.json`) and stderr (`name.err`, if any)."""
    out = next(FIXTURES / f"{name}{ext}" for ext in (".out", ".json") if (FIXTURES / f"{name}{ext}").exists())
    err = FIXTURES / f"{name}.err"
    return subprocess.CompletedProcess([], returncode, out.read_text(), err.read_text() if err.exists() else "")


class Replay:
    """Answers each command with its recording; a command without one fails the test."""

    def __init__(self, answers: dict[tuple[str, ...], Result]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout: float = 600.0, on_line: object = None) -> Result:
        self.calls.append(tuple(argv))
        for prefix, result in self.answers.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return result
        raise AssertionError(f"no recording for {argv}")
