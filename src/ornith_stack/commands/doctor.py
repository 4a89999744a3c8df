"""`ornith-stack doctor`: is this machine and this checkpoint ready for a profile?"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ornith_stack.doctor import Options, Report, diagnose

out = Console(highlight=False, soft_wrap=True)

STYLE = {"ok": "green", "warn": "yellow", "problem": "bold red"}


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_cmd(
        profile: Annotated[str, typer.Option(
            help="Profile name, or 'auto' to pick the one that fits the detected GPUs (and say why). "
                 "Default: $ORNITH_PROFILE, else auto.")] = os.environ.get("ORNITH_PROFILE", "auto"),
        weights: Annotated[Path | None, typer.Option(
            help="Checkpoint folder: config.json + model.safetensors.index.json (or model.safetensors).")] = None,
        draft_weights: Annotated[Path | None, typer.Option(
            help="DFlash draft folder: its config.json names the mask token; mask_embedding.safetensors?")] = None,
        mask_token_id: Annotated[int | None, typer.Option(
            help="Mask token whose embedding row DFlash reads (default: the draft's, else 248077).")] = None,
        allow_no_gpu: Annotated[bool, typer.Option(
            help="A missing GPU is a warning, not a problem (CI, building images); the plan then uses "
                 "the profile's nominal GPUs.")] = False,
        warn_only: Annotated[bool, typer.Option(
            help="Report problems but exit 0: the operator's override for a launch gate.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Machine-readable report.")] = False,
    ) -> None:
        """Preflight check: GPUs (NVML), checkpoint, and the plan on this machine.

        Checks GPU count, memory (the host's on unified-memory parts such as
        GB10), compute capability, the driver against the image's declared
        floor, the NVSwitch fabric state, against the profile; the checkpoint's index and config (MTP tensors, visual.*
        tensors, total bytes, DFlash mask-token row); then plans the profile
        on the GPUs found. One line per finding; problems are marked FAIL.

        Exit status: 0 ready (warnings allowed); 1 not ready, one FAIL line
        per problem; 2 bad input (unknown profile, malformed flag, a
        checkpoint that is not one: malformed index or header, truncated
        shard, a weight_map entry outside the folder).

        Container entrypoints: run `doctor --profile "$ORNITH_PROFILE"
        --weights /models/NAME` before starting the engine and refuse to
        start on a non-zero status. The operator overrides with --warn-only
        (problems still printed, exit 0). Use --allow-no-gpu where no GPU
        is expected (image builds, CI smoke tests).
        """
        report = diagnose(Options(profile=profile, weights=weights, draft_weights=draft_weights,
                                  mask_token_id=mask_token_id, allow_no_gpu=allow_no_gpu,
                                  replica_only=os.environ.get("ORNITH_REPLICA") is not None))
        if as_json:
            typer.echo(json.dumps(report.to_json(), indent=2))
        else:
            show(report, warn_only, out)
        if not report.ready and not warn_only:
            raise typer.Exit(1)


def show(report: Report, warn_only: bool, console: Console) -> None:
    """One line per finding, then the verdict (the entrypoint prints the same, on stderr)."""
    for finding in report.findings:
        console.print(f"[{STYLE[finding.level]}]{finding.line()}[/]", markup=True)
    if report.ready:
        console.print(f"[bold green]ready[/]: profile {report.profile}", markup=True)
    else:
        console.print(f"[bold red]not ready[/]: {len(report.problems)} problem(s) for profile "
                      f"{report.profile}" + (" (--warn-only: exit 0)" if warn_only else ""), markup=True)
