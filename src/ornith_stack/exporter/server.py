"""The exporter's HTTP side: /metrics for Prometheus, the targets for its service discovery, a landing page.

Served by httpd.BoundedServer (read timeout, connection cap, a few render threads); a /metrics request
waits for the engines' scrapes, shared with every other request in the meantime, without holding a thread.
"""

from __future__ import annotations

import asyncio
import gzip
import html
import json
import math
import socket
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, ProcessCollector

from ornith_stack.deployment import EXPORTER_PORT, GATEWAY_SD_PATH, GPU_METRICS_OFF, METRICS_PATH, SD_PATH
from ornith_stack.errors import UserError
from ornith_stack.exporter.canary import Canary
from ornith_stack.exporter.collectors import ExporterCollector, render
from ornith_stack.exporter.host import host_collectors
from ornith_stack.exporter.httpd import BoundedServer, Limits, Request, Response
from ornith_stack.exporter.scrape import Result, Scraper, Target
from ornith_stack.urls import redact

# Kept back from Prometheus' scrape timeout for collecting and writing the answer: this share of it,
# at least ANSWER_MARGIN_S seconds. Answering takes about 0.05 s after the targets' deadline
# (tests/unit/test_exporter_faults.py); the rest is headroom for a loaded machine.
ANSWER_MARGIN_S = 0.25
ANSWER_MARGIN_SHARE = 0.2
TIMEOUT_HEADER = "x-prometheus-scrape-timeout-seconds"
# Connections the kernel holds before the server accepts them (a burst of scrapers at once).
LISTEN_BACKLOG = 512
# --timeout above this is a mistake (Prometheus' own scrape timeout is seconds, not minutes).
MAX_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Settings:
    targets: list[Target]
    host: str = ""
    port: int = EXPORTER_PORT
    timeout: float = 3.0
    canary: bool = False
    canary_interval: float = 30.0
    canary_checks_answer: bool = True  # False: liveness only (a model that cannot know the answer)
    # Model Gateways in front of the targets (their metrics URL): offered to Prometheus, not scraped here.
    gateways: list[Target] = field(default_factory=list)
    limits: Limits = Limits()
    workers: int = 4  # threads rendering answers
    # The host's collectors: the `profile` label of their series, NVML's GPUs (deployment.GPU_METRICS_MODES)
    # and the model cache paths whose file system is watched.
    profile: str = ""
    gpu_metrics: str = GPU_METRICS_OFF
    model_cache: tuple[str, ...] = ()


def canary_mode(settings: Settings) -> str:
    if not settings.canary:
        return "off"
    return "on, known answer" if settings.canary_checks_answer else "on, liveness (the answer is not checked)"


def parse_listen(listen: str) -> tuple[str, int]:
    """'[HOST]:PORT' as (host, port); ':PORT' listens on every address; an IPv6 HOST is bracketed."""
    host, sep, port = listen.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or (":" in host and not bracketed):
        raise UserError(f"--listen {listen!r}: expected [HOST]:PORT, e.g. :{EXPORTER_PORT}, 127.0.0.1:{EXPORTER_PORT} "
                        f"or [::1]:{EXPORTER_PORT}")
    return (host[1:-1] if bracketed else host), int(port)


def address_family(host: str) -> socket.AddressFamily:
    """The family a listening HOST belongs to (IPv6 for `::1`, a name by what it resolves to first);
    every address ("") is IPv4's 0.0.0.0, as before."""
    if not host:
        return socket.AF_INET
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except socket.gaierror as exc:
        raise UserError(f"--listen {host}: cannot resolve it ({exc.strerror})") from None


def check_timeout(timeout: float) -> float:
    """--timeout as a number of seconds one scrape may take, refusing what cannot be a deadline."""
    if not math.isfinite(timeout) or not 0 < timeout <= MAX_TIMEOUT_S:
        raise UserError(f"--timeout {timeout}: expected seconds between 0 and {MAX_TIMEOUT_S:g}, e.g. 3")
    return timeout


def scrape_budget(headers: dict[str, str]) -> float | None:
    """This scrape's deadline in seconds from Prometheus' header, less a margin for the answer."""
    try:
        seconds = float(headers.get(TIMEOUT_HEADER, ""))
    except ValueError:
        return None
    if not math.isfinite(seconds) or seconds <= 0:
        return None
    return max(0.05, seconds - max(ANSWER_MARGIN_S, ANSWER_MARGIN_SHARE * seconds))


def normalise_target(url: str) -> str:
    """A target as a base URL: scheme added if missing, trailing slash and /metrics dropped."""
    url = url.strip()
    if not url:
        raise UserError("--target: empty URL; pass the engine's base URL, e.g. http://127.0.0.1:8000")
    if "://" not in url:
        url = "http://" + url
    if not url.startswith(("http://", "https://")):
        raise UserError(f"--target {url!r}: only http:// and https:// targets are supported")
    url = url.rstrip("/")
    return url.removesuffix(METRICS_PATH)


# Methods every route answers; anything else is 405 without touching the engines.
METHODS = ("GET", "HEAD")
TEXT = [("Content-Type", "text/plain; charset=utf-8")]


class App:
    """The exporter's routes. `handle` is what the server awaits; `respond` the same answer computed
    synchronously (tests, and every route but /metrics, which is cheap)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.scraper = Scraper(settings.targets, timeout=settings.timeout)
        self.canary = (Canary(settings.targets, interval=settings.canary_interval, adapter_of=self.scraper.adapter_of,
                              check_answer=settings.canary_checks_answer) if settings.canary else None)
        self.collector = ExporterCollector(self.scraper, self.canary,
                                           host=host_collectors(settings.profile, settings.gpu_metrics,
                                                                settings.model_cache))
        self.process = ProcessCollector(registry=None)
        # Rendering is CPU work: a few threads, however many scrapers wait.
        self.pool = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="render")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.scraper.close()
        if self.canary is not None:
            self.canary.stop()

    def check(self, request: Request) -> Response | None:
        """The answer that needs no scrape (an error, HEAD, a page), or None for a /metrics scrape."""
        if request.method not in METHODS:
            return Response(405, [*TEXT, ("Allow", ", ".join(METHODS))], b"method not allowed: GET or HEAD\n")
        if request.path == METRICS_PATH:
            # HEAD says the route is there without scraping every engine for a body nobody reads.
            return Response(200, [("Content-Type", CONTENT_TYPE_LATEST)], length=False) \
                if request.method == "HEAD" else None
        if request.path in ("/", "/index.html"):
            return Response(200, [("Content-Type", "text/html; charset=utf-8")], landing_page(self.settings).encode())
        if request.path in (SD_PATH, GATEWAY_SD_PATH):
            listed = self.settings.targets if request.path == SD_PATH else self.settings.gateways
            return Response(200, [("Content-Type", "application/json")], json.dumps(service_discovery(listed)).encode())
        # Any other path (`//metrics` included) is not a route: no scrape, so no way to multiply scrapes.
        return Response(404, TEXT, f"not found: the metrics are at {METRICS_PATH}\n".encode())

    def metrics(self, request: Request, results: list[Result]) -> Response:
        body = render([*self.collector.with_results(results).collect(), *self.process.collect()])
        headers = [("Content-Type", CONTENT_TYPE_LATEST)]
        if "gzip" in request.header("Accept-Encoding"):  # Prometheus asks for it on every scrape
            body, headers = gzip.compress(body), [*headers, ("Content-Encoding", "gzip")]
        return Response(200, headers, body)

    def respond(self, request: Request) -> Response:
        answer = self.check(request)
        if answer is not None:
            return answer
        return self.metrics(request, self.scraper.scrape_all(scrape_budget(request.headers)))

    async def handle(self, request: Request) -> Response:
        answer = self.check(request)
        if answer is not None:
            return answer
        round_ = self.scraper.begin(scrape_budget(request.headers))
        await until_done(round_.futures, round_.deadline)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self.metrics, request, round_.results())


async def until_done(futures: list[Future[Result]], deadline: float) -> None:
    """Wait, without a thread, until every future is done or `deadline` (time.monotonic()) passes. The
    scrapes are shared with other answers, so waiting here never cancels them."""
    loop = asyncio.get_running_loop()
    pending = {f for f in futures if not f.done()}
    if not pending:
        return
    all_done = loop.create_future()

    def landed() -> None:
        if not all_done.done() and all(f.done() for f in pending):
            all_done.set_result(None)

    def from_worker(_: Future[Result]) -> None:
        try:
            loop.call_soon_threadsafe(landed)
        except RuntimeError:  # the loop has closed: nobody waits any more
            pass

    for future in pending:
        future.add_done_callback(from_worker)
    try:
        await asyncio.wait_for(all_done, max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        pass


def service_discovery(targets: Iterable[Target]) -> list[dict]:
    """Prometheus http_sd_configs groups: one per engine, labelled like the exporter's own series."""
    groups = []
    for target in targets:
        # Credentials in a target URL stay in the exporter: Prometheus gets the address only.
        url = urlsplit(redact(target.url))
        labels = {"__scheme__": url.scheme, "target": target.label}
        if url.path:
            labels["__metrics_path__"] = url.path + METRICS_PATH
        if target.profile:
            labels["profile"] = target.profile
        groups.append({"targets": [url.netloc], "labels": labels})
    return groups


def landing_page(settings: Settings) -> str:
    rows = "".join(f"<li><code>{html.escape(t.public)}</code> profile <code>{html.escape(t.profile or '-')}</code></li>"
                   for t in settings.targets)
    return (
        "<!doctype html><html><head><title>ornith-stack exporter</title></head><body>"
        "<h1>ornith-stack exporter</h1>"
        f'<p>Unified speculative-decoding, throughput and latency metrics: <a href="{METRICS_PATH}">{METRICS_PATH}</a></p>'
        f'<p>The engines, for Prometheus service discovery: <a href="{SD_PATH}">{SD_PATH}</a></p>'
        f"<p>Targets:</p><ul>{rows}</ul>"
        f"<p>Canary: {canary_mode(settings)}</p>"
        f"<p>GPU metrics: {settings.gpu_metrics}; model cache: "
        f"{html.escape(', '.join(settings.model_cache) or 'not watched')}</p></body></html>"
    )


def serve(settings: Settings, ready: threading.Event | None = None) -> None:
    """Serve until interrupted."""
    app = App(settings)
    try:
        sock = socket.create_server((settings.host, settings.port), family=address_family(settings.host),
                                    backlog=LISTEN_BACKLOG)
    except OSError as exc:
        app.close()
        raise UserError(f"cannot listen on {settings.host or '*'}:{settings.port}: {exc.strerror}") from None
    if app.canary is not None:
        app.canary.start()
    server = BoundedServer(app.handle, settings.limits)
    try:
        asyncio.run(server.serve(sock, ready.set if ready is not None else None))
    finally:
        sock.close()
        app.close()
