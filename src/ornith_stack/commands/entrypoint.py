"""`ornith-stack entrypoint [COMMAND...]`: the engine images' entrypoint (stack/entrypoint.py says what it does)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from ornith_stack.commands.doctor import show
from ornith_stack.doctor import Options, diagnose
from ornith_stack.stack import entrypoint as ep


def register(app: typer.Typer) -> None:
    # Every word after `entrypoint` is the engine's, options included (--help too): nothing is parsed here.
    @app.command("entrypoint", hidden=True, add_help_option=False,
                 context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def entrypoint_cmd(ctx: typer.Context) -> None:
        """Check the profile and the machine, then start the engine with its API key off its command line."""
        # The words as given: click drops the first `--`, which belongs to the engine's command (`sh -c S -- A`).
        given = sys.argv[1:]
        words = given[1:] if given[:1] == ["entrypoint"] else list(ctx.args)
        if words in (["--help"], ["-h"]):  # alone, it is ours: the engine's own help comes after its command
            typer.echo(ctx.get_help())
            typer.echo(f"\n{ep.__doc__}")
            return
        environ = dict(os.environ)
        profile = ep.profile_of(environ)
        ep.check_input(profile, words, environ)
        if ep.is_on(environ.get("ORNITH_SKIP_DOCTOR")):
            ep.say("ORNITH_SKIP_DOCTOR is set: not running the doctor")
        else:
            warn_only = ep.is_on(environ.get("ORNITH_DOCTOR_WARN_ONLY"))
            weights = environ.get("ORNITH_WEIGHTS")
            report = diagnose(Options(profile=profile.name, weights=Path(weights) if weights else None))
            show(report, warn_only, Console(stderr=True, highlight=False, soft_wrap=True))
            if not report.ready and not warn_only:
                ep.say(f"refusing to start: 'ornith-stack doctor --profile {profile.name}' found the problems "
                       "above (exit 1). Fix them, or set ORNITH_DOCTOR_WARN_ONLY=1 to start anyway "
                       "(ORNITH_SKIP_DOCTOR=1 skips the check).")
                raise typer.Exit(1)
        launch = ep.prepare(profile, words, environ)
        if ep.is_on(environ.get("ORNITH_DRY_RUN")):
            typer.echo(json.dumps(ep.redacted_words(launch.argv)))
            launch.discard()
            return
        raise typer.Exit(ep.run(launch, profile))
