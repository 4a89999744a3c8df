"""One collector per concern; each turns the scrape results into fresh metric families.

`ExporterCollector` is what the registry holds: on every Prometheus scrape it scrapes all targets once
and hands the results to each concern's collector, so no family outlives the scrape that made it and
label sets cannot pile up.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric as Family
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ornith_stack.exporter import catalogue as C
from ornith_stack.exporter.canary import Canary
from ornith_stack.exporter.scrape import Result, Scraper, TargetState

Families = Iterator[Family]


def family(metric: C.Metric) -> Any:  # a Gauge-, Counter- or HistogramMetricFamily, by the metric's kind
    """An empty family for a catalogue entry: name, help, type and labels come from the catalogue only."""
    cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily}[metric.kind]
    return cls(metric.name, metric.help, labels=list(metric.labels))


def engine_labels(r: Result) -> list[str]:
    return [r.target.label, r.target.profile, r.adapter.kind if r.adapter else "", r.model]


def _up(results: Sequence[Result]) -> list[Result]:
    return [r for r in results if r.up and r.adapter is not None]


def collect_engine(results: Sequence[Result]) -> Families:
    up, info = family(C.ENGINE_UP), family(C.ENGINE_INFO)
    for r in results:
        up.add_metric([r.target.label, r.target.profile], 1.0 if r.up else 0.0)
    for r in _up(results):
        assert r.adapter is not None
        if r.duplicate_of is not None:  # one engine, one info series: under the target seen first
            continue
        info.add_metric([r.target.label, r.target.profile, r.adapter.kind, r.info.version or "", r.model,
                         r.info.draft or r.target.draft], 1.0)
    yield from (up, info)


def collect_figures(results: Sequence[Result]) -> Families:
    """Every engine figure of the catalogue (counters, gauges, histograms), one family per name."""
    metrics = [m for m in C.CATALOGUE if m.labels[: len(C.ENGINE)] == C.ENGINE]
    families = {m.name: family(m) for m in metrics}
    for r in _up(results):
        labels = engine_labels(r)
        for name, rows in r.values.items():
            for extra, value in rows:
                families[name].add_metric([*labels, *extra], value)
        for name, (buckets, total) in r.histograms.items():
            families[name].add_metric(labels, buckets, total)
    yield from families.values()


def collect_self(states: Sequence[TargetState], results: Sequence[Result]) -> Families:
    duration, scrapes = family(C.SCRAPE_DURATION), family(C.SCRAPES)
    errors, restarts, skipped = family(C.SCRAPE_ERRORS), family(C.ENGINE_RESTARTS), family(C.SKIPPED_SAMPLES)
    duplicate = family(C.DUPLICATE_TARGET)
    for state, r in zip(states, results, strict=True):
        labels = [state.target.label, state.target.profile]
        if r.duplicate_of is not None:
            duplicate.add_metric([*labels, r.duplicate_of], 1.0)
        with state.lock:
            duration.add_metric(labels, r.duration)
            scrapes.add_metric(labels, state.scrapes)
            restarts.add_metric(labels, state.restarts)
            for reason in C.ERROR_REASONS:
                errors.add_metric([*labels, reason], state.errors.get(reason, 0))
            for reason in C.SKIP_REASONS:
                skipped.add_metric([*labels, reason], state.skipped.get(reason, 0))
    yield from (duration, scrapes, errors, restarts, skipped, duplicate)


def collect_canary(canary: Canary | None) -> Families:
    if canary is None:
        return
    success, correct = family(C.CANARY_SUCCESS), family(C.CANARY_CORRECT)
    ttft, rate = family(C.CANARY_TTFT), family(C.CANARY_DECODE_RATE)
    runs, last = family(C.CANARY_RUNS), family(C.CANARY_LAST_RUN)
    for target, state in canary.snapshot():
        labels = [target.label, target.profile]
        for outcome in C.CANARY_OUTCOMES:
            runs.add_metric([*labels, outcome], state.counts.get(outcome, 0))
        if state.finished_at is None:
            continue
        success.add_metric(labels, 1.0 if state.success else 0.0)
        last.add_metric(labels, state.finished_at)
        if state.success:
            if state.correct is not None:
                correct.add_metric(labels, 1.0 if state.correct else 0.0)
            _add(ttft, labels, state.ttft)
            _add(rate, labels, state.decode_rate)
    yield from (success, correct, ttft, rate, runs, last)


def _add(fam: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None and not math.isnan(value):
        fam.add_metric(labels, value)


class HostCollector(Protocol):
    """A collector of the exporter's own machine (exporter/host.py: the GPUs, the model cache's disk)."""

    def collect(self) -> Families: ...


def collect_host(host: Sequence[tuple[str, HostCollector]]) -> Families:
    """Each host collector's families, and how long each took (the exporter instruments itself)."""
    if not host:
        return
    durations = family(C.COLLECT_DURATION)
    for name, collector in host:
        start = time.monotonic()
        families = list(collector.collect())
        durations.add_metric([name], time.monotonic() - start)
        yield from families
    yield durations


class ExporterCollector(Collector):
    """The registry's only collector: one round of target scrapes per Prometheus scrape.

    `budget` (seconds) is this scrape's deadline, from Prometheus' X-Prometheus-Scrape-Timeout-Seconds;
    `with_budget` gives a collector for one request, so concurrent scrapes keep their own deadlines, and
    `with_results` one for results already in (the server waits for them without holding a thread).
    `host`: the host collectors by name (C.HOST_COLLECTORS), run after the engines' figures.
    """

    def __init__(self, scraper: Scraper, canary: Canary | None = None, budget: float | None = None,
                 results: list[Result] | None = None, host: Sequence[tuple[str, HostCollector]] = ()) -> None:
        self.scraper, self.canary, self.budget, self.results = scraper, canary, budget, results
        self.host = tuple(host)

    def with_budget(self, budget: float | None) -> ExporterCollector:
        return ExporterCollector(self.scraper, self.canary, budget, host=self.host)

    def with_results(self, results: list[Result]) -> ExporterCollector:
        return ExporterCollector(self.scraper, self.canary, results=results, host=self.host)

    def collect(self) -> Iterable[Family]:
        results = self.results if self.results is not None else self.scraper.scrape_all(self.budget)
        yield from collect_engine(results)
        yield from collect_figures(results)
        yield from collect_canary(self.canary)
        yield from collect_self(self.scraper.states, results)
        yield from collect_host(self.host)

    def describe(self) -> Iterable[Family]:
        # Registering must not scrape the targets.
        return []


def render(families: Iterable[Family]) -> bytes:
    """Families as Prometheus text exposition 0.0.4 (what prometheus_client's generate_latest writes,
    about four times faster: 64 targets make ten thousand samples per scrape)."""
    out: list[str] = []
    for fam in families:
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        kind = "untyped" if fam.type == "unknown" else fam.type
        doc = fam.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        for sample in fam.samples:
            if sample.name.endswith("_created"):
                continue
            labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels.items())
            out.append(f"{sample.name}{{{labels}}} {floatToGoString(sample.value)}\n" if labels
                       else f"{sample.name} {floatToGoString(sample.value)}\n")
    return "".join(out).encode()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
