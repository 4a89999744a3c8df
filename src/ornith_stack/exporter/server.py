"""The exporter's HTTP side: /metrics for Prometheus and a landing page at /."""

from __future__ import annotations

import gzip
import html
import json
import math
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from urllib.parse import urlsplit
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, ProcessCollector

from ornith_stack.deployment import EXPORTER_PORT, GATEWAY_SD_PATH, METRICS_PATH, SD_PATH
from ornith_stack.errors import UserError
from ornith_stack.exporter.canary import Canary
from ornith_stack.exporter.collectors import ExporterCollector, render
from ornith_stack.exporter.scrape import Scraper, Target, redact

# Kept back from Prometheus' scrape timeout for collecting and writing the answer: this share of it,
# at least ANSWER_MARGIN_S seconds. Answering takes about 0.05 s after the targets' deadline
# (tests/unit/test_exporter_faults.py); the rest is headroom for a loaded machine.
ANSWER_MARGIN_S = 0.25
ANSWER_MARGIN_SHARE = 0.2
TIMEOUT_HEADER = "HTTP_X_PROMETHEUS_SCRAPE_TIMEOUT_SECONDS"
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
    # Model Gateways in front of the targets (their metrics URL): offered to Prometheus, not scraped here.
    gateways: list[Target] = field(default_factory=list)


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


def scrape_budget(environ: dict) -> float | None:
    """This scrape's deadline in seconds from Prometheus' header, less a margin for the answer."""
    try:
        seconds = float(environ.get(TIMEOUT_HEADER, ""))
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


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def build_app(settings: Settings) -> tuple[Callable, Scraper, Canary | None]:
    scraper = Scraper(settings.targets, timeout=settings.timeout)
    canary = (Canary(settings.targets, interval=settings.canary_interval, adapter_of=scraper.adapter_of)
              if settings.canary else None)
    collector = ExporterCollector(scraper, canary)
    process = ProcessCollector(registry=None)

    def metrics(environ: dict) -> bytes:
        # Each request scrapes with its own deadline and none waits for another.
        return render([*collector.with_budget(scrape_budget(environ)).collect(), *process.collect()])

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path in ("/", "/index.html"):
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [landing_page(settings).encode()]
        if path == METRICS_PATH:
            body, headers = metrics(environ), [("Content-Type", CONTENT_TYPE_LATEST)]
            if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):  # Prometheus asks for it on every scrape
                body, headers = gzip.compress(body), [*headers, ("Content-Encoding", "gzip")]
            start_response("200 OK", [*headers, ("Content-Length", str(len(body)))])
            return [body]
        if path in (SD_PATH, GATEWAY_SD_PATH):
            start_response("200 OK", [("Content-Type", "application/json")])
            listed = settings.targets if path == SD_PATH else settings.gateways
            return [json.dumps(service_discovery(listed)).encode()]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: the metrics are at /metrics\n"]

    return app, scraper, canary


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
        f"<p>Canary: {'on' if settings.canary else 'off'}</p></body></html>"
    )


def serve(settings: Settings, ready: threading.Event | None = None) -> None:
    """Serve until interrupted."""
    app, scraper, canary = build_app(settings)
    family = address_family(settings.host)

    class server_class(_Server):  # noqa: N801 - a class made for this one server
        address_family = family

    try:
        httpd = make_server(settings.host, settings.port, app, server_class=server_class, handler_class=_QuietHandler)
    except OSError as exc:
        raise UserError(f"cannot listen on {settings.host or '*'}:{settings.port}: {exc.strerror}") from None
    if canary is not None:
        canary.start()
    if ready is not None:
        ready.set()
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()
        scraper.close()
        if canary is not None:
            canary.stop()
