"""`ornith-stack render [--check]`: write or verify every generated file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ornith_stack.generate.core import checkout_root, find_root
from ornith_stack.generate.generators import render_all

out = Console()


def register(app: typer.Typer) -> None:
    @app.command("render")
    def render_cmd(
        check: Annotated[bool, typer.Option("--check", help="Compare only; exit 1 if a file differs.")] = False,
        root: Annotated[Path | None, typer.Option(help="Repository root (default: found from here).")] = None,
    ) -> None:
        """Generate compose files, Helm values, Ansible variables and monitoring files from their sources."""
        outcomes = render_all(checkout_root(root) if root else find_root(), check=check)
        stale = [o for o in outcomes if o.status in ("differs", "missing")]
        for outcome in outcomes:
            if outcome.status != "unchanged" or not check:
                out.print(f"{outcome.status:>9}  {outcome.path}", highlight=False)
            if outcome.diff:
                out.print(outcome.diff, highlight=False, markup=False)
        if stale:
            out.print(f"{len(stale)} generated file(s) differ from their sources; run `ornith-stack render`.",
                      highlight=False)
            raise typer.Exit(1)
        if check:
            out.print(f"all {len(outcomes)} generated files match their sources", highlight=False)
