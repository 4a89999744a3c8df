"""The code passes the project's linter (ruff, configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "src", "tests", "scripts"],
                            cwd=REPO, check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
