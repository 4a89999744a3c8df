"""One collector per concern; each turns the scrape results into fresh metric families.

`ExporterCollector` is what the registry holds: on every Prometheus scrape it scrapes all targets once
and hands the results to each concern's collector, so no family outlives the scrape that made it and
label sets cannot pile up.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric as Family
from prometheus_client.registry import Collector

from ornith_stack.engines.exposition import Samples
from ornith_stack.exporter import catalogue as C
from ornith_stack.exporter.canary import Canary
from ornith_stack.exporter.scrape import Result, Scraper, TargetState

Families = Iterator[Family]


def family(metric: C.Metric) -> GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily:
    """An empty family for a catalogue entry: name, help, type and labels come from the catalogue only."""
    cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily, "histogram": HistogramMetricFamily}[metric.kind]
    return cls(metric.name, metric.help, labels=list(metric.labels))


def engine_labels(r: Result) -> list[str]:
    return [r.target.url, r.target.profile, r.adapter.kind if r.adapter else "", r.model]


def _up(results: Sequence[Result]) -> list[Result]:
    return [r for r in results if r.up and r.adapter is not None]


def collect_engine(results: Sequence[Result]) -> Families:
    up, info = family(C.ENGINE_UP), family(C.ENGINE_INFO)
    for r in results:
        up.add_metric([r.target.url, r.target.profile], 1.0 if r.up else 0.0)
    for r in _up(results):
        info.add_metric([r.target.url, r.target.profile, r.adapter.kind, r.info.version or "", r.model,
                         r.info.draft or r.target.draft], 1.0)
    yield from (up, info)


def collect_spec(results: Sequence[Result]) -> Families:
    length, ratio = family(C.SPEC_ACCEPTANCE_LENGTH), family(C.SPEC_DRAFT_ACCEPTANCE_RATIO)
    position, steps = family(C.SPEC_POSITION_ACCEPTANCE_RATIO), family(C.SPEC_STEPS)
    accepted, drafted = family(C.SPEC_ACCEPTED_TOKENS), family(C.SPEC_DRAFT_TOKENS)
    per_pos = family(C.SPEC_ACCEPTED_PER_POSITION)
    for r in _up(results):
        labels, w = engine_labels(r), r.window
        _add(length, labels, w.acceptance_length)
        _add(ratio, labels, w.draft_acceptance_ratio)
        for pos, value in w.position_ratios.items():
            _add(position, [*labels, str(pos)], value)
        if r.spec is not None:
            _add(steps, labels, r.spec.steps)
            _add(accepted, labels, r.spec.accepted)
            _add(drafted, labels, r.spec.drafted)
            for pos, value in sorted(r.spec.accepted_per_position.items())[: C.MAX_POSITIONS]:
                _add(per_pos, [*labels, str(pos)], value)
    yield from (length, ratio, position, steps, accepted, drafted, per_pos)


def collect_throughput(results: Sequence[Result]) -> Families:
    gen_rate, prompt_rate = family(C.GENERATION_TOKENS_PER_SECOND), family(C.PROMPT_TOKENS_PER_SECOND)
    gen, prompt = family(C.GENERATION_TOKENS), family(C.PROMPT_TOKENS)
    for r in _up(results):
        labels, names = engine_labels(r), r.adapter.metrics
        _add(gen_rate, labels, r.window.generation_tps)
        _add(prompt_rate, labels, r.window.prompt_tps)
        _add(gen, labels, r.adapter.read(r.samples, names.generation_tokens))
        _add(prompt, labels, r.adapter.read(r.samples, names.prompt_tokens))
    yield from (gen_rate, prompt_rate, gen, prompt)


def collect_requests(results: Sequence[Result]) -> Families:
    running, waiting, kv = family(C.REQUESTS_RUNNING), family(C.REQUESTS_WAITING), family(C.KV_CACHE_USAGE)
    for r in _up(results):
        labels, names = engine_labels(r), r.adapter.metrics
        _add(running, labels, r.adapter.read(r.samples, names.requests_running))
        _add(waiting, labels, r.adapter.read(r.samples, names.requests_waiting))
        # Several engine cores (vLLM data parallel) or tp ranks each report a share: the mean is the pool's.
        _add(kv, labels, r.samples.mean(names.kv_cache_usage))
    yield from (running, waiting, kv)


def collect_latency(results: Sequence[Result]) -> Families:
    pairs = ((C.TTFT, "ttft"), (C.ITL, "itl"), (C.E2E, "e2e"))
    families = {metric.name: family(metric) for metric, _ in pairs}
    for r in _up(results):
        for metric, field_name in pairs:
            histogram = passthrough_histogram(r.samples, getattr(r.adapter.metrics, field_name))
            if histogram is not None:
                buckets, total = histogram
                families[metric.name].add_metric(engine_labels(r), buckets, total)
    yield from families.values()


def passthrough_histogram(samples: Samples, name: str) -> tuple[list[tuple[str, float]], float] | None:
    """An engine histogram summed over its own label sets (engine cores), buckets kept as the engine has them."""
    per_le: dict[float, float] = defaultdict(float)
    for sample in samples.get(f"{name}_bucket", []):
        le = sample.labels.get("le")
        try:
            per_le[float(le)] += sample.value  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
    if not per_le or math.inf not in per_le:
        return None
    buckets = [("+Inf" if le == math.inf else _le(le), value) for le, value in sorted(per_le.items())]
    return buckets, samples.total(f"{name}_sum") or 0.0


def _le(value: float) -> str:
    return repr(value) if value != int(value) else f"{value:.1f}"


def collect_self(states: Sequence[TargetState], results: Sequence[Result]) -> Families:
    duration, scrapes = family(C.SCRAPE_DURATION), family(C.SCRAPES)
    errors, resets = family(C.SCRAPE_ERRORS), family(C.COUNTER_RESETS)
    for state, r in zip(states, results, strict=True):
        labels = [state.target.url, state.target.profile]
        duration.add_metric(labels, r.duration)
        scrapes.add_metric(labels, state.scrapes)
        resets.add_metric(labels, state.resets)
        for reason in C.ERROR_REASONS:
            errors.add_metric([*labels, reason], state.errors.get(reason, 0))
    yield from (duration, scrapes, errors, resets)


def collect_canary(canary: Canary | None) -> Families:
    if canary is None:
        return
    success, correct = family(C.CANARY_SUCCESS), family(C.CANARY_CORRECT)
    ttft, rate = family(C.CANARY_TTFT), family(C.CANARY_DECODE_RATE)
    runs, last = family(C.CANARY_RUNS), family(C.CANARY_LAST_RUN)
    for target, state in canary.snapshot():
        labels = [target.url, target.profile]
        for outcome in C.CANARY_OUTCOMES:
            runs.add_metric([*labels, outcome], state.counts.get(outcome, 0))
        if state.finished_at is None:
            continue
        success.add_metric(labels, 1.0 if state.success else 0.0)
        last.add_metric(labels, state.finished_at)
        if state.success:
            correct.add_metric(labels, 1.0 if state.correct else 0.0)
            _add(ttft, labels, state.ttft)
            _add(rate, labels, state.decode_rate)
    yield from (success, correct, ttft, rate, runs, last)


def _add(fam: GaugeMetricFamily | CounterMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None and not math.isnan(value):
        fam.add_metric(labels, value)


class ExporterCollector(Collector):
    """The registry's only collector: one round of target scrapes per Prometheus scrape."""

    def __init__(self, scraper: Scraper, canary: Canary | None = None) -> None:
        self.scraper, self.canary = scraper, canary

    def collect(self) -> Iterable[Family]:
        results = self.scraper.scrape_all()
        yield from collect_engine(results)
        yield from collect_spec(results)
        yield from collect_throughput(results)
        yield from collect_requests(results)
        yield from collect_latency(results)
        yield from collect_canary(self.canary)
        yield from collect_self(self.scraper.states, results)

    def describe(self) -> Iterable[Family]:
        # Registering must not scrape the targets.
        return []
