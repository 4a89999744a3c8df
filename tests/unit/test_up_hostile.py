"""`up`, `status` and `logs` refuse odd numbers and names in one `error:` line, exit 2, before calling Docker (a
PATH without docker shows that nothing reached it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # No docker on PATH: a command that got past its checks would fail differently (docker not found).
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path), "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "ornith_stack.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.mark.parametrize(("args", "says"), [
    (["up", "cpu-demo", "--start-timeout", "nan"], "--start-timeout must be seconds above 0"),
    (["up", "cpu-demo", "--start-timeout", "-1"], "--start-timeout must be seconds above 0"),
    (["up", "cpu-demo", "--start-timeout", "inf"], "--start-timeout must be seconds above 0"),
    (["up", "cpu-demo", "--drain-timeout", "nan"], "--drain-timeout must be seconds above 0"),
    (["up", "cpu-demo", "--drain-timeout", "0"], "--drain-timeout must be seconds above 0"),
    (["up", "cpu-demo", "-p", "Bad Name!"], "is not a compose project name"),
    (["down", "-p", "UPPER"], "is not a compose project name"),
    (["status", "--interval", "nan"], "--interval must be seconds above 0"),
    (["status", "--interval", "1e308"], "--interval must be seconds above 0"),
    (["status", "--interval", "-1"], "--interval must be seconds above 0"),
    (["logs", "--tail", "abc"], "--tail must be a number of lines or all"),
    (["logs", "--tail", "-1"], "--tail must be a number of lines or all"),
    (["logs", "--tail", ""], "--tail must be a number of lines or all"),
    # Port 9 on loopback: nothing is sent, the options are refused first.
    (["load", "--url", "http://127.0.0.1:9", "--after", "nan"], "Invalid value for '--after'"),
    (["load", "--url", "http://127.0.0.1:9", "--after", "-1"], "Invalid value for '--after'"),
    (["load", "--url", "http://127.0.0.1:9", "--after", "$x"], "Invalid value for '--after'"),
    (["load", "--url", "http://127.0.0.1:9", "--after", "inf"], "must be 0 or more seconds"),
])
def test_an_odd_value_is_one_error_line_before_docker(tmp_path: Path, args: list[str], says: str) -> None:
    done = _cli(tmp_path, *args)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], done.stderr
    assert "docker" not in done.stderr.lower(), done.stderr
