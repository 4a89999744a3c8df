"""`ornith-stack tune`: input parsing, planner-filtered candidates, the search, resume, crashes, the outputs.

The search tests load each candidate with `engine_model`, a rule that says which request rates a set of
flags sustains, so what is asserted is the tuner's own logic (which candidates it starts, which it skips,
what it picks, what a resumed run does); the real engine and the real bench are in
tests/integration/test_tune_cpu_demo.py.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ornith_stack.cli import main
from ornith_stack.errors import UserError
from ornith_stack.profiles import load_profile
from ornith_stack.profiles.model import Profile
from ornith_stack.tune import measure as measure_module
from ornith_stack.tune.candidates import axes_for, build, parse_tries, planner_verdict
from ornith_stack.tune.measure import Engine, LoadPlan, Measured, local_launcher
from ornith_stack.tune.report import plot, speculation_note, table, write_winner
from ornith_stack.tune.run import Limits, tune
from ornith_stack.tune.spec import Slo, Workload, parse_budget, parse_rates, parse_slo, parse_workload
from ornith_stack.tune.state import LevelResult, load_state

SLO = Slo(ttft_p99_ms=500, tpot_p99_ms=50)
PLAN = LoadPlan(SLO, Workload(input_len=64, output_len=32), rates=(1, 2, 4, 8, 16, 32))


# -- input ------------------------------------------------------------------------------------------
def test_slo_parses_both_bounds_in_either_order_and_separator() -> None:
    assert parse_slo("ttft_p99:500 tpot_p99:50") == SLO
    assert parse_slo("tpot_p99:50,ttft_p99:500") == SLO


@pytest.mark.parametrize("text", ["", "ttft_p99:500", "ttft_p99:500 tpot_p99:0", "ttft:500 tpot:50",
                                  "ttft_p99:500 tpot_p99:nan", "ttft_p99:1 ttft_p99:2 tpot_p99:3", "ttft_p99:x tpot_p99:1"])
def test_a_bad_slo_is_refused(text: str) -> None:
    with pytest.raises(UserError, match="--slo"):
        parse_slo(text)


def test_workload_budget_rates_and_tries(tmp_path: Path) -> None:
    assert parse_workload("random:256:128", None) == Workload(input_len=256, output_len=128)
    assert parse_workload(None, None) == Workload(input_len=256, output_len=128)
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    assert parse_workload(None, data).bench_args()[:2] == ["--dataset-path", str(data)]
    for bad in ("random:0:10", "random:10", "sharegpt:1:2", "random:a:b"):
        with pytest.raises(UserError, match="--workload"):
            parse_workload(bad, None)
    with pytest.raises(UserError, match="not both"):
        parse_workload("random:1:2", data)
    assert parse_budget(2.5) == 150.0
    for bad_budget in (0, -1, math.inf, math.nan):
        with pytest.raises(UserError, match="--budget"):
            parse_budget(bad_budget)
    assert parse_rates("1,2,inf") == (1.0, 2.0, math.inf)
    assert parse_tries(["max-num-seqs=4,default", "spec-tokens=off,2"]) == {
        "max-num-seqs": (4, None), "spec-tokens": (0, 2)}
    with pytest.raises(UserError, match="--try"):
        parse_tries(["max-num-seqs"])


@pytest.mark.parametrize("args, said", [
    (["--slo", "ttft_p99:500"], "--slo"),
    (["--slo", "ttft_p99:500 tpot_p99:50", "--workload", "random:1"], "--workload"),
    (["--slo", "ttft_p99:500 tpot_p99:50", "--budget", "0"], "--budget"),
    (["--slo", "ttft_p99:500 tpot_p99:50", "--launch", "ssh"], "--launch"),
    (["--slo", "ttft_p99:500 tpot_p99:50", "--try", "max-running-requests=4"], "--try"),
])
def test_bad_input_is_one_error_line_and_exit_2(args: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "cpu-demo", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and said in lines[0]


# -- candidates -------------------------------------------------------------------------------------
def test_sglang_candidates_are_profile_overrides_and_the_planner_refuses_one_that_cannot_fit() -> None:
    profile = load_profile("gpu96")
    axes = axes_for(profile)
    assert [a.name for a in axes][:2] == ["max-running-requests", "spec-block"]
    # The running axis at `default` removes every cap it moves (issue 41: no separate --max-total-tokens axis).
    defaults = build(profile, axes, {"max-running-requests": None})
    assert "max-running-requests" not in defaults.profile.serve.args
    assert "max-total-tokens" not in defaults.profile.serve.args
    assert planner_verdict(defaults).fits
    refused = build(profile, axes, {"mem-fraction-static": 0.99})
    verdict = planner_verdict(refused)
    assert not verdict.fits and "mem-fraction-static" in verdict.why
    no_spec = build(profile, axes, {"spec-block": 0}).profile
    assert no_spec.draft is None and not any(f.startswith("speculative") for f in no_spec.serve.args)
    assert "--speculative-draft-model-path" not in " ".join(build(profile, axes, {"spec-block": 0}).profile.serve.args)
    assert build(profile, axes, {"spec-block": 8}).profile.serve.args["speculative-dflash-block-size"] == 8


def test_vllm_speculative_depth_is_written_inside_its_config_and_off_removes_it() -> None:
    profile = load_profile("cpu-demo")
    axes = axes_for(profile, parse_tries(["spec-tokens=off,2", "max-num-seqs=4"]))
    assert [a.name for a in axes] == ["max-num-seqs", "spec-tokens"]
    two = build(profile, axes, {"spec-tokens": 2}).profile.serve.args["speculative-config"]
    assert isinstance(two, dict) and two["num_speculative_tokens"] == 2 and two["method"] == "ngram"
    assert "speculative-config" not in build(profile, axes, {"spec-tokens": 0}).profile.serve.args
    assert build(profile, axes, {"max-num-seqs": 4}).profile.serve.args["max-num-seqs"] == 4
    # The seed and a candidate that sets the seed's own value are one candidate.
    assert build(profile, axes, {}).key == build(profile, axes, {"spec-tokens": 4}).key


# -- the search, on a model of an engine --------------------------------------------------------------
def sustained_rate(profile: Profile) -> float:
    """The rule standing in for an engine: more running requests help up to 16, speculation helps."""
    args = profile.serve.args
    seqs = int(args.get("max-num-seqs", 256))  # type: ignore[arg-type]
    spec = args.get("speculative-config")
    depth = spec.get("num_speculative_tokens", 0) if isinstance(spec, dict) else 0
    base = {4: 4.0, 16: 16.0, 64: 8.0, 256: 8.0}.get(seqs, 6.0)
    return base * (1 + int(depth) / 8)


class Lab:
    """A launcher and a load function over `sustained_rate`, counting the engines started."""

    def __init__(self, crash_when: dict[str, object] | None = None, interrupt_at: int | None = None) -> None:
        self.started: list[dict[str, object]] = []
        self.crash_when = crash_when or {}
        self.interrupt_at = interrupt_at

    @contextlib.contextmanager
    def launcher(self, profile: Profile, workdir: Path) -> Iterator[Engine]:
        self.started.append(dict(profile.serve.args))
        if self.interrupt_at is not None and len(self.started) == self.interrupt_at:
            raise KeyboardInterrupt
        if all(profile.serve.args.get(k) == v for k, v in self.crash_when.items()) and self.crash_when:
            raise measure_module.EngineCrash("the engine exited before it was healthy", "torch.OutOfMemoryError")
        yield Engine("http://127.0.0.1:9", "m", profile, lambda: True, lambda: "")

    @staticmethod
    def load(engine: Engine, plan: LoadPlan, workdir: Path, say: object) -> Measured:
        limit = sustained_rate(engine.profile)
        levels = []
        for rate in plan.rates:
            ttft = 500 * rate / limit
            miss = plan.slo.misses(ttft, 20.0)
            levels.append(LevelResult(rate=rate, output_tok_s=rate * 32, ttft_p99_ms=ttft, tpot_p99_ms=20.0,
                                      meets=miss == 0, miss=miss))
            if miss:
                break
        return Measured(tuple(levels), acceptance_length=None)


HOUR = Limits(3600)


def run_lab(lab: Lab, out: Path, tries: list[str], limits: Limits = HOUR) -> tuple[object, list[str]]:
    profile = load_profile("cpu-demo")
    lines: list[str] = []
    out.mkdir(exist_ok=True)
    question = {"q": 1}
    outcome = tune(profile, axes_for(profile, parse_tries(tries)), PLAN, lab.launcher, load_state(out, question), out,
                   limits, lines.append, load=lab.load)
    return outcome, lines


TRIES = ["max-num-seqs=4,16,64,256", "spec-tokens=off,2,4,8"]


def test_the_search_finds_the_best_goodput_without_measuring_the_grid(tmp_path: Path) -> None:
    lab = Lab()
    outcome, lines = run_lab(lab, tmp_path / "out", TRIES)
    winner = outcome.winner  # type: ignore[attr-defined]
    assert winner.settings == {"max-num-seqs": 16, "spec-tokens": 8}
    assert winner.goodput.rate == 32 and winner.goodput_tok_s == 32 * 32
    grid = 5 * 4  # max-num-seqs values (and the default) x depths
    assert len(lab.started) <= grid / 2  # the coarse climb and the fine midpoints, not the grid
    assert len({json.dumps(a, sort_keys=True) for a in lab.started}) == len(lab.started)  # none twice
    assert any("min of budget left" in line for line in lines)


def test_an_interrupted_run_resumes_and_measures_nothing_twice(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = Lab(interrupt_at=3)
    with pytest.raises(KeyboardInterrupt):
        run_lab(first, out, TRIES)
    assert len(load_state(out, {"q": 1}).records) == 2
    second = Lab()
    outcome, lines = run_lab(second, out, TRIES)
    measured_first = {json.dumps(a, sort_keys=True) for a in first.started[:2]}
    assert not measured_first & {json.dumps(a, sort_keys=True) for a in second.started}
    assert sum("measured before" in line for line in lines) == 2
    third = Lab()
    again, _ = run_lab(third, out, TRIES)
    assert third.started == [] and again.winner.key == outcome.winner.key  # type: ignore[attr-defined]


def test_the_budget_stops_the_search_and_a_different_question_starts_afresh(tmp_path: Path) -> None:
    lab = Lab()
    outcome, _ = run_lab(lab, tmp_path / "out", TRIES, Limits(3600, max_candidates=2))
    assert len(lab.started) == 2 and outcome.measured_now == 2  # type: ignore[attr-defined]
    assert load_state(tmp_path / "out", {"q": 2}).records == {}


def test_a_crashing_candidate_is_recorded_with_its_log_tail_and_skipped(tmp_path: Path) -> None:
    lab = Lab(crash_when={"max-num-seqs": 16})
    outcome, lines = run_lab(lab, tmp_path / "out", TRIES)
    crashed = [r for r in outcome.records if r.status == "crashed"]  # type: ignore[attr-defined]
    assert len(crashed) == 1 and "OutOfMemoryError" in crashed[0].log_tail
    assert outcome.winner.settings.get("max-num-seqs") != 16  # type: ignore[attr-defined]
    assert any("crashed" in line for line in lines)
    assert "crashed" in table(outcome.records, SLO, outcome.winner)  # type: ignore[attr-defined]


def test_a_real_engine_process_that_exits_gives_its_log_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = "import sys; print('loading weights'); print('torch.OutOfMemoryError: CUDA out of memory'); sys.exit(1)"
    monkeypatch.setattr(measure_module, "launch_args", lambda profile, host, port: ["python3", "-c", script])
    with pytest.raises(measure_module.EngineCrash) as crash:
        with local_launcher(30)(load_profile("cpu-demo"), tmp_path):
            pass
    assert "exited" in crash.value.reason and "CUDA out of memory" in crash.value.log_tail
    assert sys.executable in (tmp_path / "command.txt").read_text()


def test_the_launcher_returns_only_once_the_engines_workers_are_gone(tmp_path: Path) -> None:
    """vLLM's EngineCore outlives its API server: a worker that shrugs off SIGTERM and keeps writing the
    log must be gone when the candidate ends (on a GPU it holds the memory the next candidate needs)."""
    worker = tmp_path / "worker.pid"
    script = ("import os, signal, subprocess, sys, time\n"
              "code = 'import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
              "while True: print(\"still writing\", flush=True); time.sleep(0.05)'\n"
              f"open({str(worker)!r}, 'w').write(str(subprocess.Popen([sys.executable, '-c', code]).pid))\n"
              "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not worker.exists() or not worker.read_text():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        began = time.monotonic()
        measure_module.stop_group(proc, grace_s=1.0)
        assert time.monotonic() - began < 10
    finally:  # a failing stop must not leave the group behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGTERM
    with pytest.raises(ProcessLookupError):
        os.kill(int(worker.read_text()), 0)  # the worker that ignored SIGTERM was killed, and reaped


def test_no_candidate_meeting_the_slo_names_the_closest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    strict = Slo(ttft_p99_ms=1, tpot_p99_ms=50)
    lab = Lab()
    profile = load_profile("cpu-demo")
    plan = LoadPlan(strict, PLAN.workload, rates=(1, 2))
    outcome = tune(profile, axes_for(profile, parse_tries(["max-num-seqs=4,16"])), plan, lab.launcher,
                   load_state(tmp_path, {}), tmp_path, Limits(3600), lambda _: None, load=lab.load)
    assert outcome.winner is None and outcome.closest is not None
    assert outcome.closest.settings == {"max-num-seqs": 16}  # its TTFT at 1 req/s is the lowest
    assert outcome.closest.closest_miss == pytest.approx(500 / 24 - 1)


# -- outputs ----------------------------------------------------------------------------------------
def test_table_plot_and_winner_profile_are_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outcome, _ = run_lab(Lab(), tmp_path / "out", TRIES)
    winner = outcome.winner  # type: ignore[attr-defined]
    text = table(outcome.records, SLO, winner)  # type: ignore[attr-defined]
    row = next(line for line in text.splitlines() if "(winner)" in line)
    assert "1,024.0" in row and "| 32 |" in row
    note = speculation_note(outcome.records, "spec-tokens", 4, winner)  # type: ignore[attr-defined]
    assert note.startswith("speculative depth changed the winner: spec-tokens=8 gives 1,024.0 tok/s against 512.0")
    png = plot(outcome.records, SLO, winner, tmp_path / "pareto.png")  # type: ignore[attr-defined]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(profiles))
    monkeypatch.chdir(tmp_path)  # no checkout here: the deployment files go beside the profile
    base = load_profile("cpu-demo")
    tuned = build(base, axes_for(base, parse_tries(TRIES)), winner.settings).profile
    paths = write_winner(tuned, winner, "demo-tuned", "ornith-stack tune cpu-demo", SLO)
    loaded = load_profile("demo-tuned")
    assert loaded.serve.args["max-num-seqs"] == 16
    assert loaded.serve.args["speculative-config"]["num_speculative_tokens"] == 8  # type: ignore[index]
    assert json.loads((profiles / "demo-tuned.tune.json").read_text())["winner"]["name"] == winner.name
    assert (profiles / "demo-tuned" / "compose" / "demo-tuned.yml").is_file() and len(paths) == 5
    with pytest.raises(UserError, match="shipped"):
        write_winner(tuned, winner, "cpu-demo", "x", SLO)
