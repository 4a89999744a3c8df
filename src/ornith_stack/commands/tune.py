"""`ornith-stack tune PROFILE --slo 'ttft_p99:MS tpot_p99:MS' [--workload random:IN:OUT | --dataset-path FILE]
[--budget MINUTES] [--out DIR] [--launch local|up]`."""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ornith_stack.commands.bench import output_dir
from ornith_stack.commands.profiles import SetOption, parse_sets
from ornith_stack.errors import UserError
from ornith_stack.profiles import check_new_name, load_profile
from ornith_stack.profiles.model import Profile
from ornith_stack.tune.candidates import Axis, axes_for, build, flag_changes, parse_tries, planner_verdict
from ornith_stack.tune.compose import compose_launcher
from ornith_stack.tune.measure import LoadPlan, check_engine_importable, local_launcher
from ornith_stack.tune.report import plot, speculation_note, start_commands, table, write_winner
from ornith_stack.tune.run import Limits, result_json, tune
from ornith_stack.tune.search import outline
from ornith_stack.tune.spec import parse_budget, parse_rates, parse_slo, parse_workload
from ornith_stack.tune.state import load_state

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
LAUNCHES = ("local", "up")


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """SIGTERM (`timeout`, a job scheduler) ends the run as Ctrl-C does: the running engine is stopped and the
    state keeps what was measured. Without this the engine, in a process group of its own, would outlive us."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def register(app: typer.Typer) -> None:
    @app.command("tune")
    def tune_cmd(
        profile: Annotated[str, typer.Argument(help="The profile to tune.")],
        slo: Annotated[str | None, typer.Option(help="Latency target, e.g. 'ttft_p99:500 tpot_p99:50' "
                                                "(milliseconds); required unless --dry-run.")] = None,
        workload: Annotated[str | None, typer.Option(help="random:IN:OUT prompt and output tokens (default "
                                                     "random:256:128).")] = None,
        dataset_path: Annotated[Path | None, typer.Option(help="Prompts from this JSONL instead (`prompt`, "
                                                          "optional `output_tokens`).")] = None,
        budget: Annotated[float, typer.Option(help="Minutes of measuring, start-ups included.")] = 60.0,
        out_dir: Annotated[Path, typer.Option("--out", help="Table, plot, state (resumes) and per-candidate "
                                              "logs.")] = Path("tune-results"),
        launch: Annotated[str, typer.Option(help="up: each candidate through the compose bring-up; local: the "
                                            "engine process on this machine (no Docker).")] = "up",
        sets: SetOption = None,
        tries: Annotated[list[str] | None, typer.Option("--try", metavar="AXIS=V1,V2", help="Vary only these "
                                                        "axes, over these values (default: the engine's axes "
                                                        "with coarse values); `default` removes the flag, `off` "
                                                        "turns speculation off.")] = None,
        rates: Annotated[str, typer.Option(help="Request rates each candidate climbs, per second.")] = "1,2,4,8,16,32,64",
        num_prompts: Annotated[int, typer.Option(min=1, help="Requests per rate.")] = 64,
        max_concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight at most.")] = 256,
        repeats: Annotated[int, typer.Option(min=1, help="Recorded runs per rate (the median is used).")] = 1,
        warmup: Annotated[int, typer.Option(min=0, help="The bench's warm-up before each rate: unrecorded requests "
                                            "per concurrency slot.")] = 1,
        max_candidates: Annotated[int | None, typer.Option(min=1, help="Start at most this many engines.")] = None,
        start_timeout: Annotated[float, typer.Option(min=1, help="Seconds an engine may take to be healthy.")] = 900.0,
        name: Annotated[str | None, typer.Option(help="Name of the winner's operator profile (default "
                                                 "PROFILE-tuned).")] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="List the candidates the search starts from, "
                                              "with their flags and the planner's word; start nothing.")] = False,
    ) -> None:
        """Find the engine flags with the highest goodput under a latency SLO: candidates from the planner,
        each started and loaded at rising request rates; a table, a Pareto plot and the winner as a profile.
        A run with the same --out resumes: candidates measured before are not measured again.

        Exit status: 0 a winner, 1 no candidate met the SLO, 2 bad input."""
        if slo is None and not dry_run:
            raise UserError("--slo is required: e.g. --slo 'ttft_p99:500 tpot_p99:50' (or --dry-run to list the "
                            "candidates)")
        # Every option is checked, --dry-run or not.
        target = parse_slo(slo) if slo is not None else None
        load = parse_workload(workload, dataset_path)
        budget_s = parse_budget(budget)
        levels = parse_rates(rates)
        if launch not in LAUNCHES:
            raise UserError(f"--launch {launch!r}: choose local or up")
        overrides = parse_sets(sets)
        base = load_profile(profile, overrides)
        # The winner's file name: checked now, not after an hour of measuring.
        winner_name = check_new_name(name if name is not None else f"{base.name}-tuned", "--name")
        axes = axes_for(base, parse_tries(tries))
        if dry_run or target is None:
            list_candidates(base, axes)
            return
        plan = LoadPlan(target, load, levels, num_prompts, max_concurrency, repeats, warmup,
                        level_timeout_s=max(300.0, start_timeout))
        if launch == "local":
            check_engine_importable(base)
        launcher = local_launcher(start_timeout) if launch == "local" else compose_launcher(start_timeout)
        question = {"profile": profile, "set": overrides, "slo": target.text(), "workload": load.text(),
                    "rates": rates, "num_prompts": num_prompts, "max_concurrency": max_concurrency,
                    "repeats": repeats, "launch": launch}
        command = shlex.join(["ornith-stack", "tune", *sys.argv[2:]]) if sys.argv[1:2] == ["tune"] else \
            f"ornith-stack tune {profile} --slo {shlex.quote(target.text())}"
        with output_dir(out_dir), stop_on_sigterm():
            state = load_state(out_dir, question, [axis.name for axis in axes])
            outcome = tune(base, axes, plan, launcher, state, out_dir, Limits(budget_s, max_candidates),
                           lambda line: err.print(line, markup=False))
        (out_dir / "tune.json").write_text(json.dumps({"question": question, **result_json(outcome)}, indent=1))
        report = table(outcome.records, target, outcome.winner)
        (out_dir / "tune.md").write_text(report)
        chart = plot(outcome.records, target, outcome.winner, out_dir / "pareto.png")
        out.print(report, markup=False)
        out.print(f"engines started by this run: {outcome.measured_now}; table {out_dir / 'tune.md'}, plot {chart}",
                  markup=False)
        if outcome.winner is None:
            closest = outcome.closest
            why = (f"closest: {closest.name}, {closest.closest_miss:.0%} over the SLO at its lowest rate"
                   if closest else "no candidate was measured")
            err.print(f"no candidate met the SLO ({target.text()} ms); {why}", markup=False)
            raise typer.Exit(1)
        winner = next(c for c in outcome.records if c.key == outcome.winner.key)
        tuned = build(base, axes, winner.settings).profile
        for path in write_winner(tuned, winner, winner_name, command, target):
            out.print(f"wrote {path}", markup=False)
        out.print(f"winner: {winner.name}: {winner.goodput_tok_s:,.1f} output tok/s under the SLO", markup=False)
        for axis in (a for a in axes if a.speculative):
            out.print(speculation_note(outcome.records, axis.name, axis.current(base), winner), markup=False)
        for line in start_commands(winner_name):
            out.print(f"start it: {line}", markup=False)


def list_candidates(base: Profile, axes: tuple[Axis, ...]) -> None:
    """`tune --dry-run`: each distinct candidate the search starts from, its flags and the planner's word."""
    listed = outline(base, axes)
    out.print(f"{len(listed)} candidates for {base.name} (axes: {', '.join(f'{a.name} on --{a.flag}' for a in axes)});"
              " nothing started", markup=False)
    for candidate in listed:
        verdict = planner_verdict(candidate)
        word = "plan" if verdict.fits else "refused by the planner"
        out.print(f"{candidate.name}: {flag_changes(base, candidate)}\n  {word}: {verdict.why}", markup=False)
