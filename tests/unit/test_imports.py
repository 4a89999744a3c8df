"""The import contracts of pyproject.toml ([tool.importlinter]) hold: run each with `lint-imports`."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTRACTS = [c["id"] for c in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]]
GENERATE = REPO / "src" / "ornith_stack" / "generate"


@pytest.mark.parametrize("contract", CONTRACTS)
def test_import_contract_holds(contract: str) -> None:
    result = lint_imports(contract)
    assert result.returncode == 0, result.stdout + result.stderr


def lint_imports(contract: str, source: Path = REPO / "src") -> subprocess.CompletedProcess[str]:
    tool = shutil.which("lint-imports")
    assert tool, "lint-imports (PyPI import-linter, the dev extra) is not installed"
    env = {**os.environ, "PYTHONPATH": str(source)}
    return subprocess.run([tool, "--no-cache", "--contract", contract], cwd=REPO, env=env, capture_output=True,
                          text=True)


def test_an_engine_module_importing_generate_breaks_the_contracts(tmp_path: Path) -> None:
    shutil.copytree(REPO / "src" / "ornith_stack", tmp_path / "ornith_stack",
                    ignore=shutil.ignore_patterns("__pycache__"))
    base = tmp_path / "ornith_stack" / "engines" / "base.py"
    base.write_text(base.read_text() + "\nimport ornith_stack.generate.core  # noqa\n")
    for contract in ("generate-on-top", "layers", "acyclic"):
        result = lint_imports(contract, tmp_path)
        assert result.returncode != 0 and "engines" in result.stdout and "generate" in result.stdout, contract


def test_a_type_checking_import_upwards_is_a_cycle_the_contracts_refuse(tmp_path: Path) -> None:
    """Round three's cycle: engine adapters naming the profile schema for the type checker only, while the schema
    asks the engines about its flags (profiles -> engines -> profiles)."""
    shutil.copytree(REPO / "src" / "ornith_stack", tmp_path / "ornith_stack",
                    ignore=shutil.ignore_patterns("__pycache__"))
    base = tmp_path / "ornith_stack" / "engines" / "base.py"
    base.write_text(base.read_text().replace(
        "from ornith_stack.wire.metrics import Samples\n",
        "from ornith_stack.wire.metrics import Samples\n\nif TYPE_CHECKING:\n"
        "    from ornith_stack.profiles.model import Profile  # noqa: F401\n", 1
    ).replace("from typing import ", "from typing import TYPE_CHECKING, ", 1))
    acyclic = lint_imports("acyclic", tmp_path)
    assert acyclic.returncode != 0 and ".profiles -> .engines" in acyclic.stdout, acyclic.stdout
    layers = lint_imports("layers", tmp_path)
    assert layers.returncode != 0 and "ornith_stack.engines.base -> ornith_stack.profiles.model" in layers.stdout


def test_every_generate_module_is_in_a_layer_of_the_generate_contract() -> None:
    """A module left out of the layers is unchecked: it could import any other generate/ module."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in contracts if c["id"] == "generate-layers")["layers"]
    listed = {name.strip() for layer in layers for name in layer.split("|")}
    modules = {p.stem for p in GENERATE.glob("*.py") if p.stem != "__init__"}
    assert modules - listed == set(), "add these generate/ modules to the generate-layers contract"
    assert listed - modules == set(), "the generate-layers contract names modules that do not exist"
