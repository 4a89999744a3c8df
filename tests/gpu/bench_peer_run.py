"""GPU recording for issue 32: `ornith-stack bench --suite serving` beside SGLang's own `python3 -m sglang.bench_serving`
on one SGLang engine (the gpu96 profile's launch args without --max-total-tokens / --max-running-requests, as
sglang_run.py's `uncapped` variant; tiny model + DFlash draft), with the SAME prompts, alternated A B B A (ours,
theirs, theirs, ours) at concurrency 1, 8, 32, 128 and 256, so a drift of the engine (warm-up, a batch size
compiled on first use) weighs on both alike.

The prompts: PROMPTS_PER_LEVEL[c] prompts of INPUT_TOKENS tokens each (the target's tokenizer: seeded filler words
cut at INPUT_TOKENS tokens), OUTPUT_TOKENS out with ignore_eos, greedy. One file per level in two formats holding the
same texts: `ours-C.jsonl` (vllm bench serve's custom dataset: `prompt`, `output_tokens`) and `sglang-C.json`
(ShareGPT's `conversations`, which bench_serving's sharegpt dataset reads; it shuffles them, so the same set goes out
in another order; --sharegpt-output-len fixes the output length). Both send them as the user message of a chat
request (ours: /v1/chat/completions; theirs: --backend sglang-oai-chat), the engine applies the chat template for both.
Each run: the prefix cache emptied first (ours: itself, before each recorded run; theirs: POST /flush_cache), then
warm-up (ours: one full round of c requests, --warmup 1; theirs: --warmup-requests c), then the recorded run.

Writes to OUT: engine.log, health.txt, launch.json, prompts, every run's output (ours-C-N/ with bench.json and
bench.md; sglang-C-N.jsonl), each tool's log (ours-driver.log, theirs-driver.log), each run's CPU seconds in its
tool's process, the engine's own mean TTFT over each run (its /metrics before and after) beside the tool's, the GPU's
SM clock, power and utilization every 500 ms (gpu.csv), summary.json and table.md: per level and figure, each tool's
median, its spread, ours / theirs of the medians, and the ratios of the runs that ran next to each other (A B B A:
the k-th run of one tool beside the k-th of the other), their median, range and the 90% bootstrap interval of that
median.

    python3 tests/gpu/bench_peer_run.py OUT --target MODELS/target --draft MODELS/draft

Levels are split over device calls (`--levels 1,8,32 --rounds 2`, then the same levels in another order), each call
at most 10 minutes; the compile caches live under ORNITH_GPU_WORK, so a later call's engine starts warm. `--rounds
R` repeats the A B B A order R times. Before the first level, one discarded run of each tool at concurrency 8 (the
engine's first traffic after start ran 50% faster than every later run in the first recording).

Both tools run in a long-lived process each (`--driver ours|theirs`, one argv per line on stdin): ours through the
CLI's own entry point (`ornith_stack.cli.main`, what the `ornith-stack` command runs), bench_serving through its own
parser (`cli_main`) and `run_benchmark`. Neither pays its start (imports, torch, the tokenizer: 5 s for ours, 25 s
for bench_serving) between runs, so more pairs fit in a call, and both tools run alike: in the second recording ours
started a process per run and bench_serving did not.

`--record-canary` (issue 33): after the levels, the exporter with `--canary` beside the engine for a few canary runs;
the engine's and the exporter's /metrics and the exporter's log go to OUT/canary/ (aborted requests: abort_run.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import resource
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from ornith_stack.engines.sglang.metrics import NAMES as SGLANG_METRICS

sys.path.insert(0, str(Path(__file__).parent))
import sglang_run  # noqa: E402

LEVELS = (1, 8, 32, 128, 256)
# Prompts per run at each concurrency: runs of a few seconds each on the H200 (the tiny model decodes about 400
# tok/s alone and 5,000-7,500 tok/s at 32-128 streams, issue 32), at least three rounds of c from 32 up.
# Longer than the first recording's (16/64/128/384/768 prompts: runs of 5-15 s whose spreads were 9-27%).
PROMPTS_PER_LEVEL = {1: 24, 8: 128, 32: 384, 128: 768, 256: 1280}
INPUT_TOKENS, OUTPUT_TOKENS = 256, 128
ORDER = ("ours", "theirs", "theirs", "ours")
PRIMING_PROMPTS = 32
# (ours: a key path in a run of bench.json's serving level; theirs: bench_serving's result key)
FIGURES = {
    "output tok/s": (("output_tok_s",), "output_throughput"),
    "median TTFT ms": (("ttft_ms", "median"), "median_ttft_ms"),
    "mean TTFT ms": (("ttft_ms", "mean"), "mean_ttft_ms"),
    "median TPOT ms": (("tpot_ms", "median"), "median_tpot_ms"),
    "median ITL ms": (("itl_ms", "median"), "median_itl_ms"),
    "median E2E ms": (("e2el_ms", "median"), "median_e2e_latency_ms"),
}
# The engine's own view of the same run (its /metrics before and after; warm-up requests included, alike for
# both tools): its mean TTFT counts from the request's arrival in its tokenizer manager, so a client's mean TTFT
# above it is that client's own overhead and the loopback; `client - engine` is that gap per run.
ENGINE_TTFT = SGLANG_METRICS.ttft
ENGINE_FIGURES = ("engine mean TTFT ms", "client - engine mean TTFT ms")


def write_prompts(out: Path, tokenizer_path: str) -> None:
    from transformers import AutoTokenizer

    from ornith_stack.bench.prompts import filler

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    seeds = random.Random(0)
    texts = []
    for _ in range(max(PROMPTS_PER_LEVEL.values())):
        ids = tokenizer(filler(INPUT_TOKENS * 2, seed=seeds.randrange(1 << 30)), add_special_tokens=False).input_ids
        texts.append(tokenizer.decode(ids[:INPUT_TOKENS]))
    for level, n in PROMPTS_PER_LEVEL.items():
        (out / f"ours-{level}.jsonl").write_text(
            "".join(json.dumps({"prompt": t, "output_tokens": OUTPUT_TOKENS}) + "\n" for t in texts[:n])
        )
        (out / f"sglang-{level}.json").write_text(
            json.dumps(
                [
                    {"id": str(i), "conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "ok"}]}
                    for i, t in enumerate(texts[:n])
                ]
            )
        )


def ours(driver: Driver, base: str, out: Path, level: int, n: int | str, prompts: int | None = None) -> dict:
    run = out / f"ours-{level}-{n}"
    argv = ["bench", "--url", base, "--suite", "serving", "--out", str(run),
            "--dataset-path", str(out / f"ours-{level}.jsonl"), "--num-prompts", str(prompts or PROMPTS_PER_LEVEL[level]),
            "--max-concurrency", str(level), "--random-output-len", str(OUTPUT_TOKENS), "--repeats", "1",
            "--warmup", "1", "--seed", "0"]  # fmt: skip
    done = driver.run(argv)
    figures: dict = {"rc": done["rc"], "wall_s": done["wall_s"], "process_cpu_s": done["cpu_s"]}
    try:
        level_result = json.loads((run / "bench.json").read_text())["suites"]["serving"]["levels"][0]
        metrics = level_result["runs"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return figures
    for name, (path, _) in FIGURES.items():
        value = metrics
        for key in path:
            value = value[key]
        figures[name] = value
    figures["client_cpu_s_per_1k_tokens"] = metrics.get("client_cpu_s_per_1k_tokens")
    figures["failed"] = metrics["failed"]
    return figures


class Driver:
    """One long-lived `python3 bench_peer_run.py --driver KIND OUT` process per tool: the tool imported once,
    one run per argv line on its stdin, one JSON answer line (exit status, wall and CPU seconds) on its stdout."""

    def __init__(self, out: Path, kind: str, options: tuple[str, ...] = ()) -> None:
        self.log = open(out / f"{kind}-driver.log", "ab")  # noqa: SIM115 (closed in close)
        self.proc = subprocess.Popen([sys.executable, __file__, "--driver", kind, *options, str(out)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)  # fmt: skip

    def run(self, argv: list[str]) -> dict:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"rc": -1, "cpu_s": None, "wall_s": None}

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:  # stopped mid-run (the call's time ran out)
            self.proc.kill()
        self.log.close()


def _bench_serving() -> Callable[[list[str]], int]:
    """SGLang's bench_serving: its own parser (`cli_main`) makes the arguments, its own `run_benchmark` measures."""
    from sglang.benchmark import serving

    real_run, captured = serving.run_benchmark, []

    def run(argv: list[str]) -> int:
        try:
            serving.run_benchmark = captured.append
            sys.argv = ["bench_serving", *argv]
            serving.cli_main()
        finally:
            serving.run_benchmark = real_run
        real_run(captured.pop())
        return 0

    return run


def _ornith_bench() -> Callable[[list[str]], int]:
    """`ornith-stack ARGV` through the CLI's own entry point, as the installed command runs it."""
    from ornith_stack.cli import main as cli

    return cli


def engine_ttft(base: str) -> tuple[float, float] | None:
    """The engine's TTFT histogram so far: (sum of seconds, count), or None where /metrics did not answer it."""
    from ornith_stack.wire.metrics import BadExposition, parse

    try:
        code, body = sglang_run._get(f"{base}/metrics")
        samples = parse(body.decode(), keep=(f"{ENGINE_TTFT}_sum", f"{ENGINE_TTFT}_count"))
    except (OSError, BadExposition):
        return None
    total, count = samples.total(f"{ENGINE_TTFT}_sum"), samples.total(f"{ENGINE_TTFT}_count")
    return None if code != 200 or total is None or count is None else (total, count)


def engine_figures(before: tuple[float, float] | None, after: tuple[float, float] | None, figures: dict) -> dict:
    """The engine's mean TTFT over one run (and its warm-up) beside the client's mean TTFT of that run."""
    if before is None or after is None or after[1] <= before[1]:
        return {}
    engine_ms = 1000 * (after[0] - before[0]) / (after[1] - before[1])
    client_ms = figures.get("mean TTFT ms")
    return {"engine mean TTFT ms": engine_ms, "engine requests": after[1] - before[1],
            "client - engine mean TTFT ms": None if client_ms is None else client_ms - engine_ms}  # fmt: skip


def gpu_sampler(out: Path) -> subprocess.Popen | None:
    """nvidia-smi's SM clock, power and utilization every 500 ms into OUT/gpu.csv (each run prints its start and
    end, so a slow run can be set beside the GPU's clock then); None where nvidia-smi is missing."""
    try:
        return subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu",
                                 "--format=csv", "-i", "0", "-lms", "500", "-f", str(out / "gpu.csv")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    except OSError:
        return None


def _connection_per_request() -> None:
    """Ours opening a new connection for every request, as bench_serving does (a new aiohttp session per request),
    instead of keeping a pool as `vllm bench serve` and OpenAI clients do. Call F tried it as the cause of our lower
    TTFT at 32 streams in the third recording: the gap stayed (bench-peer/README.md)."""
    import aiohttp

    pooled = aiohttp.TCPConnector
    aiohttp.TCPConnector = functools.partial(pooled, force_close=True)  # type: ignore[misc]


def driver_loop(kind: str, connection_per_request: bool = False) -> None:
    """Run the tool once per argv line on stdin; answer one JSON line (exit status, wall and CPU seconds)."""
    # The tools print on standard output: that goes to the log (fd 2); the answers go to the pipe the
    # recording reads, kept as its own descriptor.
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    if connection_per_request:
        _connection_per_request()
    tool = _ornith_bench() if kind == "ours" else _bench_serving()
    for line in sys.stdin:
        argv = json.loads(line)
        print(f"--- run: {' '.join(argv)}", flush=True)
        usage, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        try:
            rc = tool(argv)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 (the recording notes a failed run and goes on)
            print(f"run failed: {exc!r}", file=sys.stderr, flush=True)
            rc = 1
        after = resource.getrusage(resource.RUSAGE_SELF)
        cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
        sys.stdout.flush()
        reply.write(json.dumps({"rc": rc, "wall_s": round(time.monotonic() - t0, 1), "cpu_s": round(cpu, 2)}) + "\n")


def theirs(
    driver: Driver,
    base: str,
    model: str,
    tokenizer: str,
    out: Path,
    level: int,
    n: int | str,
    prompts: int | None = None,
) -> dict:
    result = out / f"sglang-{level}-{n}.jsonl"
    prompts = prompts or PROMPTS_PER_LEVEL[level]
    argv = ["--backend", "sglang-oai-chat", "--base-url", base, "--model", model, "--tokenizer", tokenizer,
            "--dataset-name", "sharegpt", "--dataset-path", str(out / f"sglang-{level}.json"),
            "--num-prompts", str(prompts), "--sharegpt-output-len", str(OUTPUT_TOKENS),
            "--max-concurrency", str(level), "--request-rate", "inf", "--warmup-requests", str(level), "--seed", "0",
            "--disable-tqdm", "--output-file", str(result)]  # fmt: skip
    # The prefix cache emptied here rather than by bench_serving's own flag, which not every version has.
    try:
        urllib.request.urlopen(urllib.request.Request(f"{base}/flush_cache", method="POST"), timeout=30).close()
    except OSError as exc:  # the run goes on; its log says the cache was not emptied
        (out / f"sglang-{level}-{n}.flush.txt").write_text(repr(exc))
    done = driver.run(argv)
    figures: dict = {"rc": done["rc"], "wall_s": done["wall_s"], "process_cpu_s": done["cpu_s"]}
    try:
        row = json.loads(result.read_text().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return figures
    for name, (_, key) in FIGURES.items():
        figures[name] = row.get(key)
    figures["failed"] = row.get("completed") is not None and row["completed"] != prompts
    return figures


def _spread(values: list[float]) -> float | None:
    """(max - min) / median of one tool's runs: what a single run of it could read either way."""
    return (max(values) - min(values)) / statistics.median(values) if values and statistics.median(values) else None


def _pairs(ours_runs: list[float], theirs_runs: list[float]) -> list[float]:
    """ours / theirs of the runs next to each other in time: in A B B A blocks the k-th run of one tool ran
    beside the k-th of the other, so a drift of the engine slower than one run weighs on both sides of a pair."""
    return [a / b for a, b in zip(ours_runs, theirs_runs, strict=False) if b]


def _interval(pairs: list[float], draws: int = 5000) -> tuple[float, float] | None:
    """The 90% bootstrap interval of the pairs' median (seeded: the same table from the same logs): where the
    tools' true ratio lies given how much the engine moved between pairs."""
    if len(pairs) < 3:
        return None
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(pairs, k=len(pairs))) for _ in range(draws))
    return medians[int(0.05 * draws)], medians[int(0.95 * draws) - 1]


def table(runs: dict[int, dict[str, list[dict]]]) -> tuple[str, dict]:
    lines = [
        "| concurrency | figure | ours: median of runs (n) | spread | bench_serving: median (n) | spread "
        "| ours / theirs, medians | adjacent pairs: median ratio [min-max] | 90% interval of the pairs' median |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    summary: dict = {}
    for level, sides in runs.items():
        for name in (*FIGURES, *ENGINE_FIGURES):
            a = [r[name] for r in sides["ours"] if r.get(name) is not None]
            b = [r[name] for r in sides["theirs"] if r.get(name) is not None]
            if not (a or b):  # a figure this recording did not take (the engine's were added in call G)
                continue
            ratio = statistics.median(a) / statistics.median(b) if a and b and statistics.median(b) else None
            pairs = _pairs(a, b)
            interval = _interval(pairs)
            sa, sb = _spread(a), _spread(b)
            summary.setdefault(str(level), {})[name] = {
                "ours": a,
                "theirs": b,
                "ours_spread": sa,
                "theirs_spread": sb,
                "ratio": ratio,
                "pair_ratios": pairs,
                "pair_median": statistics.median(pairs) if pairs else None,
                "pair_median_interval_90": interval,
            }
            lines.append(
                f"| {level} | {name} | {_median(a)} ({len(a)}) | {_pct(sa)} | {_median(b)} ({len(b)}) | {_pct(sb)} | "
                f"{'' if ratio is None else f'{ratio:.3f}'} | "
                + (f"{statistics.median(pairs):.3f} [{min(pairs):.3f}-{max(pairs):.3f}]" if pairs else "")
                + " | "
                + (f"{interval[0]:.3f}-{interval[1]:.3f}" if interval else "")
                + " |"
            )
        cpu = [r.get("client_cpu_s_per_1k_tokens") for r in sides["ours"]]
        summary[str(level)]["ours client CPU s per 1k tokens"] = cpu
        summary[str(level)]["process CPU s"] = {side: [r["process_cpu_s"] for r in sides[side]] for side in sides}
    return "\n".join(lines) + "\n", summary


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):,.2f}" if values else ""


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


RUN_LINE = re.compile(r"^\[\s*\d+ s\] concurrency (\d+) (ours|theirs): (\{.*\})$", re.M)


def write_table(out: Path, runs: dict[int, dict[str, list[dict]]], extra: dict) -> str:
    """table.md and summary.json over the levels measured so far (a run cut short keeps what it measured)."""
    text, summary = table(runs)
    (out / "table.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({**extra, "runs": {str(k): v for k, v in runs.items()},
        "figures": summary, "prompts_per_level": PROMPTS_PER_LEVEL, "input_tokens": INPUT_TOKENS,
        "output_tokens": OUTPUT_TOKENS}, indent=1))  # fmt: skip
    return text


def runs_from_log(log: Path) -> dict[int, dict[str, list[dict]]]:
    """The runs a recording printed (its per-run lines), for a recording that ended before its table."""
    runs: dict[int, dict[str, list[dict]]] = {}
    for level, who, figures in RUN_LINE.findall(log.read_text()):
        runs.setdefault(int(level), {"ours": [], "theirs": []})[who].append(
            {"process_cpu_s": None, **json.loads(figures)}
        )
    return runs


def record_canary(base: str, out: Path) -> None:
    """The exporter with --canary beside the engine for three or four runs (aborted requests: abort_run.py)."""
    rec = out / "canary"
    rec.mkdir(exist_ok=True)
    sglang_run._save(rec / "metrics-before.txt", f"{base}/metrics")
    with open(rec / "exporter.log", "wb") as log:
        exporter = subprocess.Popen([sys.executable, "-m", "ornith_stack", "exporter", "--target", base,
                                     "--listen", "127.0.0.1:9400", "--canary", "--canary-interval", "5"],
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            time.sleep(17)  # three or four canary runs at a 5 s interval
            sglang_run._save(rec / "metrics-after.txt", f"{base}/metrics")
            sglang_run._save(rec / "exporter-metrics.txt", "http://127.0.0.1:9400/metrics")
        finally:
            os.killpg(exporter.pid, signal.SIGTERM)
            exporter.wait(20)
    after = (rec / "metrics-after.txt").read_text()
    print("canary:", [line for line in after.splitlines() if line.startswith("sglang:num_aborted_requests_total")],
          [line for line in (rec / "exporter-metrics.txt").read_text().splitlines()
           if line.startswith(("ornith_canary_success", "ornith_canary_runs_total"))], flush=True)  # fmt: skip


def main() -> None:
    # `timeout` stops this script with SIGTERM: leave through `finally`, so the engine goes with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--health-deadline-s", type=float, default=420)
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)), help="concurrency levels of this call")
    parser.add_argument("--rounds", type=int, default=1, help="times the A B B A order is run per level")
    parser.add_argument("--compile-cache", type=Path, help="folder for every compile cache (kept between calls)")
    parser.add_argument("--record-canary", action="store_true", help="afterwards, the canary and aborted requests")
    parser.add_argument("--realsize", action="store_true",
                        help="--target/--draft are realsize_run.py's real-shape folders: dummy weights, DFlash "
                             "acceptance 6.1 simulated (issue 40)")  # fmt: skip
    parser.add_argument("--driver", choices=("ours", "theirs"), help=argparse.SUPPRESS)
    parser.add_argument("--connection-per-request", action="store_true",
                        help="ours opens a new connection for each request, as bench_serving does")  # fmt: skip
    parser.add_argument(
        "--table-from",
        type=Path,
        nargs="+",
        help="only write table.md and summary.json from recordings' printed runs (their bench-peer-run*.txt)",
    )
    args = parser.parse_args()
    out: Path = args.out
    if args.driver:
        return driver_loop(args.driver, args.connection_per_request)
    if args.table_from:
        runs: dict[int, dict[str, list[dict]]] = {}
        for log in args.table_from:  # a level measured in several calls: their runs together, in call order
            for level, sides in runs_from_log(log).items():
                for who, measured in sides.items():
                    runs.setdefault(level, {"ours": [], "theirs": []})[who] += measured
        print(write_table(out, dict(sorted(runs.items())), {"from": [log.name for log in args.table_from]}))
        return
    if not (args.target and args.draft):
        parser.error("--target and --draft are needed to record")
    levels = [int(v) for v in args.levels.split(",")]
    out.mkdir(parents=True, exist_ok=True)
    cmd, changes = sglang_run.engine_command("gpu96", args.target, args.draft, args.port, "uncapped")
    env = dict(sglang_run.ENV["uncapped"])
    if args.realsize:  # the same engine as realsize_run.py's `compare` uncapped variant, on a GPU-bound engine
        import realsize_run

        target, draft = Path(args.target), Path(args.draft)
        if (target.name, draft.name, args.port) != ("real-target", "real-draft", realsize_run.PORT):
            parser.error(f"--realsize takes realsize_run.py's real-target and real-draft folders, port {realsize_run.PORT}")
        cmd, changes = realsize_run.engine("gpu96", target.parent, "uncapped")
        env.update(realsize_run.acceptance_env(6.1))
    (out / "launch.json").write_text(json.dumps({"cmd": cmd, "changes": changes, "env": env}, indent=1))
    if args.compile_cache:
        from fit_run import cache_env

        env.update(cache_env(args.compile_cache))
    engine = sglang_run.Engine(cmd, out, args.port, env)
    sampler = gpu_sampler(out)
    mode = ("--connection-per-request",) if args.connection_per_request else ()
    drivers = {"ours": Driver(out, "ours", mode), "theirs": Driver(out, "theirs")}
    base = engine.base
    try:
        healthy = engine.wait_healthy(out / "health.txt", args.health_deadline_s)
        print(f"healthy after {healthy:.0f} s", flush=True)
        write_prompts(out, args.target)
        model = json.loads(sglang_run._get(f"{base}/v1/models")[1])["data"][0]["id"]
        started = time.monotonic()
        primed = [ours(drivers["ours"], base, out, 8, "priming", PRIMING_PROMPTS),
                  theirs(drivers["theirs"], base, model, args.target, out, 8, "priming", PRIMING_PROMPTS)]  # fmt: skip
        print(
            f"[{time.monotonic() - started:5.0f} s] priming (discarded): "
            + json.dumps([{k: p.get(k) for k in ("rc", "wall_s", "output tok/s")} for p in primed]),
            flush=True,
        )
        runs = {}
        for level in levels:
            runs[level] = {"ours": [], "theirs": []}
            for n, who in enumerate(ORDER * args.rounds):
                before, t0 = engine_ttft(base), time.time()
                figures = (
                    ours(drivers["ours"], base, out, level, n)
                    if who == "ours"
                    else theirs(drivers["theirs"], base, model, args.target, out, level, n)
                )
                figures.update(
                    engine_figures(before, engine_ttft(base), figures), t0=round(t0, 1), t1=round(time.time(), 1)
                )
                runs[level][who].append(figures)
                print(f"[{time.monotonic() - started:5.0f} s] concurrency {level} {who}: "
                      + json.dumps({k: v for k, v in figures.items() if k in FIGURES or k in ENGINE_FIGURES
                                    or k in ("rc", "wall_s", "process_cpu_s", "engine requests", "t0", "t1")}),
                      flush=True)  # fmt: skip
            text = write_table(
                out, runs, {"healthy_after_s": round(healthy, 1), "measured_s": round(time.monotonic() - started, 1)}
            )
            print(text, flush=True)
        if args.record_canary:
            record_canary(base, out)
    finally:
        for driver in drivers.values():
            driver.close()
        if sampler:
            sampler.terminate()
        engine.stop()


if __name__ == "__main__":
    main()
