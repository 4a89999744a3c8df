"""Small arithmetic shared by the suites and the report: medians, spreads, ratios."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any


def clean(values: Iterable[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None]


def summary(values: Iterable[float | None]) -> dict[str, Any]:
    """Median and spread of the values that exist; n counts them."""
    found = clean(values)
    if not found:
        return {"n": 0, "median": None, "min": None, "max": None, "stdev": None}
    return {
        "n": len(found),
        "median": statistics.median(found),
        "min": min(found),
        "max": max(found),
        "stdev": statistics.stdev(found) if len(found) > 1 else 0.0,
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def throughput(tokens: Iterable[int | None], start: float, end: float) -> float | None:
    """Total output tokens over the wall time from the first request sent to the last token received
    (seed 004: 'total output tokens divided by end-to-end wall time')."""
    total = sum(t for t in tokens if t)
    return total / (end - start) if end > start and total else None
