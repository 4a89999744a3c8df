"""The fast tier does not depend on the machine: an operator's profiles (in ~/.config/ornith-stack/profiles, where
`profiles new` writes them, or in ORNITH_PROFILE_DIR) are invisible to it. The test modules that list the profiles
at import time are collected, and the tests that compare a generated file's list of profiles with the shipped ones
run, in a pytest of their own started with such a folder present."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "src" / "ornith_stack" / "profiles"
# The modules that parametrize over every profile when they are imported.
LISTING_MODULES = ["tests/unit/test_helm.py", "tests/unit/test_doctor.py", "tests/unit/test_docker.py"]


def _stray_machine(tmp_path: Path) -> dict[str, str]:
    """An environment whose home has a stray operator profile and whose ORNITH_PROFILE_DIR has another, plus one
    that shadows a shipped profile with other content."""
    home = tmp_path / "home"
    in_home = home / ".config" / "ornith-stack" / "profiles"
    in_dir = tmp_path / "operator-profiles"
    for folder in (in_home, in_dir):
        folder.mkdir(parents=True)
    demo = (PROFILES / "cpu-demo.yaml").read_text()
    (in_home / "stray-home.yaml").write_text(demo)
    (in_dir / "stray-dir.yaml").write_text(demo)
    (in_dir / "gpu96.yaml").write_text(demo)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "PYTEST_"))}
    return {**env, "HOME": str(home), "ORNITH_PROFILE_DIR": str(in_dir)}


def _pytest(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-n", "0",
                           "-q", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)


def test_an_operator_s_profiles_change_nothing_the_fast_tier_collects_or_checks(tmp_path: Path) -> None:
    env = _stray_machine(tmp_path)
    collected = _pytest(env, "--collect-only", *LISTING_MODULES)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-2000:]
    assert "stray" not in collected.stdout
    assert "test_values_files_match_the_schema[values-gpu96.yaml]" in collected.stdout
    # The checks that compare the generated files' profile lists with the profiles pass there too.
    checked = _pytest(env, "tests/unit/test_helm.py", "-k", "schema_lists_exactly_the_profiles")
    assert checked.returncode == 0, checked.stdout[-3000:]
    assert "1 passed" in checked.stdout
