"""Hostile engine targets on loopback, and a fault load against a real exporter process.

Raw-socket servers that trickle, stall, cut short or repeat their /metrics answers, beside good targets
serving the recorded SGLang 0.5.17 (H200, tp 1) and vLLM 0.24.0 (H200, DFlash) /metrics texts from
tests/fixtures/engines/. `fault_load` starts `ornith-stack exporter` as its own process over all of
them, scrapes it from several threads the way concurrent Prometheus servers do, and records every
answer with the exporter's thread count and resident memory (from /proc). Used by
tests/unit/test_exporter_faults.py and scripts/bench_exporter.py.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "engines"
GOOD = {
    "sglang": FIXTURES / "sglang-0.5.17" / "tp1" / "metrics-final.txt",
    "vllm": FIXTURES / "vllm-0.24.0" / "dflash" / "metrics-final.txt",
}
PAUSE = 0.2  # seconds between two trickled bytes

Behaviour = Callable[[socket.socket, threading.Event], None]


def head(length: int | None, version: str = "HTTP/1.1", close: bool = False) -> bytes:
    lines = [f"{version} 200 OK", "Content-Type: text/plain; version=0.0.4"]
    lines += [f"Content-Length: {length}"] if length is not None else []
    lines += ["Connection: close"] if close else []
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def trickle(data: bytes, stop: threading.Event, conn: socket.socket) -> None:
    for i in range(len(data)):
        if stop.wait(PAUSE):
            return
        conn.sendall(data[i:i + 1])


def behaviours(body: bytes) -> dict[str, tuple[Behaviour, str]]:
    """Fault name -> (what the server does with one connection, the reason the exporter must give)."""
    half = body[: len(body) // 2]
    mid_line = body[: body.index(b"\n", len(body) // 2)]  # ends just before a line feed
    return {
        # The body one byte at a time, framed by the connection's end: http.client lets go of the socket.
        "trickle_close": (lambda c, s: (c.sendall(head(None, close=True)), trickle(body, s, c)), "timeout"),
        "trickle_http10": (lambda c, s: (c.sendall(head(None, "HTTP/1.0")), trickle(body, s, c)), "timeout"),
        "slow_headers": (lambda c, s: trickle(head(len(body)) + body, s, c), "timeout"),
        # Half the body, then the connection closes: fewer bytes than Content-Length.
        "early_close": (lambda c, s: c.sendall(head(len(body)) + half), "truncated"),
        # Half the body, then nothing until the exporter gives up: cut at the deadline.
        "short_stalled": (lambda c, s: (c.sendall(head(len(body)) + half), s.wait()), "timeout"),
        # Connection: close framing cut mid-line: no length says it is short, the text does.
        "cut_mid_line": (lambda c, s: c.sendall(head(None, close=True) + mid_line), "truncated"),
        # Every family twice: summing would double the verify steps.
        "duplicate": (lambda c, s: c.sendall(head(2 * len(body)) + body + body), "duplicate"),
    }


class RawTarget:
    """A loopback server answering every request with `behaviour` (/metrics or not), one thread per connection."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                self.behaviour(conn, self.stop)
            except OSError:  # the exporter shut the connection at its deadline
                pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def good(body: bytes) -> Behaviour:
    return lambda conn, stop: conn.sendall(head(len(body)) + body)


def proc_status(pid: int) -> dict[str, int]:
    """Threads and VmRSS (KiB) of a process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {"threads": int(fields["Threads"]), "rss_kib": int(fields["VmRSS"].split()[0])}


@dataclass
class Answer:
    took: float
    up: dict[str, float]  # target URL -> ornith_engine_up


@dataclass
class LoadReport:
    targets: dict[str, str]  # URL -> "good:<engine>" or the fault name
    expected: dict[str, str]  # bad target URL -> the reason it must be counted under
    answers: list[Answer] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # scrapes of the exporter that did not answer
    threads: list[int] = field(default_factory=list)
    rss_kib: list[int] = field(default_factory=list)
    errors: dict[tuple[str, str], float] = field(default_factory=dict)  # (target, reason) -> count at the end


def scrape_exporter(client: httpx.Client, url: str, timeout_s: float) -> tuple[float, str]:
    """One scrape as Prometheus makes it, timed from the request to the whole answer (the client is made
    beforehand: making one loads a CA bundle, which a loaded machine takes a good part of a second for)."""
    start = time.monotonic()
    answer = client.get(url, headers={"X-Prometheus-Scrape-Timeout-Seconds": f"{timeout_s:g}"}, timeout=30)
    answer.raise_for_status()
    return time.monotonic() - start, answer.text


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name]


def start_exporter(urls: list[str], port: int, timeout_s: float, nofile: int | None = None) -> subprocess.Popen[bytes]:
    """`ornith-stack exporter` as its own process; with `nofile`, under that open-file limit (a container's)."""
    argv = [sys.executable, "-m", "ornith_stack", "exporter", "--listen", f"127.0.0.1:{port}", "--timeout",
            f"{timeout_s:g}"]
    for url in urls:
        argv += ["--target", url]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}

    def limit_files() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limit_files)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the exporter exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the exporter did not listen within 60 s")


def fault_load(port: int, seconds: float, scrapers: int = 3, scrape_timeout: float = 2.0,
               progress: Callable[[str], None] | None = None) -> LoadReport:
    """Good targets and every fault beside them, one exporter process, `scrapers` threads scraping it
    for `seconds`; the exporter's own deadline is `scrape_timeout` (Prometheus' header) less its margin."""
    body = GOOD["vllm"].read_bytes()
    servers: list[RawTarget] = []
    report = LoadReport({}, {})
    for engine, path in GOOD.items():
        servers.append(RawTarget(good(path.read_bytes())))
        report.targets[servers[-1].url] = f"good:{engine}"
    for name, (behaviour, reason) in behaviours(body).items():
        servers.append(RawTarget(behaviour))
        report.targets[servers[-1].url] = name
        report.expected[servers[-1].url] = reason
    exporter = start_exporter(list(report.targets), port, scrape_timeout)
    url = f"http://127.0.0.1:{port}/metrics"
    stop = time.monotonic() + seconds
    lock = threading.Lock()

    def scrape_loop() -> None:
        with httpx.Client() as client:
            while time.monotonic() < stop:
                scrape_once(client)

    def scrape_once(client: httpx.Client) -> None:
        try:
            took, text = scrape_exporter(client, url, scrape_timeout)
        except httpx.HTTPError as exc:
            with lock:
                report.failures.append(f"{type(exc).__name__}: {exc}")
            return
        up = {labels["target"]: v for labels, v in samples(text, "ornith_engine_up")}
        with lock:
            report.answers.append(Answer(took, up))

    try:
        threads = [threading.Thread(target=scrape_loop) for _ in range(scrapers)]
        for thread in threads:
            thread.start()
        last = time.monotonic()
        while any(t.is_alive() for t in threads):
            status = proc_status(exporter.pid)
            report.threads.append(status["threads"])
            report.rss_kib.append(status["rss_kib"])
            if progress is not None and time.monotonic() - last >= 5:
                last = time.monotonic()
                progress(f"{len(report.answers)} answers, {status['threads']} threads, "
                         f"RSS {status['rss_kib'] / 1024:.1f} MiB")
            time.sleep(0.25)
        with httpx.Client() as client:
            _, text = scrape_exporter(client, url, scrape_timeout)
        report.errors = {(labels["target"], labels["reason"]): v
                         for labels, v in samples(text, "ornith_exporter_scrape_errors_total") if v}
    finally:
        exporter.terminate()
        exporter.wait(10)
        for server in servers:
            server.close()
    return report
