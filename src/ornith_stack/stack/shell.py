"""Running host commands (docker, docker compose) the one way every step of `up` uses."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

Result = subprocess.CompletedProcess[str]


class Runner(Protocol):
    """argv -> finished process (`run` below); tests replay recorded output through the same call."""

    def __call__(self, argv: Sequence[str], timeout: float = ...,
                 on_line: Callable[[str], None] | None = None) -> Result: ...


def run(argv: Sequence[str], timeout: float = 600.0, on_line: Callable[[str], None] | None = None,
        env: Mapping[str, str] | None = None) -> Result:
    """Run `argv` and capture its output; a missing program is exit status 127, like a shell's.
    `on_line` sees each line of its output as it comes (long builds show progress)."""
    if on_line is not None:
        return _streamed(argv, timeout, on_line, env)
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False,
                              env=dict(env) if env is not None else None)
    except FileNotFoundError:
        return subprocess.CompletedProcess(list(argv), 127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"{' '.join(argv[:3])}: no answer in {timeout:g} s")


def first_line(result: Result) -> str:
    """The first non-empty line a failed command printed (stderr first)."""
    for text in (result.stderr, result.stdout):
        for line in text.splitlines():
            if line.strip():
                return line.strip()
    return f"exit status {result.returncode}"


def _streamed(argv: Sequence[str], timeout: float, on_line: Callable[[str], None],
              env: Mapping[str, str] | None) -> Result:
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=dict(env) if env is not None else None)
    except FileNotFoundError:
        return subprocess.CompletedProcess(list(argv), 127, "", f"{argv[0]}: command not found")
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            on_line(line.rstrip())
        code = proc.wait()
    finally:
        timer.cancel()
    text = "".join(lines)
    return subprocess.CompletedProcess(list(argv), code, text, text if code else "")
