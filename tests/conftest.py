"""Shared test helpers: where the repository and the shared seeds are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
