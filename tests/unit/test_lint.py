"""The checkout passes the linters that .pre-commit-config.yaml runs on a commit: ruff, mypy (both
configured in pyproject.toml), shellcheck and yamllint (.yamllint). hadolint and ansible-lint run in
test_docker.py and test_ansible_static.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, check=False, capture_output=True, text=True, timeout=600)


def tool(name: str, package: str) -> str:
    """The venv's copy of `name` first, then the system's."""
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if not found:
        pytest.fail(f"{name} is not installed ({package}); scripts/test.sh installs it")
    return found


def shell_scripts() -> list[str]:
    tracked = run("git", "ls-files").stdout.split()
    return [p for p in tracked if p.endswith(".sh") or
            (Path(REPO / p).is_file() and Path(REPO / p).read_bytes()[:40].startswith(b"#!/usr/bin/env bash"))]


def test_ruff_finds_nothing() -> None:
    result = run(sys.executable, "-m", "ruff", "check", "src", "tests", "scripts")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing() -> None:
    result = run(sys.executable, "-m", "mypy")  # files and settings: [tool.mypy] in pyproject.toml
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr


def test_shellcheck_finds_nothing() -> None:
    scripts = shell_scripts()
    assert "scripts/test.sh" in scripts and ".ci/run" in scripts
    result = run(tool("shellcheck", "Debian package shellcheck"), *scripts)
    assert result.returncode == 0, result.stdout + result.stderr


def test_yamllint_finds_nothing() -> None:
    result = run(tool("yamllint", "PyPI yamllint, the dev extra"), "--strict", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_yamllint_reads_the_generated_files() -> None:
    listed = set(run(tool("yamllint", "PyPI yamllint, the dev extra"), "--list-files", ".").stdout.split())
    assert {"./compose/gpu96.yml", "./monitoring/prometheus/prometheus.yml", "./helm/ornith/values.yaml"} <= listed
