"""`ornith-stack engine-key PROFILE --dir DIR`: how the container entrypoint hands the engine its API key."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError
from ornith_stack.profiles import load_profile


def register(app: typer.Typer) -> None:
    @app.command("engine-key", hidden=True)
    def engine_key_cmd(
        profile: Annotated[str, typer.Argument(help="Profile name.")],
        directory: Annotated[Path, typer.Option("--dir", help="Private folder for files that carry the key.")],
    ) -> None:
        """Read $ORNITH_API_KEY; write what the engine needs into --dir (0600) and print, as JSON, the
        names of the environment variables to set to the key and the argv words to append. The key
        itself is never printed."""
        key = os.environ.get("ORNITH_API_KEY", "")
        if not key:
            raise UserError("ORNITH_API_KEY is not set: nothing to hand to the engine")
        if not directory.is_dir():
            raise UserError(f"--dir {directory}: not a folder")
        handoff = adapter_for(load_profile(profile)).api_key_handoff(key, directory)
        typer.echo(json.dumps({"env": list(handoff.env), "args": list(handoff.args)}))
