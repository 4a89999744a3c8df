"""Prometheus text exposition, read into a flat index of samples by sample name: the one metrics parser.

Engines export counters as `<name>_total` and histograms as `_bucket`/`_sum`/`_count`; indexing by the
sample name (not the family name) lets adapters use the names exactly as `/metrics` shows them.

A whole body (status, the bench, the tuner) is read by prometheus_client's parser. The exporter's scrape
reads a few dozen kept names on every scrape of every target, and there client_python's parser is too slow
(a recorded 97 kB SGLang body: 38 ms against 2 ms here, measured; 64 targets per scrape): `keep` takes the
linear one-pass line reader below, which checks every line as strictly (exemplars accepted, NaN and Inf
values read as floats, a body cut mid-line refused) and also refuses a series exposed twice.
"""

from __future__ import annotations

import math
import re
import time
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from ornith_stack.errors import UserError


class BadExposition(UserError):
    """Exposition text that cannot be trusted; `reason` says why: not_exposition (garbage), truncated (the
    body ends mid-line), duplicate (a series exposed twice, which a sum would double)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


class Samples(dict[str, list[Sample]]):
    """Sample name -> samples; helpers sum or pick across label sets."""

    def total(self, name: str, **match: str) -> float | None:
        """Sum of a sample over label sets matching `match`; None if the engine does not export it, NaN if
        any of them is NaN (a count that cannot be trusted is not a smaller count)."""
        found = [s.value for s in self.get(name, []) if _matches(s.labels, match)]
        return sum(found) if found else None

    def mean(self, name: str, **match: str) -> float | None:
        found = [s.value for s in self.get(name, []) if _matches(s.labels, match) and not math.isnan(s.value)]
        return sum(found) / len(found) if found else None

    def max(self, name: str, **match: str) -> float | None:
        """The largest value over label sets (e.g. the fullest of several data-parallel ranks' KV pools)."""
        found = [s.value for s in self.get(name, []) if _matches(s.labels, match) and not math.isnan(s.value)]
        return max(found) if found else None

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


def parse(text: str, keep: Collection[str] | None = None, deadline: float | None = None) -> Samples:
    """Parse exposition text; garbage (HTML, truncated lines) is a BadExposition naming the problem.

    With `keep` (sample names), every line is still checked but only those samples are indexed: the
    exporter reads a few dozen names out of a thousand lines per scrape. A kept series (name and label
    set) that appears twice is an error, not a sum: an engine exposing a family twice would read double. This path reads each line once,
    left to right, so its time grows linearly with the body (a 16 kB line, or a 16 MB body, included).
    With `deadline` (time.monotonic()), a parse still running then raises TimeoutError.
    """
    if keep is not None:
        return _parse_kept(text, frozenset(keep), deadline)
    samples = Samples()
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append(Sample(dict(s.labels), float(s.value)))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise BadExposition("not_exposition", f"not Prometheus exposition text: {exc}") from None
    return samples


def _matches(labels: dict[str, str], match: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


# One sample line. Every quantifier is possessive (Python 3.11): once a part has matched it never gives
# characters back, so a line is accepted or rejected in one left-to-right pass, however long it is.
_VALUE_TEXT = r'"[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"'
_PAIR_TEXT = r"[ \t]*+[a-zA-Z_][a-zA-Z0-9_]*+[ \t]*+=[ \t]*+" + _VALUE_TEXT + r"[ \t]*+"
_LABELS_TEXT = r"\{(?:" + _PAIR_TEXT + r"(?:," + _PAIR_TEXT + r")*+,?+)?+[ \t]*+\}"
# A timestamp: milliseconds in the Prometheus text format, seconds with a fraction in OpenMetrics.
_TIMESTAMP_TEXT = r"(?:[ \t]++-?[0-9]++(?:\.[0-9]++)?+(?:[eE][-+]?[0-9]++)?+)?+"
_LINE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*+)"  # sample name
    r"(" + _LABELS_TEXT + r")?+"  # labels
    r"[ \t]++([^ \t#]++)"
    + _TIMESTAMP_TEXT  # value and optional timestamp
    +
    # An OpenMetrics exemplar (`# {trace_id="..."} 0.5 1700000000.1`): checked, not kept.
    r"(?:[ \t]++#[ \t]++"
    + _LABELS_TEXT
    + r"[ \t]++[^ \t#]++"
    + _TIMESTAMP_TEXT
    + r")?+[ \t]*+"
)
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*+)[ \t]*+=[ \t]*+"([^"\\\n]*+(?:\\.[^"\\\n]*+)*+)"')
_ESCAPE = re.compile(r'\\[\\"n]')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
# Lines between two looks at the clock while parsing against a deadline.
_CLOCK_EVERY = 2048


def _parse_kept(text: str, keep: frozenset[str], deadline: float | None) -> Samples:
    if text and not text.endswith("\n"):
        # The format ends every line, the last included, with a line feed: a missing one is a cut body.
        raise BadExposition("truncated", "not Prometheus exposition text: the body ends mid-line (truncated)")
    samples = Samples()
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    match_line = _LINE.fullmatch
    for number, line in enumerate(text.split("\n"), 1):
        if deadline is not None and number % _CLOCK_EVERY == 0 and time.monotonic() > deadline:
            raise TimeoutError(f"parsing not finished by the deadline (line {number})")
        if not line or line[0] == "#":
            continue
        match = match_line(line)
        if match is None:
            raise BadExposition("not_exposition", f"not Prometheus exposition text: line {number}: {line[:80]!r}")
        name, labels, value = match.groups()
        try:
            number_value = float(value)
        except ValueError:
            raise BadExposition(
                "not_exposition", f"not Prometheus exposition text: line {number}: bad value {value[:40]!r}"
            ) from None
        if name in keep:
            pairs = _labels(labels)
            series = (name, frozenset(pairs.items()))
            if series in seen:
                raise BadExposition("duplicate", f"line {number}: series {name}{labels or ''} exposed twice")
            seen.add(series)
            samples.setdefault(name, []).append(Sample(pairs, number_value))
    return samples


def _labels(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    # Most values hold no escape: unescaping only those that do keeps a 100,000-line histogram cheap.
    return {k: _ESCAPE.sub(_unescape, v) if "\\" in v else v for k, v in _PAIR.findall(text)}


def _unescape(match: re.Match[str]) -> str:
    return _UNESCAPE[match.group(0)]
