"""Every file `ornith-stack render` generates, in one explicit order."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from ornith_stack.generate import (
    alertmanager,
    alerts,
    ansible_roles,
    dashboards,
    helm_chart,
    monitoring_readme,
    profile_files,
    prometheus,
)
from ornith_stack.generate.core import GeneratedFile, Outcome, render

# Each takes the repository root and yields the files it generates; listing them builds nothing.
GENERATORS: tuple[Callable[[Path], Iterable[GeneratedFile]], ...] = (
    profile_files.files,
    prometheus.files,
    alerts.files,
    alertmanager.files,
    dashboards.files,
    monitoring_readme.files,
    helm_chart.files,
    ansible_roles.files,
)


def generated_files(root: Path) -> list[GeneratedFile]:
    return [generated for generator in GENERATORS for generated in generator(root)]


def render_all(root: Path, check: bool = False) -> list[Outcome]:
    """Write (or with `check`, compare) every generated file under `root`."""
    return render(root, generated_files(root), check=check)
