"""`--launch up`: each candidate brought up by the project's compose bring-up, as an operator profile.

The candidate is written as an operator profile (ORNITH_PROFILE_DIR) with its compose file in the checkout,
`up` starts it under a project of its own without an API key (loopback only), and `down` removes it and
the files again (the profile, the compose file, the start time `up` records), so the next candidate starts from
nothing and the checkout is left as it was.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path

import yaml

from ornith_stack.generate.core import render
from ornith_stack.generate.profile_files import operator_files
from ornith_stack.profiles import user_profile_dir
from ornith_stack.profiles.model import Profile
from ornith_stack.stack import shell
from ornith_stack.stack.bringup import UpOptions, up
from ornith_stack.stack.compose import find_checkout, layout_for, stack_for
from ornith_stack.stack.health import engine_log, log_tail
from ornith_stack.stack.rolling import state_path
from ornith_stack.tune.measure import Engine, EngineCrash, Launcher


class _Quiet:
    """The bring-up's steps go to the candidate's folder, not the terminal."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def step(self, title: str) -> None:
        with open(self.path, "a") as fh:
            fh.write(f"== {title}\n")

    def note(self, text: str) -> None:
        with open(self.path, "a") as fh:
            fh.write(f"   {text}\n")


def compose_launcher(start_timeout_s: float) -> Launcher:
    root = find_checkout(Path.cwd())  # compose needs the checkout's build contexts: refuse before the run starts

    @contextlib.contextmanager
    def launch(profile: Profile, workdir: Path) -> Iterator[Engine]:
        digest = hashlib.sha256(profile.model_dump_json().encode()).hexdigest()[:8]
        name = f"tune-{digest}"
        candidate = profile.model_copy(update={"name": name})
        folder = user_profile_dir()
        folder.mkdir(parents=True, exist_ok=True)
        profile_file = folder / f"{name}.yaml"
        data = candidate.model_dump(mode="json", exclude_none=True)
        data["engine"] = {"kind": profile.engine.kind, "version": profile.engine.version}
        profile_file.write_text(yaml.safe_dump(data, sort_keys=False))
        written = render(root, operator_files(candidate, profile_file, "ornith-stack tune --launch up"))
        options = UpOptions(root=root, profile=name, project=f"ornith-{name}", with_key=False,
                            start_timeout_s=start_timeout_s)
        stack = stack_for(root, name, options.project, root / "compose" / ".env")
        engines = layout_for(candidate).engines
        try:
            try:
                outcome = up(options, shell.run, _Quiet(workdir / "up.log"))
            except Exception as exc:  # the bring-up's refusal (an engine that exits, a failed compose up)
                reason = f"up failed: {exc}"
                raise EngineCrash(reason, log_tail(engine_log(shell.run, stack, engines), 30) or reason) from None

            def alive() -> bool:
                return shell.run(stack.compose("ps", "--status", "running", "-q", *engines)).stdout.strip() != ""

            yield Engine(outcome.access.api_base.removesuffix("/v1"), outcome.access.model, candidate, alive,
                         lambda: log_tail(engine_log(shell.run, stack, engines), 30),
                         lambda: engine_log(shell.run, stack, engines, 1_000_000))
        finally:
            shell.run(stack.compose("down", "--remove-orphans"), timeout=600)
            for item in written:
                (root / item.path).unlink(missing_ok=True)
            profile_file.unlink(missing_ok=True)
            state_path(stack).unlink(missing_ok=True)  # `up` records the engine's start time beside compose/.env

    return launch
