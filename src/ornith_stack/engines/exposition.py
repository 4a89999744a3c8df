"""Prometheus text exposition, read into a flat index of samples by sample name.

Engines export counters as `<name>_total` and histograms as `_bucket`/`_sum`/`_count`; indexing by the
sample name (not the family name) lets adapters use the names exactly as `/metrics` shows them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from ornith_stack.errors import UserError


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


class Samples(dict[str, list[Sample]]):
    """Sample name -> samples; helpers sum or pick across label sets."""

    def total(self, name: str, **match: str) -> float | None:
        """Sum of a sample over label sets matching `match`; None if the engine does not export it."""
        found = [s.value for s in self.get(name, []) if _matches(s.labels, match)]
        finite = [v for v in found if not math.isnan(v)]
        return sum(finite) if finite else None

    def mean(self, name: str, **match: str) -> float | None:
        found = [s.value for s in self.get(name, []) if _matches(s.labels, match) and not math.isnan(s.value)]
        return sum(found) / len(found) if found else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """Values of `name` summed per value of `label` (e.g. acceptance per draft position)."""
        result: dict[str, float] = defaultdict(float)
        for sample in self.get(name, []):
            if label in sample.labels and not math.isnan(sample.value):
                result[sample.labels[label]] += sample.value
        return dict(result)

    def first_label(self, name: str, label: str) -> str | None:
        for sample in self.get(name, []):
            if label in sample.labels:
                return sample.labels[label]
        return None


def parse(text: str) -> Samples:
    """Parse exposition text; garbage (HTML, truncated lines) is a UserError naming the problem."""
    samples = Samples()
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append(Sample(dict(s.labels), float(s.value)))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise UserError(f"not Prometheus exposition text: {exc}") from None
    return samples


def _matches(labels: dict[str, str], match: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())
