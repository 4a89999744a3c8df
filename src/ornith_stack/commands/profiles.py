"""`ornith-stack profiles`, `profiles show NAME` and `launch-args NAME`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.table import Table

from ornith_stack.engines import launch_args, shell_join
from ornith_stack.errors import UserError, shown
from ornith_stack.generate.core import find_root
from ornith_stack.generate.profile_files import mountable, save_computed
from ornith_stack.gpus import GpuModel, describe, gpu_table, identify, lookup
from ornith_stack.planner.layout import DEFAULT_RECIPE, RECIPES, compute_layout, layout_lines
from ornith_stack.profiles import (
    DEFAULT_PROFILE,
    check_new_name,
    load_all,
    load_profile,
    user_profile_dir,
)

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


def _checkout_or(fallback: Path) -> Path:
    try:
        return find_root()
    except UserError:
        return fallback


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

    @profiles.command("new")
    def new(
        name: Annotated[str, typer.Argument(help="Name of the new profile (lowercase letters, digits, dashes).")],
        gpu: Annotated[str, typer.Option(help="GPU table key (e.g. h100-sxm) or NVML name (e.g. 'NVIDIA H200').")],
        count: Annotated[int, typer.Option(help="GPUs on the host.")] = 1,
        model: Annotated[str, typer.Option(help=f"Recipe: {', '.join(RECIPES)}.")] = DEFAULT_RECIPE,
        out: Annotated[str | None, typer.Option(help="Where compose/, helm/ and ansible/ files go (default: the "
                                                      "ornith-stack checkout around the current folder, where "
                                                      "compose finds its build contexts; else the profile "
                                                      "folder's NAME/).")] = None,
        force: Annotated[bool, typer.Option(help="Replace an operator profile of that name.")] = False,
        layout_for: Annotated[str, typer.Option("--layout", help="throughput: the tp whose replicas x running "
                                                "requests is largest; latency: the largest tp that starts.")]
        = "throughput",
        memory_gib: Annotated[float | None, typer.Option(help="A card the GPU table lacks: its memory per GPU in "
                                                         "GiB as NVML reports it (with --compute-capability).")]
        = None,
        compute_capability: Annotated[str | None, typer.Option(help="A card the GPU table lacks: its compute "
                                                                "capability, e.g. 8.9.")] = None,
        bandwidth_gbps: Annotated[float | None, typer.Option(help="A described card's memory bandwidth, GB/s "
                                                             "(the roofline; default 1000).")] = None,
        context_length: Annotated[int | None, typer.Option(help="Tokens per request (the engine's context-length "
                                                           "flag); default: the longest that runs 8 "
                                                           "requests per replica; the model's window (262144) "
                                                           "is an explicit choice.")] = None,
    ) -> None:
        """Compute a profile for COUNT x GPU from a seed's recipe and the planner; write it to the operator's
        profile folder (ORNITH_PROFILE_DIR, default ~/.config/ornith-stack/profiles) with its compose file,
        Helm values and Ansible variables."""
        if out == "":
            raise UserError("--out '': name the folder for the compose, Helm and Ansible files, or leave it out")
        folder = user_profile_dir(to_write=True)
        profile_file = mountable(folder / f"{check_new_name(name, 'profile')}.yaml")  # before the folder is made
        if profile_file.exists() and not force:
            raise UserError(f"{profile_file} exists; pass --force to replace it")
        card = _card(gpu, count, memory_gib, compute_capability, bandwidth_gbps)
        made = not folder.exists()
        folder.mkdir(parents=True, exist_ok=True)  # ORNITH_PROFILE_DIR may name a folder not made yet
        try:
            layout = compute_layout(model, card, count, name, layout_for, context_length)
        except UserError:
            if made:
                folder.rmdir()  # a refused layout leaves nothing behind
            raise
        words = ["ornith-stack", "profiles", "new", name, "--gpu", gpu, "--count", str(count), "--model", model]
        if layout_for != "throughput":
            words += ["--layout", layout_for]
        if context_length is not None:
            words += ["--context-length", str(context_length)]
        for option, value in (("--memory-gib", memory_gib), ("--compute-capability", compute_capability),
                              ("--bandwidth-gbps", bandwidth_gbps)):
            if value is not None:
                words += [option, f"{value:g}" if isinstance(value, float) else value]
        command = shlex.join(words)
        written = save_computed(layout, folder, Path(out) if out else _checkout_or(folder / name), command)
        plan = layout.plan
        typer.echo(f"{name}: {layout.replicas} replica(s) x tp {layout.tp} on {layout.count}x {layout.gpu.name}; "
                   f"planner: {plan.verdict}, {plan.kv_cache_tokens:,} KV tokens and {layout.caps.running} running "
                   f"requests per replica at {layout.context:,} tokens (profile {layout.base}'s flags, sized to "
                   "the card)")
        for line in layout_lines(layout)[2:]:
            if line.startswith("WARNING: "):
                typer.echo(f"warning: {line.removeprefix('WARNING: ')}", err=True)
            else:
                typer.echo(f"note: {line}")
        for path in written:
            typer.echo(f"wrote {path}")

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


def _card(gpu: str, count: int, memory_gib: float | None, compute_capability: str | None,
          bandwidth_gbps: float | None) -> GpuModel:
    """The table's GPU, or a card the operator describes (both --memory-gib and --compute-capability)."""
    if not gpu.isprintable() or gpu != gpu.strip():
        # It is written into the profile's command line and file: a newline there breaks every profile.
        raise UserError(f"--gpu {shown(gpu)}: a GPU table key or NVML name, without line breaks or surrounding "
                        "spaces")
    if memory_gib is None and compute_capability is None:
        if bandwidth_gbps is not None:
            raise UserError("--bandwidth-gbps describes a card the table lacks: give --memory-gib and "
                            "--compute-capability with it")
        return lookup(gpu)
    if memory_gib is None or compute_capability is None:
        raise UserError("a card the GPU table lacks needs both --memory-gib and --compute-capability")
    if identify(gpu) is not None or gpu.lower() in gpu_table():
        raise UserError(f"{gpu!r} is in the GPU table; drop --memory-gib and --compute-capability")
    return describe(gpu, memory_gib, compute_capability, bandwidth_gbps, count)
