"""Measuring one candidate: start its engine the way the user runs it, warm it, then climb request rates.

Two launchers yield a healthy engine and always stop it: `local_engine` starts the engine process from the
profile's launch args (a GPU machine without Docker, the CPU demo), `compose_engine` brings the candidate up
as an operator profile with the project's compose bring-up. The load itself is `ornith-stack bench --suite
serving`, run through its command line and read back from its bench.json (`bench_level`, the one place that
knows the bench's options and result fields), so the bench can change inside without the tuner noticing.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ornith_stack.engines import adapter_for, launch_args
from ornith_stack.engines.base import SpecCounters, acceptance_length
from ornith_stack.errors import UserError
from ornith_stack.profiles.model import Profile
from ornith_stack.tune.spec import Slo, Workload
from ornith_stack.tune.state import LevelResult
from ornith_stack.wire.http import ERROR_BYTES, METRICS_BYTES, WireError, fetch
from ornith_stack.wire.metrics import BadExposition, parse

LOG_TAIL_LINES = 30
STOP_GRACE_S = 20.0
KILL_WAIT_S = 120.0
POLL_S = 1.0


class EngineCrash(Exception):
    """The engine exited, refused its flags or never became healthy; the message carries the log tail."""

    def __init__(self, reason: str, log_tail: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail


@dataclass(frozen=True)
class Engine:
    """A healthy engine: where it answers, the model name it serves, and how to tell it is still alive."""

    base_url: str
    model: str
    profile: Profile
    alive: Callable[[], bool]
    log_tail: Callable[[], str]
    log: Callable[[], str] = str  # the engine's whole log so far (its sizing lines come early)


Launcher = Callable[[Profile, Path], contextlib.AbstractContextManager[Engine]]


@dataclass(frozen=True)
class LoadPlan:
    """How each candidate is loaded: the rates it climbs and the requests of each level."""

    slo: Slo
    workload: Workload
    rates: tuple[float, ...]
    num_prompts: int = 64
    max_concurrency: int = 256
    repeats: int = 1
    warmup: int = 1  # the bench's --warmup: unrecorded requests per concurrency slot before each level
    level_timeout_s: float = 900.0


@dataclass(frozen=True)
class Measured:
    levels: tuple[LevelResult, ...]
    acceptance_length: float | None  # the engine's, over every level (None: no speculation)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, errors="replace") as fh:
            return "".join(deque(fh, maxlen=lines)).rstrip("\n")
    except OSError:
        return ""


def local_launcher(start_timeout_s: float) -> Launcher:
    """Start the engine process on this machine from the candidate's launch args, on a free loopback port."""

    @contextlib.contextmanager
    def launch(profile: Profile, workdir: Path) -> Iterator[Engine]:
        port = free_port()
        argv = launch_args(profile, host="127.0.0.1", port=port)
        argv[0] = sys.executable  # launch_args says python3: run the interpreter that has the engine
        log_path = workdir / "engine.log"
        (workdir / "command.txt").write_text(" ".join(argv) + "\n")
        with open(log_path, "wb") as log:
            # A session of its own: the engine's workers are its process group, stopped with it.
            proc = subprocess.Popen(argv, env={**os.environ, **profile.serve.env}, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                base = f"http://127.0.0.1:{port}"
                alive = lambda: proc.poll() is None  # noqa: E731
                wait_healthy(profile, base, alive, lambda: tail(log_path), start_timeout_s)
                yield Engine(base, profile.serve.served_name or str(profile.model.repo), profile, alive,
                             lambda: tail(log_path), lambda: log_path.read_text(errors="replace"))
            finally:
                stop_group(proc)

    return launch


def wait_healthy(profile: Profile, base: str, alive: Callable[[], bool], log_tail: Callable[[], str],
                 timeout_s: float) -> None:
    adapter = adapter_for(profile)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise EngineCrash("the engine exited before it was healthy", log_tail())
        if all(_answers(base + path) for path in (adapter.health_path, adapter.models_path)):
            return
        time.sleep(POLL_S)
    raise EngineCrash(f"the engine was not healthy after {timeout_s:.0f} s", log_tail())


def _answers(url: str) -> bool:
    try:
        return fetch(url, 5.0, limit=ERROR_BYTES, cut=True).status == 200
    except WireError:
        return False


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the engine's process group, SIGKILL what is left of it after the grace period, and return
    only once the whole group is gone: vLLM's EngineCore outlives its API server by seconds, still writing
    the candidate's log and, on a GPU, holding the memory the next candidate needs."""
    pgid = proc.pid  # the group's id is its leader's pid, and names the workers after the leader is gone
    deadline = time.monotonic() + grace_s
    _signal_group(pgid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)
    if _group_gone(pgid, deadline):
        return
    _signal_group(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_WAIT_S)
    _group_gone(pgid, time.monotonic() + KILL_WAIT_S)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _group_gone(pgid: int, deadline: float) -> bool:
    """Whether no process of the group is left by the deadline (signal 0 tests for one without sending)."""
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def bench_levels(engine: Engine, plan: LoadPlan, out: Path) -> list[dict[str, Any]]:
    """Every rate of the plan in one `ornith-stack bench --suite serving` call (the bench warms each level up
    itself); per level, from bench.json: the median over its recorded runs of output tok/s, p99 and median
    TTFT and p99 TPOT, and its failed requests. One call, not one per rate: a process start of the bench
    costs seconds on a loaded machine, and the high rates, past the first that misses, take the least time."""
    rates = ",".join("inf" if math.isinf(rate) else f"{rate:g}" for rate in plan.rates)
    args = ["--request-rate", rates, "--max-concurrency", str(plan.max_concurrency),
            "--num-prompts", str(plan.num_prompts), "--repeats", str(plan.repeats), "--warmup", str(plan.warmup),
            "--goodput", f"ttft:{plan.slo.ttft_p99_ms:g} tpot:{plan.slo.tpot_p99_ms:g}", *plan.workload.bench_args()]
    levels = serving_runs(engine, args, out, plan.level_timeout_s * len(plan.rates), len(plan.rates))
    return [_figures(runs) for runs in levels]


def serving_runs(engine: Engine, args: list[str], out: Path, timeout_s: float, levels: int) -> list[list[dict[str, Any]]]:
    """`ornith-stack bench --suite serving ARGS` against the engine, through its command line; the recorded
    runs of each of its `levels` levels from its bench.json (the bench's log beside it). EngineCrash when the
    bench wrote fewer levels, with the bench's last line."""
    argv = [sys.executable, "-m", "ornith_stack", "bench", "--url", engine.base_url, "--model", engine.model,
            "--suite", "serving", "--out", str(out), *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    (out / "bench.log").write_text(done.stdout + done.stderr)
    try:
        found = [list(level["runs"]) for level in json.loads((out / "bench.json").read_text())["suites"]["serving"]["levels"]]
    except (OSError, ValueError, KeyError, TypeError):
        found = []
    if len(found) != levels:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise EngineCrash(f"the bench wrote no serving result for every level: {last[0]}", engine.log_tail())
    return found


def _figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def median(read: Callable[[dict[str, Any]], Any]) -> float | None:
        values = [v for v in (read(r) for r in runs) if isinstance(v, (int, float))]
        return statistics.median(values) if values else None

    return {
        "output_tok_s": median(lambda r: r.get("output_tok_s")),
        "ttft_p99_ms": median(lambda r: r.get("ttft_ms", {}).get("p99")),
        "ttft_median_ms": median(lambda r: r.get("ttft_ms", {}).get("median")),
        "tpot_p99_ms": median(lambda r: r.get("tpot_ms", {}).get("p99")),
        "failed": int(sum(r.get("failed", 0) for r in runs)),
    }


def spec_counters(engine: Engine) -> SpecCounters | None:
    """The engine's speculative counters now (None: it does not speculate, or /metrics did not answer)."""
    adapter = adapter_for(engine.profile)
    try:
        text = fetch(engine.base_url + adapter.metrics_path, 10.0, limit=METRICS_BYTES).text
        return adapter.spec_counters(parse(text))
    except (WireError, BadExposition):
        return None


def measure(engine: Engine, plan: LoadPlan, workdir: Path, say: Callable[[str], None]) -> Measured:
    """The rising rates on a healthy engine; each level against the SLO; the acceptance length over them."""
    before = spec_counters(engine)
    figures = bench_levels(engine, plan, fresh_dir(workdir / "bench"))
    after = spec_counters(engine)
    if not engine.alive():
        raise EngineCrash("the engine exited while it was loaded", engine.log_tail())
    levels = []
    for rate, level in zip(plan.rates, figures, strict=True):
        miss = plan.slo.misses(level["ttft_p99_ms"], level["tpot_p99_ms"])
        levels.append(LevelResult(rate=rate, **level, miss=miss, meets=miss == 0 and level["failed"] == 0))
        say(_level_line(levels[-1]))
    return Measured(tuple(levels), acceptance_length(before, after) if after else None)


def _level_line(level: LevelResult) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f} ms"

    verdict = "meets the SLO" if level.meets else (f"misses ({level.failed} failed)" if level.failed else
                                                     f"misses by {level.miss:.0%}")
    return (f"  rate {level.rate:g}{'' if math.isinf(level.rate) else '/s'}: {level.output_tok_s or 0:,.1f} tok/s, p99 TTFT {ms(level.ttft_p99_ms)}, "
            f"p99 TPOT {ms(level.tpot_p99_ms)}: {verdict}")


def fresh_dir(path: Path) -> Path:
    """The bench's folder, emptied of an interrupted run's results (never read as this run's)."""
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("bench.*"):
        old.unlink()
    return path


def check_engine_importable(profile: Profile) -> None:
    """One error line before any candidate starts, when the engine is not installed for a local launch."""
    from importlib.util import find_spec

    package = adapter_for(profile).module.split(".")[0]
    if find_spec(package) is None:
        raise UserError(f"--launch local: {package} is not installed in {sys.prefix}; install the engine there "
                        "or use --launch up")
