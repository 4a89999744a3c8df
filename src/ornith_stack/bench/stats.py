"""Small arithmetic shared by the suites and the report: medians, spreads, ratios."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from ornith_stack.bench.result import Distribution, Summary


def clean(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None]


def summary(values: Iterable[float | None]) -> Summary:
    """Median and spread of the values that exist; n counts them."""
    found = clean(values)
    if not found:
        return Summary()
    return Summary(n=len(found), median=statistics.median(found), min=min(found), max=max(found),
                   stdev=statistics.stdev(found) if len(found) > 1 else 0.0)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def throughput(tokens: Iterable[int | None], start: float, end: float) -> float | None:
    """Total output tokens over the wall time from the first request sent to the last token received
    (seed 004: 'total output tokens divided by end-to-end wall time')."""
    total = sum(t for t in tokens if t)
    return total / (end - start) if end > start and total else None


def percentile(found: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation between ranks (numpy's default, as the peers use)."""
    ordered = sorted(found)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution(values: Iterable[float | None]) -> Distribution:
    """Mean, median, p90 and p99 (with stdev, min and max) of the values that exist, as the peers'
    serving benchmarks report latencies."""
    found = clean(values)
    if not found:
        return Distribution()
    return Distribution(n=len(found), mean=statistics.fmean(found), median=percentile(found, 50),
                        p90=percentile(found, 90), p99=percentile(found, 99), stdev=statistics.pstdev(found),
                        min=min(found), max=max(found))
