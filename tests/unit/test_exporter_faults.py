"""The exporter process under three concurrent scrapers beside hostile targets on loopback.

Good targets serve the recorded SGLang 0.5.17 and vLLM 0.24.0 /metrics (tests/fixtures/engines/); the
hostile ones trickle their body (Connection: close and HTTP/1.0 framing), trickle their headers, close or
stall short of their Content-Length, end mid-line, or expose every family twice (tests/hostile.py).
"""

from __future__ import annotations

import os
import re
import resource
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from fake_engine import FakeEngine
from hostile import GOOD, RawTarget, fault_load, good, proc_status, samples, scrape_exporter, start_exporter
from ports import free_port

from ornith_stack.exporter.httpd import Limits
from ornith_stack.exporter.scrape import Target
from ornith_stack.exporter.server import Settings, serve

SCRAPE_TIMEOUT_S = 2.0  # Prometheus' scrape timeout, sent in its header
SECONDS = 15
SCRAPE_DEADLINE_S = 5.0  # for the many-scrapers test: room for a 1.5 s target on a loaded 2-core machine


def test_hostile_targets_never_take_the_good_ones_down_and_every_scrape_keeps_its_deadline() -> None:
    report = fault_load(free_port(), SECONDS, scrapers=3, scrape_timeout=SCRAPE_TIMEOUT_S)
    took = [a.took for a in report.answers]
    print(f"{len(took)} answers in {SECONDS} s, slowest {max(took):.2f} s; threads max {max(report.threads)}, "
          f"RSS max {max(report.rss_kib) / 1024:.1f} MiB")
    assert not report.failures
    assert len(took) >= 3 * SECONDS / SCRAPE_TIMEOUT_S  # every scraper got an answer each deadline or sooner
    assert max(took) < SCRAPE_TIMEOUT_S
    for answer in report.answers:
        for url, kind in report.targets.items():
            assert answer.up[url] == (1.0 if kind.startswith("good") else 0.0), kind
    for url, reason in report.expected.items():  # each bad target down for its own reason, and only that one
        reasons = {r for (target, r) in report.errors if target == url}
        assert reasons == {reason}, report.targets[url]
    assert not any(target not in report.expected for target, _ in report.errors)
    # Threads: one scrape worker per target, the render pool, the watchdog, the main thread (the event loop).
    assert max(report.threads) <= len(report.targets) + Settings([]).workers + 2


# -- many scrapers, idle and slow clients: the exporter's own server ---------------------------------

def scrapes(engine: FakeEngine) -> int:
    """The /metrics requests the engine got."""
    return engine.hits.get("/metrics", 0)


def slow_engine(latency: float) -> FakeEngine:
    """The recorded vLLM 0.24.0 /metrics, answered after `latency` seconds."""
    engine = FakeEngine()
    engine.metrics(GOOD["vllm"].read_text(), delay=latency)
    return engine


@contextmanager
def exporter_in_thread(settings: Settings) -> Iterator[str]:
    """The exporter's server for `settings`, in this process; yields its base URL."""
    ready = threading.Event()
    threading.Thread(target=serve, args=(settings, ready), daemon=True).start()
    assert ready.wait(10)
    yield f"http://127.0.0.1:{settings.port}"


UP = re.compile(r"^ornith_engine_up\{[^}]*\} (\S+)$", re.M)


@pytest.mark.parametrize("latency", [0.5, 1.5])
def test_twenty_concurrent_scrapers_read_a_healthy_target_up_in_every_answer(latency: float) -> None:
    # Before: 4 scrapes per target at once, the fifth read `up 0` (20 scrapers at 0.5 s: 61 of 100 answers).
    # The exporter runs as its own process, as deployed; the scrape timeout is Prometheus' header.
    engine = slow_engine(latency)
    port = free_port()
    exporter = start_exporter([engine.url], port, SCRAPE_DEADLINE_S)
    answers: list[tuple[float, list[str]]] = []
    lock = threading.Lock()

    def scraper(delay: float) -> None:
        time.sleep(delay)  # arriving at every point of a scrape in flight
        with httpx.Client() as client:
            for _ in range(2):
                took, text = scrape_exporter(client, f"http://127.0.0.1:{port}/metrics", SCRAPE_DEADLINE_S)
                with lock:
                    answers.append((took, UP.findall(text)))

    try:
        threads = [threading.Thread(target=scraper, args=(i * latency / 20,)) for i in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        exporter.terminate()
        exporter.wait(10)
        engine.close()
    slowest = max(t for t, _ in answers)
    print(f"{latency} s target: {len(answers)} answers, slowest {slowest:.2f} s, {scrapes(engine)} engine requests")
    assert [up for _, up in answers] == [["1.0"]] * 40
    assert slowest < SCRAPE_DEADLINE_S
    assert scrapes(engine) <= 10  # the scrapers shared the scrapes in flight


def raw_request(port: int, data: bytes) -> bytes:
    """Send `data` as is and read the whole answer (the server closes the connection, or 5 s pass)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks) and b"Connection: close" not in b"".join(chunks):
                    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
                    length = re.search(rb"Content-Length: (\d+)", head)
                    if length is None or len(body) >= int(length.group(1)):
                        break
        except TimeoutError:
            pass
    return b"".join(chunks)


def test_only_get_scrapes_the_engines_and_only_at_metrics() -> None:
    engine = slow_engine(0.0)
    port = free_port()
    try:
        with exporter_in_thread(Settings([Target(engine.url)], "127.0.0.1", port)):
            def ask(line: str, extra: str = "") -> tuple[str, bytes]:
                answer = raw_request(port, f"{line}\r\nHost: x\r\n{extra}Connection: close\r\n\r\n".encode())
                head, _, body = answer.partition(b"\r\n\r\n")
                return head.decode(), body

            head, body = ask("HEAD /metrics HTTP/1.1")
            assert head.startswith("HTTP/1.1 200") and body == b"" and scrapes(engine) == 0
            for method in ("POST", "DELETE", "PUT"):
                head, _ = ask(f"{method} /metrics HTTP/1.1", "Content-Length: 2\r\n")
                assert head.startswith("HTTP/1.1 405") and "Allow: GET, HEAD" in head, method
            head, _ = ask("GET //metrics HTTP/1.1")
            assert head.startswith("HTTP/1.1 404")
            assert scrapes(engine) == 0  # none of these scraped an engine
            head, body = ask("GET /metrics?x HTTP/1.1")  # a query (Prometheus' `params`) is ignored
            assert head.startswith("HTTP/1.1 200") and b"ornith_engine_up{" in body
            assert scrapes(engine) == 1
            head, body = ask(f"GET http://127.0.0.1:{port}/metrics HTTP/1.1")  # absolute form
            assert head.startswith("HTTP/1.1 200") and scrapes(engine) == 2
            head, _ = ask("NOT A REQUEST")
            assert head.startswith("HTTP/1.1 400")
    finally:
        engine.close()


def test_a_request_head_that_does_not_arrive_whole_in_time_is_cut_off() -> None:
    port = free_port()
    settings = Settings([Target("http://127.0.0.1:9")], "127.0.0.1", port, limits=Limits(read_timeout=1.0))
    with exporter_in_thread(settings):
        idle = socket.create_connection(("127.0.0.1", port))
        slow = socket.create_connection(("127.0.0.1", port))
        start = time.monotonic()
        closed_at = None
        try:
            for byte in b"GET /metrics HTTP/1.1\r\n":  # one byte every 0.2 s: 4.6 s for the line
                slow.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:  # reset by the server
            closed_at = time.monotonic() - start
        idle.settimeout(2)
        assert idle.recv(1) == b""  # closed by the server, not left waiting
        slow.close()
        idle.close()
    assert closed_at is not None and closed_at < 2.5, closed_at


SLOWLORIS_PAUSE = 2.0  # seconds between two bytes of a slow sender


def test_a_thousand_idle_and_a_hundred_slow_connections_leave_metrics_answering() -> None:
    # Before: a thread per connection, no timeout (500 idle connections: 504 threads; 1,024 under a 1,024
    # open-file limit: /metrics timed out). The exporter runs under that limit here.
    needed = 1100 + 200
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"this test holds {needed} sockets; the open-file limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    body = GOOD["vllm"].read_bytes()
    target = RawTarget(good(body))
    port = free_port()
    exporter = start_exporter([target.url], port, 3.0, nofile=1024)
    url = f"http://127.0.0.1:{port}/metrics"
    held: list[socket.socket] = []
    stop = threading.Event()
    try:
        with httpx.Client() as client:
            scrape_exporter(client, url, 2.0)
            before = proc_status(exporter.pid)
            held += [socket.create_connection(("127.0.0.1", port)) for _ in range(1000)]
            slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
            held += slow

            def trickle_all() -> None:
                line = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 1000
                for i in range(len(line)):
                    for sock in slow:
                        try:
                            sock.send(line[i:i + 1])
                        except OSError:
                            pass  # closed by the exporter: it needed the room
                    if stop.wait(SLOWLORIS_PAUSE):
                        return

            sender = threading.Thread(target=trickle_all, daemon=True)
            sender.start()
            took, statuses = [], []
            for _ in range(4):
                seconds, text = scrape_exporter(client, url, 2.0)
                took.append(seconds)
                statuses.append(proc_status(exporter.pid))
                assert [v for _, v in samples(text, "ornith_engine_up")] == [1.0]
                time.sleep(1.0)
        fds = len(os.listdir(f"/proc/{exporter.pid}/fd"))
    finally:
        stop.set()
        for sock in held:
            sock.close()
        exporter.terminate()
        exporter.wait(10)
        target.close()
    threads = max(s["threads"] for s in statuses)
    grew = (max(s["rss_kib"] for s in statuses) - before["rss_kib"]) / 1024
    print(f"1,000 idle and 100 slow connections: /metrics in {max(took):.2f} s at most, {threads} threads, "
          f"RSS +{grew:.1f} MiB, {fds} open files")
    assert max(took) < 2.0  # the scrape's deadline
    assert threads <= before["threads"]  # no thread per connection
    assert fds <= Limits().max_connections + 32  # the connection cap holds
    assert grew < 16
