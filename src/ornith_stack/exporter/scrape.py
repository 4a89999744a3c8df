"""Scraping engine targets: fetch and parse under one deadline, recognise the engine, read its figures.

The exporter keeps no measurement window: every scrape reads the engines' counters afresh and passes
them on, so two Prometheus servers (or a curl) scraping the same exporter see the same numbers.
A `TargetState` holds only what must outlive a scrape (the engine kind, its info answer, the last
counters for restart detection, error counts), so memory does not grow with time or input.
Everything engine-specific runs inside one target's try block: one target cannot fail another.
"""

from __future__ import annotations

import base64
import heapq
import http.client
import json
import logging
import math
import socket
import ssl
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from ornith_stack.deployment import METRICS_PATH
from ornith_stack.engines import ADAPTERS, EngineAdapter, EngineInfo, detect_adapter
from ornith_stack.engines.exposition import BadExposition, Samples, parse
from ornith_stack.exporter import catalogue as C

log = logging.getLogger(__name__)
# A /metrics body larger than this is not an engine's (vLLM sends ~100 KiB); stop reading.
MAX_BODY_BYTES = 8 * 1024 * 1024
# An info endpoint (/version, /server_info) answers a few KiB.
MAX_INFO_BYTES = 1024 * 1024
# Every sample name any adapter reads: the parser indexes only these.
KEEP = frozenset(name for adapter in ADAPTERS.values() for name in adapter.sample_names())
# An engine that did not say its version is asked again after this many scrapes.
INFO_RETRY_SCRAPES = 20
# Scrapes of one target running at once (overlapping Prometheus servers); one more is refused as a
# timeout at once. The worker pool holds this many per target, so a stuck target never takes a worker
# another target needs.
PER_TARGET_SCRAPES = 4

Labels = tuple[str, ...]
Buckets = list[tuple[str, float]]


class ScrapeError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class Target:
    url: str = field(repr=False)  # base URL, e.g. http://engine:8000; may carry user:password@
    profile: str = ""
    draft: str = ""  # from the profile, when the engine does not say
    name: str = ""  # the `target` label when the URL does not tell replicas apart (a sidecar's loopback)
    # The engine's API key, sent as `Authorization: Bearer` (SGLang's /server_info needs it; the
    # /metrics and /health routes of both engines are open).
    api_key: str = field(default="", repr=False, compare=False)

    @property
    def public(self) -> str:
        """The URL without credentials: what pages and logs show."""
        return redact(self.url)

    @property
    def label(self) -> str:
        """The `target` label of its series: its name if it has one, else its public URL."""
        return self.name or self.public


def redact(url: str) -> str:
    """`url` without a user:password@ part (whatever else it holds, even a port that is not a number)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return url if host == parts.netloc else urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


@dataclass
class Result:
    """One scrape of one target: the unified figures ready for the collectors."""

    target: Target
    up: bool
    duration: float
    adapter: EngineAdapter | None = None
    info: EngineInfo = field(default_factory=EngineInfo)
    model: str = ""
    # Catalogue name -> (labels beyond the engine labels, value).
    values: dict[str, list[tuple[Labels, float]]] = field(default_factory=dict)
    # Catalogue name -> (buckets as (le, cumulative count), sum).
    histograms: dict[str, tuple[Buckets, float]] = field(default_factory=dict)
    error: str | None = None
    reason: str | None = None


@dataclass
class TargetState:
    target: Target
    adapter: EngineAdapter | None = None
    info: EngineInfo | None = None
    info_asked_at: int = 0  # scrape number of the last info request
    last_counters: tuple[float, ...] = ()  # to see a restart (counters going down)
    last_read_at: float = -math.inf  # when the scrape that read last_counters started
    scrapes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    restarts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    slots: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(PER_TARGET_SCRAPES), repr=False)

    def count_error(self, reason: str) -> None:
        with self.lock:
            self.errors[reason] = self.errors.get(reason, 0) + 1


class Scraper:
    """Scrapes all targets concurrently; `scrape_all` is one exporter scrape.

    Concurrent calls (two Prometheus servers) run side by side: nothing is serialised but the few
    updates of one target's state.
    """

    def __init__(self, targets: list[Target], timeout: float = 3.0) -> None:
        self.timeout = timeout
        self.states = [TargetState(t) for t in targets]
        # Threads start on demand; every target's slots fit, so no target waits for another's worker.
        self._pool = ThreadPoolExecutor(max_workers=max(1, PER_TARGET_SCRAPES * len(targets)),
                                        thread_name_prefix="scrape")

    def scrape_all(self, budget: float | None = None) -> list[Result]:
        """One round over every target, each answered within `budget` seconds (at most --timeout)."""
        budget = self.timeout if budget is None else max(0.05, min(self.timeout, budget))
        start = time.monotonic()
        deadline = start + budget
        futures = [self._pool.submit(self._scrape_slot, state, deadline) if state.slots.acquire(blocking=False)
                   else None for state in self.states]
        wait([f for f in futures if f is not None], timeout=budget)
        return [self._outcome(state, future, start) for state, future in zip(self.states, futures, strict=True)]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def keep() -> frozenset[str]:
        """The sample names the parser indexes for the exporter (what every adapter reads)."""
        return KEEP

    def adapter_of(self, target: Target) -> EngineAdapter | None:
        """The engine adapter of a target, from its last scrape or, if none yet, one fetch of /metrics."""
        state = next(s for s in self.states if s.target == target)
        if state.adapter is None:
            try:
                _, adapter = self._fetch_metrics(state.target, time.monotonic() + self.timeout)
            except (ScrapeError, TimeoutError):
                return None
            with state.lock:
                state.adapter = state.adapter or adapter
        return state.adapter

    # -- one target ---------------------------------------------------------------------------
    def _outcome(self, state: TargetState, future: Future[Result] | None, start: float) -> Result:
        if future is None:
            result = _down(state, start, "timeout",
                           f"{state.target.public}: {PER_TARGET_SCRAPES} earlier scrapes still running")
        elif future.done():
            result = future.result()
        else:  # the worker is stopped by its own deadline; this scrape does not wait for it
            result = _down(state, start, "timeout", f"{state.target.public}: no answer within the deadline")
        if result.reason is not None:
            state.count_error(result.reason)
        return result

    def _scrape_slot(self, state: TargetState, deadline: float) -> Result:
        try:
            return self._scrape_one(state, deadline)
        finally:
            state.slots.release()

    def _scrape_one(self, state: TargetState, deadline: float) -> Result:
        start = time.monotonic()
        with state.lock:
            state.scrapes += 1
        try:
            return self._scrape_checked(state, start, deadline)
        except ScrapeError as exc:
            return _down(state, start, exc.reason, str(exc))
        except TimeoutError as exc:
            return _down(state, start, "timeout", f"{state.target.public}: {exc}")
        except Exception as exc:  # a bug must cost one target one scrape, never the exporter
            log.exception("scraping %s failed", state.target.public)
            return _down(state, start, "internal", f"{type(exc).__name__}: {exc}")

    def _scrape_checked(self, state: TargetState, start: float, deadline: float) -> Result:
        samples, adapter = self._fetch_metrics(state.target, deadline)
        with state.lock:
            info = state.info if adapter is state.adapter else None
            ask = info is None or (info.version is None and state.scrapes - state.info_asked_at >= INFO_RETRY_SCRAPES)
            if ask:
                state.info_asked_at = state.scrapes
        if ask:
            info = self._fetch_info(adapter, state.target, deadline)
        assert info is not None
        result = Result(state.target, up=True, duration=0.0, adapter=adapter, info=info,
                        model=adapter.served_model(samples) or info.model or "")
        skipped = read_figures(result, samples)
        self._remember(state, adapter, info, result, skipped, start)
        result.duration = time.monotonic() - start
        return result

    def _remember(self, state: TargetState, adapter: EngineAdapter, info: EngineInfo, result: Result,
                  skipped: dict[str, int], started: float) -> None:
        counters = tuple(_first(result.values.get(m.name)) for m in RESTART_COUNTERS)
        known: EngineInfo | None = info
        with state.lock:
            for reason, count in skipped.items():
                state.skipped[reason] = state.skipped.get(reason, 0) + count
            if started < state.last_read_at:  # a concurrent scrape that began later already finished
                return
            if adapter is state.adapter and any(
                    now < before for now, before in zip(counters, state.last_counters, strict=False)):
                state.restarts += 1
                known = None  # a restart may be an upgrade: ask the version again
            state.adapter, state.info, state.last_counters, state.last_read_at = adapter, known, counters, started

    def _fetch_metrics(self, target: Target, deadline: float) -> tuple[Samples, EngineAdapter]:
        status, body = http_get(target.url + METRICS_PATH, deadline, MAX_BODY_BYTES, target.api_key)
        where = target.public
        if status != 200:
            raise ScrapeError("http_status", f"{where}/metrics: HTTP {status}")
        try:
            samples = parse(body.decode("utf-8"), keep=KEEP, deadline=deadline)
        except UnicodeDecodeError:
            raise ScrapeError("not_exposition", f"{where}/metrics: body is not UTF-8 text") from None
        except BadExposition as exc:
            raise ScrapeError(exc.reason, f"{where}/metrics: {exc}") from None
        adapter = detect_adapter(samples)
        if adapter is None:
            raise ScrapeError("unknown_engine", f"{where}/metrics: no vLLM or SGLang metrics in the answer")
        return samples, adapter

    def _fetch_info(self, adapter: EngineAdapter, target: Target, deadline: float) -> EngineInfo:
        """Version, model and draft from the engine's info endpoint; empty when none answers in time."""
        for path in adapter.info_paths:
            try:
                status, body = http_get(target.url + path, deadline, MAX_INFO_BYTES, target.api_key)
                if status == 200:
                    return adapter.parse_info(json.loads(body))
            except (ScrapeError, ValueError, TimeoutError):
                continue
        return EngineInfo()


def _down(state: TargetState, start: float, reason: str, detail: str) -> Result:
    return Result(state.target, up=False, duration=time.monotonic() - start, error=detail, reason=reason)


def _first(rows: list[tuple[Labels, float]] | None) -> float:
    return rows[0][1] if rows else 0.0


# Counters whose going down means the engine restarted.
RESTART_COUNTERS = (C.SPEC_STEPS, C.GENERATION_TOKENS, C.PROMPT_TOKENS, C.DECODE_TOKENS)


# -- from engine samples to unified figures ---------------------------------------------------------
def read_figures(result: Result, samples: Samples) -> dict[str, int]:
    """Fill `result` with the unified figures of one scrape; returns the samples skipped, by reason."""
    adapter, values = result.adapter, result.values
    assert adapter is not None

    def put(metric: C.Metric, value: float | None, extra: Labels = ()) -> None:
        if value is not None and math.isfinite(value):
            values.setdefault(metric.name, []).append((extra, value))

    spec = adapter.spec_counters(samples, result.info)
    if spec is not None:
        put(C.SPEC_STEPS, spec.steps)
        put(C.SPEC_ACCEPTED_TOKENS, spec.accepted)
        put(C.SPEC_DRAFT_TOKENS, spec.drafted)
        for position, count in sorted(spec.accepted_per_position.items())[: C.MAX_POSITIONS]:
            put(C.SPEC_ACCEPTED_PER_POSITION, count, (str(position),))
    reported = adapter.reported_acceptance(samples)
    if reported is not None:
        put(C.SPEC_ENGINE_ACCEPTANCE_LENGTH, reported.length)
        put(C.SPEC_ENGINE_DRAFT_ACCEPTANCE_RATIO, reported.ratio)
    names = adapter.metrics
    put(C.GENERATION_TOKENS, adapter.read(samples, names.generation_tokens))
    put(C.PROMPT_TOKENS, adapter.read(samples, names.prompt_tokens))
    put(C.DECODE_TOKENS, adapter.decode_tokens(samples))
    put(C.REQUESTS_RUNNING, adapter.read(samples, names.requests_running))
    put(C.REQUESTS_WAITING, adapter.read(samples, names.requests_waiting))
    put(C.KV_CACHE_USAGE, adapter.kv_usage(samples))
    put(C.MAMBA_CACHE_USAGE, adapter.mamba_usage(samples))
    skipped: dict[str, int] = defaultdict(int)
    for metric, field_name in ((C.TTFT, "ttft"), (C.ITL, "itl"), (C.E2E, "e2e")):  # base.HISTOGRAMS
        histogram, bad = passthrough_histogram(samples, getattr(names, field_name))
        skipped["bad_bucket"] += bad
        if histogram is not None:
            result.histograms[metric.name] = histogram
    return {reason: count for reason, count in skipped.items() if count}


def passthrough_histogram(samples: Samples, name: str) -> tuple[tuple[Buckets, float] | None, int]:
    """An engine histogram summed over its own label sets (engine cores), buckets as the engine has them.

    Returns the histogram (None without a +Inf bucket) and the number of buckets skipped: an `le` that is
    not a number, NaN or -Inf, or a count that is not finite, cannot be placed, and is left out."""
    per_le: dict[float, float] = defaultdict(float)
    bad = 0
    for sample in samples.get(f"{name}_bucket", []):
        try:
            le = float(sample.labels.get("le", "nan"))
        except ValueError:
            le = math.nan
        if math.isnan(le) or le == -math.inf or not math.isfinite(sample.value):
            bad += 1
            continue
        per_le[le] += sample.value
    if math.inf not in per_le:
        return None, bad
    buckets = [("+Inf" if le == math.inf else _le(le), value) for le, value in sorted(per_le.items())]
    total = samples.total(f"{name}_sum")
    return (buckets, total if total is not None and math.isfinite(total) else 0.0), bad


def _le(value: float) -> str:
    return repr(value) if value != int(value) else f"{value:.1f}"


# -- HTTP with one deadline -----------------------------------------------------------------------
class _Guard:
    """One socket under the watchdog: `fired` once the watchdog shut it at its deadline."""

    __slots__ = ("deadline", "sock", "fired")

    def __init__(self, deadline: float, sock: socket.socket) -> None:
        self.deadline, self.fired = deadline, False
        self.sock: socket.socket | None = sock  # None once released: nothing to shut

    def __lt__(self, other: _Guard) -> bool:
        return self.deadline < other.deadline


class Watchdog:
    """One thread for the whole process that shuts every watched socket at its deadline.

    It holds its own reference to the socket, so it can stop a read however http.client frames the
    answer (with `Connection: close` or HTTP/1.0 the connection object lets go of its socket), and
    one thread serves every request, so watching costs no thread per scrape."""

    def __init__(self) -> None:
        self._heap: list[_Guard] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, sock: socket.socket, deadline: float) -> _Guard:
        guard = _Guard(deadline, sock)
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="scrape-watchdog", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, guard)
            self._cond.notify()
        return guard

    def release(self, guard: _Guard) -> None:
        with self._cond:
            guard.sock = None  # popped from the heap when its deadline comes

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._heap and (self._heap[0].sock is None or self._heap[0].deadline <= time.monotonic()):
                    guard = heapq.heappop(self._heap)
                    if guard.sock is not None:
                        guard.fired = True
                        _shut(guard.sock)
                        guard.sock = None
                self._cond.wait(self._heap[0].deadline - time.monotonic() if self._heap else None)


WATCHDOG = Watchdog()


@dataclass
class Reply:
    """An HTTP answer whose headers are in; its body comes in chunks, each read by the deadline."""

    status: int
    response: http.client.HTTPResponse
    sock: socket.socket
    guard: _Guard
    deadline: float
    where: str

    def header(self, name: str) -> str:
        return (self.response.getheader(name) or "").strip().lower()

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives; ScrapeError timeout past the deadline, truncated when the answer ends
        short of its Content-Length (or of its last chunk)."""
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0 or self.guard.fired:
                raise ScrapeError("timeout", f"{self.where}: body not complete within the deadline")
            self.sock.settimeout(remaining)  # every recv waits at most until the deadline
            chunk = self.response.read1(64 * 1024)
            if not chunk:
                break
            yield chunk
        if self.guard.fired:  # the watchdog's shutdown reads as the end of the body
            raise ScrapeError("timeout", f"{self.where}: body not complete within the deadline")
        if self.response.length:  # bytes still owed by Content-Length
            raise ScrapeError("truncated", f"{self.where}: body closed {self.response.length} bytes short "
                                           "of its Content-Length")


@contextmanager
def http_open(url: str, deadline: float, method: str = "GET", body: bytes | None = None,
              headers: dict[str, str] | None = None) -> Iterator[Reply]:
    """Send one request and give its answer once the headers are in; connect, headers and body all
    done by `deadline` (time.monotonic()). The watchdog shuts the socket at the deadline, and every
    read waits at most until then, so a server that trickles its headers or body cannot hold the
    caller past it, whatever the framing. Failures are ScrapeError with a reason."""
    parts = urlsplit(url)
    where = redact(url)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise ScrapeError("timeout", f"{where}: no time left in the scrape's deadline")
    try:
        address = (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
    except ValueError as exc:
        raise ScrapeError("connect", f"{where}: {exc}") from None
    sent = {"Accept-Encoding": "gzip", "User-Agent": "ornith-exporter", **(headers or {})}
    if parts.username is not None:
        token = f"{parts.username}:{parts.password or ''}".encode()
        sent["Authorization"] = "Basic " + base64.b64encode(token).decode()
    guard: _Guard | None = None
    sock: socket.socket | None = None
    response: http.client.HTTPResponse | None = None
    try:
        sock = socket.create_connection(address, timeout=remaining)
        guard = WATCHDOG.watch(sock, deadline)
        if parts.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=address[0])
            guard.sock = sock
        conn = http.client.HTTPConnection(*address, timeout=remaining)
        conn.sock = sock  # ours: the watchdog shuts it whatever http.client does with the connection
        conn.request(method, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), body, sent)
        response = conn.getresponse()
        if guard.fired:  # headers cut at the deadline can look complete to http.client
            raise ScrapeError("timeout", f"{where}: headers not complete within the deadline")
        yield Reply(response.status, response, sock, guard, deadline, where)
    except ScrapeError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        if (guard is not None and guard.fired) or time.monotonic() >= deadline or isinstance(exc, TimeoutError):
            raise ScrapeError("timeout", f"{where}: not complete within the deadline") from None
        if isinstance(exc, http.client.IncompleteRead):
            raise ScrapeError("truncated", f"{where}: the answer ended early ({exc})") from None
        raise ScrapeError("connect", f"{where}: {type(exc).__name__}: {exc}") from None
    finally:
        if guard is not None:
            WATCHDOG.release(guard)
        if response is not None:
            response.close()
        if sock is not None:
            sock.close()


def bearer(api_key: str) -> dict[str, str]:
    """The request headers that carry an engine's API key (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def http_get(url: str, deadline: float, limit: int, api_key: str = "") -> tuple[int, bytes]:
    """GET `url` within `deadline`: its status and body, at most `limit` bytes after decoding."""
    with http_open(url, deadline, headers={"Accept": "text/plain;version=0.0.4", **bearer(api_key)}) as reply:
        return reply.status, read_body(reply, limit)


def read_body(reply: Reply, limit: int) -> bytes:
    """The whole body, gunzipped when sent so; a gzip stream that stops before its end is truncated."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if reply.header("Content-Encoding") == "gzip" else None
    chunks: list[bytes] = []
    size = 0
    for chunk in reply.chunks():
        if inflate is not None:
            try:
                chunk = inflate.decompress(chunk, limit + 1 - size)
            except zlib.error as exc:
                raise ScrapeError("not_exposition", f"{reply.where}: bad gzip body: {exc}") from None
        size += len(chunk)
        if size > limit:
            raise ScrapeError("too_large", f"{reply.where}: body larger than {limit} bytes")
        chunks.append(chunk)
    if inflate is not None and not inflate.eof:
        raise ScrapeError("truncated", f"{reply.where}: gzip body ends before its end")
    return b"".join(chunks)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
