"""`ornith-stack rehearse PROFILE [--acceptance X] [--model-config FILE] [--launch local] [--out DIR]`."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ornith_stack import deployment
from ornith_stack.commands.bench import output_dir
from ornith_stack.commands.profiles import SetOption, parse_sets
from ornith_stack.commands.tune import stop_on_sigterm
from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError
from ornith_stack.profiles import load_profile
from ornith_stack.rehearse.report import markdown
from ornith_stack.rehearse.run import (
    ModelPlace,
    Question,
    check_host,
    draft_config_for,
    model_config_for,
    rehearse,
    write_json,
)
from ornith_stack.tune.compose import compose_launcher
from ornith_stack.tune.measure import Launcher, check_engine_importable, local_launcher

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
LAUNCHES = ("local", "up")


@contextlib.contextmanager
def model_cache_mounted(place: ModelPlace | None) -> Iterator[None]:
    """compose mounts $ORNITH_HF_CACHE at $ORNITH_HF_CACHE_MOUNT as the engines' model cache (compose/*.yml):
    for the run, the folder the dummy model folders are written to, read-only where the engine reads them. The
    process environment wins over compose/.env, which is left as it is."""
    if place is None:
        yield
        return
    mount = {"ORNITH_HF_CACHE": str(place.host), "ORNITH_HF_CACHE_MOUNT": f"{place.engine}:ro"}
    saved = {name: os.environ.get(name) for name in mount}
    os.environ.update(mount)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def register(app: typer.Typer) -> None:
    @app.command("rehearse")
    def rehearse_cmd(
        profile: Annotated[str, typer.Argument(help="The profile to rehearse.")],
        acceptance: Annotated[float | None, typer.Option(help="Simulate this acceptance length (tokens per "
                                                        "verification step, e.g. 6.1 for seed 000's GSM8K); "
                                                        "SGLang only.")] = None,
        model_config: Annotated[str | None, typer.Option(help="config.json (or a folder holding one, or a shipped "
                                                         "shape's name) whose shapes to build (default: the "
                                                         "profile's model.shape).")] = None,
        draft_config: Annotated[str | None, typer.Option(help="The draft's config.json (default: the profile's "
                                                         "draft.shape).")] = None,
        launch: Annotated[str, typer.Option(help="local: the engine process on this machine, as `tune --launch "
                                            "local` starts it (no Docker); up: through compose, as `ornith-stack "
                                            "up` starts it (the model folders mounted as its model cache).")
                          ] = "local",
        sets: SetOption = None,
        input_tokens: Annotated[int, typer.Option(min=1, max=1_000_000, help="Prompt tokens per request.")] = 256,
        output_tokens: Annotated[int, typer.Option(min=2, max=1_000_000, help="Output tokens per request.")] = 128,
        num_prompts: Annotated[int | None, typer.Option(min=1, max=1_000_000, help="Requests per level (default "
                                                        "2 x its streams, at least 8).")] = None,
        concurrency: Annotated[int | None, typer.Option(min=1, max=100_000, help="Streams of the second level "
                                                        "(default: the engine's running-request limit).")] = None,
        start_timeout: Annotated[float, typer.Option(min=1, max=86_400, help="Seconds the engine may take to be "
                                                     "healthy.")] = 1800.0,
        out_dir: Annotated[Path, typer.Option("--out", help="rehearsal.json, rehearsal.md, the engine's log and "
                                              "the dummy model folders.")] = Path("rehearsal"),
    ) -> None:
        """Start a profile's engine at the model's real shapes without its weights (random weights, nothing
        downloaded), load it at one stream and at its running-request limit, and report whether it started
        (where it stopped), its own sizing beside `plan`, seconds to healthy, output tok/s, TTFT and TPOT
        beside the roofline.

        Exit status: 0 started and loaded, 1 the engine did not start or failed under load, 2 bad input."""
        if launch not in LAUNCHES:
            raise UserError(f"--launch {launch!r}: choose {' or '.join(LAUNCHES)}")
        if acceptance is not None and not math.isfinite(acceptance):
            raise UserError(f"--acceptance {acceptance}: give a number of tokens per verification step, e.g. 6.1")
        chosen = load_profile(profile, parse_sets(sets))
        adapter = adapter_for(chosen)
        if acceptance is not None:
            adapter.simulated_acceptance_env(chosen, acceptance)  # refused here, before anything is written
        question = Question(chosen, model_config_for(chosen, model_config), draft_config_for(chosen, draft_config),
                            acceptance, input_tokens, output_tokens, num_prompts, concurrency, start_timeout)
        check_host(chosen)
        launcher: Launcher
        if launch == "local":
            check_engine_importable(chosen)
            launcher, place = local_launcher(start_timeout), ModelPlace.local(out_dir)
        else:
            launcher = compose_launcher(start_timeout)  # refuses outside a checkout, before anything is written
            place = ModelPlace(out_dir.resolve() / "model-cache", deployment.HF_HOME_IN_CONTAINER)
        with output_dir(out_dir), stop_on_sigterm(), model_cache_mounted(place if launch == "up" else None):
            result = rehearse(question, launcher, out_dir, lambda line: err.print(line, markup=False), place)
        report = markdown(result)
        (out_dir / "rehearsal.md").write_text(report)
        path = write_json(result, out_dir / "rehearsal.json")
        out.print(report, markup=False)
        out.print(f"report: {path}, {out_dir / 'rehearsal.md'}; engine log: {out_dir / 'engine' / 'engine.log'}",
                  markup=False)
        if not result.started or result.bench_error:
            raise typer.Exit(1)
