"""Scraping engine targets: fetch and parse under one deadline, recognise the engine, read its figures.

The exporter keeps no measurement window: every scrape reads the engines' counters afresh and passes
them on, so two Prometheus servers (or a curl) scraping the same exporter see the same numbers.
A `TargetState` holds only what must outlive a scrape (the engine kind, its info answer, the last
counters for restart detection, error counts), so memory does not grow with time or input.
Everything engine-specific runs inside one target's try block: one target cannot fail another.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from ornith_stack.deployment import METRICS_PATH
from ornith_stack.engines import ADAPTERS, EngineAdapter, EngineInfo, detect_adapter
from ornith_stack.exporter import catalogue as C
from ornith_stack.urls import redact
from ornith_stack.wire.http import METRICS_BYTES, WireError, bearer, fetch
from ornith_stack.wire.metrics import BadExposition, Samples, parse

log = logging.getLogger(__name__)
# Every sample name any adapter reads: the parser indexes only these.
KEEP = frozenset(name for adapter in ADAPTERS.values() for name in adapter.sample_names())
# An engine that did not say its version is asked again after this many scrapes.
INFO_RETRY_SCRAPES = 20
Labels = tuple[str, ...]
Buckets = list[tuple[str, float]]


class ScrapeError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


# The catalogue's error reason (C.ERROR_REASONS) of each failed request (wire.http.REASONS) it names otherwise.
WIRE_REASONS = {"broken": "connect", "bad_encoding": "not_exposition"}


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
    # The engine behind the target: its kind, the address that answered and the URL's path (Reply.peer).
    identity: str = ""
    # The label of an earlier target reaching the same engine: this one's figures are reported there.
    duplicate_of: str | None = None


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
    # The scrape of this target running now: every exporter answer in the meantime waits for it (single
    # flight), so a healthy target reads up to any number of concurrent scrapers and gets one request.
    in_flight: Future[Result] | None = field(default=None, repr=False)
    duplicate_of: str | None = None  # as last reported, to log a change once

    def count_error(self, reason: str) -> None:
        with self.lock:
            self.errors[reason] = self.errors.get(reason, 0) + 1


@dataclass
class Round:
    """One exporter answer's view of every target: the shared scrapes it waits for, until `deadline`."""

    scraper: Scraper
    start: float
    deadline: float
    futures: list[Future[Result]]

    def wait(self) -> None:
        wait(self.futures, timeout=max(0.0, self.deadline - time.monotonic()))

    def results(self) -> list[Result]:
        """Each target's result; a scrape still running now is a timeout for this answer only."""
        results = [self.scraper.outcome(state, future, self.start)
                   for state, future in zip(self.scraper.states, self.futures, strict=True)]
        return deduplicate(self.scraper.states, results)


def deduplicate(states: list[TargetState], results: list[Result]) -> list[Result]:
    """The results with every target that reaches the same engine as an earlier one (localhost and
    127.0.0.1, a service name and its address) emptied of figures, so no total counts an engine twice."""
    first: dict[str, Target] = {}
    kept = []
    for state, result in zip(states, results, strict=True):
        owner = first.setdefault(result.identity, result.target) if result.up and result.identity else result.target
        same_as = owner.label if owner is not result.target else None
        if same_as is not None:
            result = replace(result, values={}, histograms={}, duplicate_of=same_as)
        with state.lock:
            changed, state.duplicate_of = state.duplicate_of != same_as, same_as
        if changed and same_as is not None:
            log.warning("%s reaches the same engine as %s (%s): its figures are reported once, under %s",
                        result.target.label, same_as, result.identity, same_as)
        kept.append(result)
    return kept


class Scraper:
    """Scrapes all targets concurrently; `scrape_all` is one exporter scrape.

    Concurrent calls (two Prometheus servers, Grafana, a curl) share the scrape of a target already in
    flight instead of starting another: one request per target at a time, whatever the number of
    scrapers, and each scraper waits for it within its own deadline.
    """

    def __init__(self, targets: list[Target], timeout: float = 3.0) -> None:
        self.timeout = timeout
        self.states = [TargetState(t) for t in targets]
        # One scrape per target runs at a time, so one worker per target: no target waits for another's.
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(targets)), thread_name_prefix="scrape")

    def begin(self, budget: float | None = None) -> Round:
        """Start (or join) a scrape of every target; the round's deadline is `budget` seconds away (at most
        --timeout). A scrape started here runs to --timeout whoever started it, so a scraper with a short
        budget never cuts short the answer a later one with a longer budget is waiting for."""
        budget = self.timeout if budget is None else max(0.05, min(self.timeout, budget))
        start = time.monotonic()
        futures = []
        for state in self.states:
            with state.lock:
                if state.in_flight is None or state.in_flight.done():
                    state.in_flight = self._pool.submit(self._scrape_one, state, start + self.timeout)
                futures.append(state.in_flight)
        return Round(self, start, start + budget, futures)

    def scrape_all(self, budget: float | None = None) -> list[Result]:
        """One round over every target, each answered within `budget` seconds (at most --timeout)."""
        round_ = self.begin(budget)
        round_.wait()
        return round_.results()

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
                _, adapter, _ = self._fetch_metrics(state.target, time.monotonic() + self.timeout)
            except (ScrapeError, WireError, TimeoutError):
                return None
            with state.lock:
                state.adapter = state.adapter or adapter
        return state.adapter

    # -- one target ---------------------------------------------------------------------------
    def outcome(self, state: TargetState, future: Future[Result], start: float) -> Result:
        if future.done():
            return future.result()  # its error, if any, was counted once by the scrape itself
        # This answer stops waiting; the scrape runs on, for the scrapers still waiting for it.
        result = _down(state, start, "timeout", f"{state.target.public}: no answer within the deadline")
        state.count_error("timeout")
        return result

    def _scrape_one(self, state: TargetState, deadline: float) -> Result:
        start = time.monotonic()
        with state.lock:
            state.scrapes += 1
        try:
            result = self._scrape_checked(state, start, deadline)
        except ScrapeError as exc:
            result = _down(state, start, exc.reason, str(exc))
        except WireError as exc:
            result = _down(state, start, WIRE_REASONS.get(exc.reason, exc.reason), str(exc))
        except TimeoutError as exc:
            result = _down(state, start, "timeout", f"{state.target.public}: {exc}")
        except Exception as exc:  # a bug must cost one target one scrape, never the exporter
            log.exception("scraping %s failed", state.target.public)
            result = _down(state, start, "internal", f"{type(exc).__name__}: {exc}")
        if result.reason is not None:
            state.count_error(result.reason)
        return result

    def _scrape_checked(self, state: TargetState, start: float, deadline: float) -> Result:
        samples, adapter, identity = self._fetch_metrics(state.target, deadline)
        with state.lock:
            info = state.info if adapter is state.adapter else None
            ask = info is None or (info.version is None and state.scrapes - state.info_asked_at >= INFO_RETRY_SCRAPES)
            if ask:
                state.info_asked_at = state.scrapes
        if ask:
            info = self._fetch_info(adapter, state.target, deadline)
        assert info is not None
        skipped: dict[str, int] = defaultdict(int)
        shown = replace(info, version=bounded(info.version, skipped), draft=bounded(info.draft, skipped))
        result = Result(state.target, up=True, duration=0.0, adapter=adapter, info=shown,
                        model=bounded(adapter.served_model(samples) or info.model, skipped) or "", identity=identity)
        read_figures(result, samples, skipped)
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

    def _fetch_metrics(self, target: Target, deadline: float) -> tuple[Samples, EngineAdapter, str]:
        """The engine's samples, its adapter and the address that answered (see `Reply.peer`)."""
        answer = fetch(target.url + METRICS_PATH, deadline - time.monotonic(), headers=scrape_headers(target.api_key),
                       limit=METRICS_BYTES)
        where = target.public
        if answer.status != 200:
            raise ScrapeError("http_status", f"{where}/metrics: HTTP {answer.status}")
        try:
            samples = parse(answer.body.decode("utf-8"), keep=KEEP, deadline=deadline)
        except UnicodeDecodeError:
            raise ScrapeError("not_exposition", f"{where}/metrics: body is not UTF-8 text") from None
        except BadExposition as exc:
            raise ScrapeError(exc.reason, f"{where}/metrics: {exc}") from None
        adapter = detect_adapter(samples)
        if adapter is None:
            raise ScrapeError("unknown_engine", f"{where}/metrics: no vLLM or SGLang metrics in the answer")
        return samples, adapter, f"{adapter.kind} {answer.peer}{urlsplit(target.url).path}"

    def _fetch_info(self, adapter: EngineAdapter, target: Target, deadline: float) -> EngineInfo:
        """Version, model and draft from the engine's info endpoint; empty when none answers in time or
        the answer is not what an engine sends. /metrics alone says whether a target is up."""
        for path in adapter.info_paths:
            try:
                answer = fetch(target.url + path, deadline - time.monotonic(), headers=scrape_headers(target.api_key))
                if answer.status == 200:
                    return adapter.parse_info(answer.json())
            except WireError:
                continue
            # Hostile JSON: 200,000 `[` make json.loads raise RecursionError, odd shapes trip the parser.
            except Exception:  # noqa: BLE001 - whatever an info answer does, it costs the version only
                continue
        return EngineInfo()


def _down(state: TargetState, start: float, reason: str, detail: str) -> Result:
    return Result(state.target, up=False, duration=time.monotonic() - start, error=detail, reason=reason)


def _first(rows: list[tuple[Labels, float]] | None) -> float:
    return rows[0][1] if rows else 0.0


# Counters whose going down means the engine restarted.
RESTART_COUNTERS = (C.SPEC_STEPS, C.GENERATION_TOKENS, C.PROMPT_TOKENS, C.DECODE_TOKENS)


# -- from engine samples to unified figures ---------------------------------------------------------
def bounded(value: str | None, skipped: dict[str, int]) -> str | None:
    """An engine-supplied label value (model, version, draft) cut to C.MAX_LABEL_LENGTH characters, the
    cut counted: a 1 MiB model name would otherwise be copied into every series of the target."""
    if value is None or len(value) <= C.MAX_LABEL_LENGTH:
        return value
    skipped["long_label"] += 1
    return value[: C.MAX_LABEL_LENGTH - 1] + "\u2026"


def rejected(metric: C.Metric, value: float) -> str | None:
    """Why an engine figure cannot be passed on (every catalogue figure is a count, a length or a ratio)."""
    if not math.isfinite(value):
        return "not_finite"
    if metric.unit == C.RATIO and not 0.0 <= value <= 1.0:
        return "out_of_range"
    return "negative" if value < 0 else None


def read_figures(result: Result, samples: Samples, skipped: dict[str, int]) -> None:
    """Fill `result` with the unified figures of one scrape, counting in `skipped` (by reason) every
    sample left out: not a valid figure, or past the caps on buckets and series per target."""
    adapter, values = result.adapter, result.values
    assert adapter is not None
    room = C.MAX_SERIES_PER_TARGET

    def fits(series: int) -> bool:
        nonlocal room
        if series > room:
            skipped["too_many_series"] += series
            return False
        room -= series
        return True

    def put(metric: C.Metric, value: float | None, extra: Labels = ()) -> None:
        if value is None:
            return
        reason = rejected(metric, value)
        if reason is not None:
            skipped[reason] += 1
        elif fits(1):
            values.setdefault(metric.name, []).append((extra, value))

    spec = adapter.spec_counters(samples, result.info)
    if spec is not None:
        put(C.SPEC_STEPS, spec.steps)
        put(C.SPEC_ACCEPTED_TOKENS, spec.accepted)
        put(C.SPEC_DRAFT_TOKENS, spec.drafted)
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
    put(C.REQUESTS_FINISHED, adapter.finished_requests(samples))
    put(C.REQUESTS_ABORTED, adapter.aborted_requests(samples))
    for metric, field_name in ((C.TTFT, "ttft"), (C.ITL, "itl"), (C.E2E, "e2e")):  # base.HISTOGRAMS
        histogram = passthrough_histogram(samples, getattr(names, field_name), skipped)
        if histogram is not None and fits(len(histogram[0]) + 2):  # buckets, _sum and _count
            result.histograms[metric.name] = histogram
    if spec is not None:  # last: past the series cap, draft positions go first
        for position, count in sorted(spec.accepted_per_position.items())[: C.MAX_POSITIONS]:
            put(C.SPEC_ACCEPTED_PER_POSITION, count, (str(position),))


def passthrough_histogram(samples: Samples, name: str, skipped: dict[str, int]) -> tuple[Buckets, float] | None:
    """An engine histogram summed over its own label sets (engine cores), buckets as the engine has them.

    None without a +Inf bucket. Counted in `skipped`: bad_bucket, an `le` that is not a number, NaN or
    -Inf, or a count that is not finite and not negative, cannot be placed and is left out; too_many_buckets,
    past C.MAX_BUCKETS the finite buckets are thinned evenly (a coarser histogram, still cumulative)."""
    per_le: dict[float, float] = defaultdict(float)
    for sample in samples.get(f"{name}_bucket", []):
        try:
            le = float(sample.labels.get("le", "nan"))
        except ValueError:
            le = math.nan
        if math.isnan(le) or le == -math.inf or not math.isfinite(sample.value) or sample.value < 0:
            skipped["bad_bucket"] += 1
            continue
        per_le[le] += sample.value
    if math.inf not in per_le:
        return None
    finite = sorted(le for le in per_le if le != math.inf)
    if len(finite) >= C.MAX_BUCKETS:
        keep = C.MAX_BUCKETS - 1
        chosen = [finite[round(i * (len(finite) - 1) / (keep - 1))] for i in range(keep)]
        skipped["too_many_buckets"] += len(finite) - keep
        finite = chosen
    buckets = [(_le(le), per_le[le]) for le in finite] + [("+Inf", per_le[math.inf])]
    total = samples.total(f"{name}_sum")
    return buckets, total if total is not None and math.isfinite(total) else 0.0


def _le(value: float) -> str:
    return repr(value) if value != int(value) else f"{value:.1f}"


def scrape_headers(api_key: str = "") -> dict[str, str]:
    return {"Accept": "text/plain;version=0.0.4", **bearer(api_key)}
