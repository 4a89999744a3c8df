"""The load test that counts (issue 43): steady streams through a change window, each failure counted as
before its first token or while streaming, latency percentiles per phase."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from test_bench_client import LoopbackEngine

from ornith_stack.bench.client import EngineClient, RequestSample
from ornith_stack.bench.steady import ChangeWindow, SteadyLoad, report, run_steady
from ornith_stack.errors import UserError


def _event(delta: dict | None = None, usage: dict | None = None) -> bytes:
    event: dict = {"object": "chat.completion.chunk", "choices": []}
    if delta is not None:
        event["choices"] = [{"index": 0, "delta": delta, "finish_reason": None}]
    if usage is not None:
        event["usage"] = usage
    return f"data: {json.dumps(event)}\n\n".encode()


class Body(httpx.AsyncByteStream):
    """Four tokens and the usage; `cut`: the connection drops after two tokens (a killed replica)."""

    def __init__(self, cut: bool) -> None:
        self.cut = cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield _event({"role": "assistant", "content": ""})
        for i in range(4):
            if self.cut and i == 2:
                raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
            yield _event({"content": f"t{i} "})
        yield _event(usage={"prompt_tokens": 9, "completion_tokens": 4})
        yield b"data: [DONE]\n\n"


def test_a_change_window_counts_sent_completed_and_each_kind_of_failure() -> None:
    window = ChangeWindow()
    seen: list[dict] = []
    lock = threading.Lock()

    def handler(request: httpx.Request) -> httpx.Response:
        with lock:
            index = len(seen)
            seen.append(json.loads(request.content))
        if index == 4:
            window.begin()  # the change starts: a replica dies
            return httpx.Response(503, text="no healthy worker")  # refused: before its first token
        if index == 5:
            return httpx.Response(200, stream=Body(cut=True), headers={"content-type": "text/event-stream"})
        if index == 8:
            window.end()
        return httpx.Response(200, stream=Body(cut=False), headers={"content-type": "text/event-stream"})

    client = EngineClient("http://gateway.test", transport=httpx.MockTransport(handler), connections=2)
    try:
        result = run_steady(client, "ornith", SteadyLoad(requests=12, rate=20, max_concurrency=2, max_tokens=4), window)
    finally:
        client.close()
    assert len(seen) == 12
    assert all(b["stream"] and b["max_tokens"] == 4 and b["ignore_eos"] for b in seen)
    total = result.total
    assert (total.sent, total.completed, total.failed_before_first_token, total.failed_streaming) == (12, 10, 1, 1)
    assert sum(p.sent for p in result.phases.values()) == 12
    # Both failures fall in the window; the requests before and after it all completed.
    assert result.phases["during"].failed == 2
    assert result.phases["before"].failed == result.phases["after"].failed == 0
    assert result.phases["before"].completed >= 3 and result.phases["after"].completed >= 2
    assert result.total.ttft_s.n == 10 and result.total.e2e_s.p99 is not None
    assert result.window_s is not None and result.window_s > 0
    text = result.text()
    assert "total     12         10       2  (1 / 1)" in text
    assert "HTTP 503" in text


def test_with_after_s_the_load_stops_sending_that_long_after_the_window_and_counts_only_what_it_sent() -> None:
    window = ChangeWindow()
    seen: list[int] = []
    lock = threading.Lock()

    def handler(request: httpx.Request) -> httpx.Response:
        with lock:
            seen.append(1)
            if len(seen) == 3:
                window.begin()
            if len(seen) == 6:
                window.end()
        return httpx.Response(200, stream=Body(cut=False), headers={"content-type": "text/event-stream"})

    client = EngineClient("http://gateway.test", transport=httpx.MockTransport(handler), connections=2)
    started = time.monotonic()
    try:
        # A bound of 2,000 requests at 20/s would take 100 s; the change ends with the 6th.
        result = run_steady(client, "ornith", SteadyLoad(requests=2000, rate=20, max_concurrency=2, max_tokens=4,
                                                         after_s=0.5), window)
    finally:
        client.close()
    assert time.monotonic() - started < 10
    # About 0.5 s at 20/s after the 6th request: 6 + ~10, each sent one completed, none of the rest counted.
    assert 10 <= result.total.sent == len(seen) == result.total.completed <= 30, result.text()
    assert result.phases["after"].sent > 0 and result.total.failed == 0


@pytest.mark.parametrize("after_s", [-1.0, float("inf")])
def test_a_negative_or_endless_time_after_the_change_is_refused(after_s: float) -> None:
    with pytest.raises(UserError, match="0 or more seconds"):
        SteadyLoad(after_s=after_s)


def test_phases_follow_when_each_request_ran() -> None:
    window = ChangeWindow()
    window.began, window.ended = 100.0, 110.0
    samples = [RequestSample(started_at=90.0, e2e_s=5.0),  # ended before the window: before
               RequestSample(started_at=98.0, e2e_s=5.0),  # in flight when it began: during
               RequestSample(started_at=105.0, e2e_s=1.0, error="HTTP 502: upstream", chunks=0),
               RequestSample(started_at=109.0, e2e_s=4.0, error="connection reset", chunks=3, ttft_s=0.1),
               RequestSample(started_at=110.0, e2e_s=1.0)]  # sent once it ended: after
    result = report(samples, window)
    assert [result.phases[p].sent for p in ("before", "during", "after")] == [1, 3, 1]
    during = result.phases["during"]
    assert (during.completed, during.failed_before_first_token, during.failed_streaming) == (1, 1, 1)
    assert result.errors == {"HTTP 502: upstream": 1, "connection reset": 1}
    assert result.window_s == 10.0


@pytest.mark.parametrize("bad", [{"requests": 0}, {"rate": 0}, {"rate": float("inf")}, {"max_concurrency": 0}])
def test_an_unbounded_or_empty_load_is_refused(bad: dict) -> None:
    with pytest.raises(UserError, match="must be positive"):
        SteadyLoad(**bad)


def test_the_load_command_counts_a_real_server_and_marks_the_window_on_sigusr1(tmp_path: Path) -> None:
    server = LoopbackEngine(["ok", "ok", "500", "ok", "cut", "ok", "ok", "ok"])
    out = tmp_path / "load.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORNITH_")}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "ornith_stack", "load", "--url", server.url, "--requests", "8",
                                 "--rate", "4", "--max-concurrency", "2", "--max-tokens", "4", "--json", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        first = proc.stdout.readline()  # printed once the model is known, just before the first request
        assert "8 streams of 4 tokens" in first and "(loop)" in first
        for _ in range(2):  # begin, then end the change window
            time.sleep(0.5)
            proc.send_signal(signal.SIGUSR1)
        rest, errors = proc.communicate(timeout=120)
    finally:
        server.close()
    assert proc.returncode == 1, errors  # something failed
    report = json.loads(out.read_text())
    total = report["total"]
    assert (total["sent"], total["completed"], total["failed_before_first_token"], total["failed_streaming"]) == (8, 6, 1, 1)
    assert report["window_s"] is not None and 0.2 < report["window_s"] < 5
    assert sum(p["sent"] for p in report["phases"].values()) == 8
    assert "change window:" in rest and "HTTP 500" in rest
