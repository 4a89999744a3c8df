"""`ornith-stack profiles`, `profiles show NAME` and `launch-args NAME`."""

from __future__ import annotations

import json
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.table import Table

from ornith_stack.engines import launch_args, shell_join
from ornith_stack.errors import UserError
from ornith_stack.profiles import DEFAULT_PROFILE, load_all, load_profile

out = Console()

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE", help="Override a profile value, e.g. model.repo=org/name."),
]


def parse_sets(pairs: list[str] | None) -> dict[str, str]:
    """--set KEY=VALUE pairs as a dict; a pair without '=' is a user error."""
    result = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UserError(f"--set {pair!r}: expected KEY=VALUE, e.g. --set model.repo=org/name")
        result[key.strip()] = value
    return result


def list_profiles() -> None:
    table = Table(title="ornith-stack profiles", title_justify="left")
    for column in ("profile", "engine", "model", "draft", "GPUs"):
        table.add_column(column, overflow="fold")
    for p in load_all():
        gpus = f"{p.hardware.gpu.count}x {p.hardware.gpu.model}" if p.hardware.gpu else "none (CPU)"
        name = f"{p.name} (default)" if p.name == DEFAULT_PROFILE else p.name
        table.add_row(name, f"{p.engine.kind} {p.engine.version}", p.model.repo or "(operator supplies)",
                      p.draft.repo if p.draft else "-", gpus)
    out.print(table)


def register(app: typer.Typer) -> None:
    profiles = typer.Typer(help="List the hardware profiles, or show one.", no_args_is_help=False)

    @profiles.callback(invoke_without_command=True)
    def _list(ctx: typer.Context) -> None:
        """List the profiles."""
        if ctx.invoked_subcommand is None:
            list_profiles()

    @profiles.command("show")
    def show(
        name: str,
        as_json: Annotated[bool, typer.Option("--json", help="JSON instead of YAML.")] = False,
        sets: SetOption = None,
    ) -> None:
        """Show one profile, with its base merged in and the image pin resolved."""
        data = load_profile(name, parse_sets(sets)).model_dump(mode="json", exclude_none=True)
        typer.echo(json.dumps(data, indent=2) if as_json else yaml.safe_dump(data, sort_keys=False))

    app.add_typer(profiles, name="profiles")

    @app.command("launch-args")
    def launch_args_cmd(
        name: Annotated[str, typer.Argument(help="Profile name.")] = DEFAULT_PROFILE,
        sets: SetOption = None,
        as_json: Annotated[bool, typer.Option("--json", help="A JSON list instead of a shell line.")] = False,
        host: Annotated[str, typer.Option(help="Address the engine listens on.")] = "0.0.0.0",
        port: Annotated[int | None, typer.Option(help="Port (default: the profile's).")] = None,
    ) -> None:
        """Print the engine command line of a profile: the seed's flags plus host, port and metrics."""
        if port is not None and not 1 <= port <= 65535:
            raise UserError(f"--port must be a TCP port from 1 to 65535, got {port}")
        argv = launch_args(load_profile(name, parse_sets(sets)), host=host, port=port)
        typer.echo(json.dumps(argv) if as_json else shell_join(argv))
