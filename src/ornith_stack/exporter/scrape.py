"""Scraping engine targets: fetch with a hard deadline, recognise the engine, keep the window state.

One `TargetState` per target holds only the previous scrape's counters and the last values, so the
exporter's memory does not grow with time or with what an engine sends.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from ornith_stack.engines import (
    ADAPTERS,
    EngineAdapter,
    EngineInfo,
    SpecCounters,
    acceptance_length,
    detect_adapter,
)
from ornith_stack.engines.exposition import Samples, parse
from ornith_stack.errors import UserError
from ornith_stack.exporter.catalogue import MAX_POSITIONS

log = logging.getLogger(__name__)
# A /metrics body larger than this is not an engine's (vLLM sends ~100 KiB); stop reading.
MAX_BODY_BYTES = 8 * 1024 * 1024
# Every sample name any adapter reads: the parser indexes only these.
KEEP = frozenset(name for adapter in ADAPTERS.values() for name in adapter.sample_names())


class ScrapeError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class Target:
    url: str  # base URL, e.g. http://engine:8000
    profile: str = ""
    draft: str = ""  # from the profile, when the engine does not say


@dataclass
class Window:
    """Figures computed over the window between the previous good scrape and this one."""

    acceptance_length: float | None = None
    draft_acceptance_ratio: float | None = None
    position_ratios: dict[int, float] = field(default_factory=dict)
    generation_tps: float | None = None
    prompt_tps: float | None = None


@dataclass
class Result:
    """One scrape of one target, as the collectors see it."""

    target: Target
    up: bool
    duration: float
    adapter: EngineAdapter | None = None
    info: EngineInfo = field(default_factory=EngineInfo)
    model: str = ""
    samples: Samples = field(default_factory=Samples)
    spec: SpecCounters | None = None
    window: Window = field(default_factory=Window)
    error: str | None = None


@dataclass
class TargetState:
    target: Target
    adapter: EngineAdapter | None = None
    info: EngineInfo | None = None
    prev_spec: SpecCounters | None = None
    prev_tokens: tuple[float, float, float] | None = None  # (monotonic time, generated, prompt)
    last: Window = field(default_factory=Window)  # values kept while no draft happens
    scrapes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    resets: int = 0
    info_asked_at: int = 0  # scrape number of the last info request


class Scraper:
    """Scrapes all targets concurrently; `scrape_all` is one exporter scrape."""

    def __init__(self, targets: list[Target], timeout: float = 3.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout, self.clock = timeout, clock
        self.states = [TargetState(t) for t in targets]
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(64, len(targets))), thread_name_prefix="scrape")
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=max(10, len(targets) * 2)),
            follow_redirects=False,
            headers={"Accept": "text/plain;version=0.0.4"},
        )

    def scrape_all(self) -> list[Result]:
        # One scrape at a time: the window state must move forward in order.
        with self._lock:
            return list(self._pool.map(self._scrape_one, self.states))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    # -- one target ---------------------------------------------------------------------------
    def _scrape_one(self, state: TargetState) -> Result:
        start = time.monotonic()
        state.scrapes += 1
        try:
            return self._scrape_checked(state, start)
        except ScrapeError as exc:
            reason, detail = exc.reason, str(exc)
        except Exception as exc:  # a bug must cost one target one scrape, never the exporter
            reason, detail = "internal", f"{type(exc).__name__}: {exc}"
            log.exception("scraping %s failed", state.target.url)
        state.errors[reason] = state.errors.get(reason, 0) + 1
        return Result(state.target, up=False, duration=time.monotonic() - start, error=detail)

    def _scrape_checked(self, state: TargetState, start: float) -> Result:
        samples, adapter = self._fetch_metrics(state.target.url + "/metrics", start)
        now = self.clock()
        if adapter is not state.adapter:
            state.adapter, state.info, state.prev_spec, state.prev_tokens = adapter, None, None, None
        window, reset = self._window(state, adapter, samples, now)
        if reset:
            state.resets += 1
            state.info = None  # a restart may be an upgrade: ask the version again
        # Ask for the version once per engine start; an engine that did not say is asked again later.
        if state.info is None or (state.info.version is None and state.scrapes - state.info_asked_at >= 20):
            state.info = self._fetch_info(adapter, state.target.url, start)
            state.info_asked_at = state.scrapes
        model = adapter.served_model(samples) or state.info.model or ""
        return Result(state.target, up=True, duration=time.monotonic() - start, adapter=adapter,
                      info=state.info, model=model, samples=samples, spec=state.prev_spec, window=window)

    def _fetch_metrics(self, url: str, start: float) -> tuple[Samples, EngineAdapter]:
        body = self._get(url, start)
        try:
            samples = parse(body, keep=KEEP)
        except UserError as exc:
            raise ScrapeError("not_exposition", str(exc)) from None
        adapter = detect_adapter(samples)
        if adapter is None:
            raise ScrapeError("unknown_engine", f"{url}: no vLLM or SGLang metrics in the answer")
        return samples, adapter

    def _get(self, url: str, start: float) -> str:
        """GET with a deadline on the whole body (a slow trickle must not hold the scrape)."""
        deadline = start + self.timeout
        chunks: list[bytes] = []
        size = 0
        try:
            with self._client.stream("GET", url) as response:
                if response.status_code != 200:
                    raise ScrapeError("http_status", f"{url}: HTTP {response.status_code}")
                for chunk in response.iter_bytes():  # decoded: gzip from the engine is undone here
                    size += len(chunk)
                    if time.monotonic() > deadline:
                        raise ScrapeError("timeout", f"{url}: body not complete after {self.timeout:g}s")
                    if size > MAX_BODY_BYTES:
                        raise ScrapeError("not_exposition", f"{url}: body larger than {MAX_BODY_BYTES} bytes")
                    chunks.append(chunk)
        except httpx.TimeoutException:
            raise ScrapeError("timeout", f"{url}: no answer within {self.timeout:g}s") from None
        except (httpx.TransportError, httpx.InvalidURL) as exc:
            raise ScrapeError("connect", f"{url}: {type(exc).__name__}: {exc}") from None
        try:
            return b"".join(chunks).decode("utf-8")
        except UnicodeDecodeError:
            raise ScrapeError("not_exposition", f"{url}: body is not UTF-8 text") from None

    def _fetch_info(self, adapter: EngineAdapter, base: str, start: float) -> EngineInfo:
        """Version, model and draft from the engine's info endpoint; empty when none answers."""
        for path in adapter.info_paths:
            try:
                response = self._client.get(base + path, timeout=max(0.1, start + self.timeout - time.monotonic()))
                if response.status_code == 200:
                    return adapter.parse_info(response.json())
            except (httpx.HTTPError, ValueError):
                continue
        return EngineInfo()

    # -- window arithmetic --------------------------------------------------------------------
    def _window(self, state: TargetState, adapter: EngineAdapter, samples: Samples,
                now: float) -> tuple[Window, bool]:
        window = Window()
        reset = False
        spec = adapter.spec_counters(samples)
        if spec is not None:
            before = state.prev_spec
            if before is not None and (spec.steps < before.steps or spec.accepted < before.accepted):
                reset, before = True, None
            window.acceptance_length = acceptance_length(before, spec)
            window.draft_acceptance_ratio = _ratio_window(before, spec)
            window.position_ratios = _position_window(before, spec)
        state.prev_spec = spec
        reported = adapter.reported_acceptance(samples)
        if reported is not None:
            if spec is None and _finite(reported.length):
                window.acceptance_length = reported.length
            if window.draft_acceptance_ratio is None and _finite(reported.ratio):
                window.draft_acceptance_ratio = reported.ratio
        # While no verification step happens the last values stay (the rule).
        for name in ("acceptance_length", "draft_acceptance_ratio"):
            if getattr(window, name) is None:
                setattr(window, name, getattr(state.last, name))
        if not window.position_ratios:
            window.position_ratios = state.last.position_ratios
        state.last = Window(window.acceptance_length, window.draft_acceptance_ratio, window.position_ratios)

        generated = adapter.read(samples, adapter.metrics.generation_tokens)
        prompt = adapter.read(samples, adapter.metrics.prompt_tokens)
        if generated is not None or prompt is not None:
            tokens = (now, generated or 0.0, prompt or 0.0)
            if state.prev_tokens is not None and tokens[0] > state.prev_tokens[0]:
                t0, g0, p0 = state.prev_tokens
                reset = reset or tokens[1] < g0 or tokens[2] < p0
                window.generation_tps = _increase(g0, tokens[1]) / (now - t0)
                window.prompt_tps = _increase(p0, tokens[2]) / (now - t0)
            state.prev_tokens = tokens
        return window, reset


def _increase(before: float, after: float) -> float:
    """Counter increase; after a reset the counter restarted from zero (as Prometheus' rate assumes)."""
    return after - before if after >= before else after


def _ratio_window(before: SpecCounters | None, after: SpecCounters) -> float | None:
    if after.drafted is None:
        return None
    drafted0 = before.drafted or 0.0 if before else 0.0
    accepted0 = before.accepted if before else 0.0
    drafted = after.drafted - drafted0
    return (after.accepted - accepted0) / drafted if drafted > 0 else None


def _position_window(before: SpecCounters | None, after: SpecCounters) -> dict[int, float]:
    steps = after.steps - (before.steps if before else 0.0)
    if steps <= 0:
        return {}
    old = before.accepted_per_position if before else {}
    return {pos: (value - old.get(pos, 0.0)) / steps
            for pos, value in sorted(after.accepted_per_position.items())[:MAX_POSITIONS]}


def _finite(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value)
