"""Shared test helpers: where the repository and the shared seeds are."""

from __future__ import annotations

import os
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


@pytest.fixture(autouse=True)
def _no_operator_profiles(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see the shipped profiles only, never the profiles of whoever runs them (~/.config)."""
    if "ORNITH_PROFILE_DIR" not in os.environ:
        monkeypatch.setenv("ORNITH_PROFILE_DIR", str(tmp_path_factory.mktemp("operator-profiles")))
