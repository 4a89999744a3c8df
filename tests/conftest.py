"""Shared test helpers: where the repository and the shared seeds are."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests: random locally (150 examples, saved failures replayed from .hypothesis/); in CI
# (`HYPOTHESIS_PROFILE=ci`, set by .ci/run) derandomized and without an example database, so every run
# draws the same examples and no machine's saved example decides another's result. `deep` is for a
# long local search: `HYPOTHESIS_PROFILE=deep pytest tests/unit/test_plan_bad_input.py`.
settings.register_profile("default", max_examples=150)
settings.register_profile("ci", max_examples=150, derandomize=True, database=None, print_blob=True)
settings.register_profile("deep", max_examples=5000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

REPO = Path(__file__).resolve().parents[1]
# The seeds live beside the checkout (../shared); CI lays a copy of shared/ there too.
SHARED = Path(os.environ.get("ORNITH_SHARED_DIR", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared() -> Path:
    if not (SHARED / "seeds").is_dir():
        pytest.skip(f"shared/ with the seeds is not at {SHARED} (set ORNITH_SHARED_DIR)")
    return SHARED


_session_home: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    """The whole session (and every process it starts) sees an empty home and an empty operator profile folder.

    Set here, before collection, not in a fixture: test modules list the profiles at import time to
    parametrize over them, and one operator profile in ~/.config/ornith-stack/profiles (what `profiles new`
    writes) made 20 tests fail on that machine. pytest-xdist's workers inherit the variables and call this
    again, each with a home of its own."""
    global _session_home
    _session_home = Path(tempfile.mkdtemp(prefix="ornith-tests-home-"))
    for name, folder in (("XDG_CONFIG_HOME", ".config"), ("XDG_CACHE_HOME", ".cache"),
                         ("XDG_DATA_HOME", ".local/share"), ("XDG_STATE_HOME", ".local/state"),
                         ("ORNITH_PROFILE_DIR", "operator-profiles")):
        (_session_home / folder).mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(_session_home / folder)
    os.environ["HOME"] = str(_session_home)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _session_home is not None:
        shutil.rmtree(_session_home, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_operator_profiles(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with an operator profile folder of its own: a profile one test writes (`profiles new`)
    is not seen by the next."""
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(tmp_path_factory.mktemp("operator-profiles")))
