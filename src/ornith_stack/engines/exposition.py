"""Prometheus text exposition, read into a flat index of samples by sample name.

Engines export counters as `<name>_total` and histograms as `_bucket`/`_sum`/`_count`; indexing by the
sample name (not the family name) lets adapters use the names exactly as `/metrics` shows them.
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
    """Parse exposition text; garbage (HTML, truncated lines) is a UserError naming the problem.

    With `keep` (sample names), every line is still checked but only those samples are indexed: the
    exporter reads a few dozen names out of a thousand lines per scrape. This path reads each line once,
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
        raise UserError(f"not Prometheus exposition text: {exc}") from None
    return samples


def _matches(labels: dict[str, str], match: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# One label pair and what follows it up to the next pair or the closing brace. Each part matches one way
# only, so a line that fails to match is rejected after one pass over it (no backtracking blow-up).
_PAIR = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\\n]*(?:\\.[^"\\\n]*)*)"[ \t]*(,?)[ \t]*')
_CLOSE = re.compile(r"[ \t]*\}")
_ESCAPE = re.compile(r'\\[\\"n]')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
# Lines between two looks at the clock while parsing against a deadline.
_CLOCK_EVERY = 2048


def _parse_kept(text: str, keep: frozenset[str], deadline: float | None) -> Samples:
    if text and not text.endswith("\n"):
        # The format ends every line, the last included, with a line feed: a missing one is a cut body.
        raise UserError("not Prometheus exposition text: the body ends mid-line (truncated)")
    samples = Samples()
    for number, line in enumerate(text.split("\n"), 1):
        if deadline is not None and number % _CLOCK_EVERY == 0 and time.monotonic() > deadline:
            raise TimeoutError(f"parsing not finished by the deadline (line {number})")
        if not line or line.startswith("#"):
            continue
        name, labels, value = _parse_line(line, number, name_wanted=keep)
        if name in keep:
            samples.setdefault(name, []).append(Sample(labels, value))
    return samples


def _parse_line(line: str, number: int, name_wanted: frozenset[str]) -> tuple[str, dict[str, str], float]:
    """One sample line as (name, labels, value); labels are unescaped only for names in `name_wanted`."""
    match = _NAME.match(line)
    if match is None:
        raise _bad(number, line)
    name, pos, labels = match.group(0), match.end(), {}
    if line.startswith("{", pos):
        pos += 1
        closed = _CLOSE.match(line, pos)
        while closed is None:
            pair = _PAIR.match(line, pos)
            if pair is None:
                raise _bad(number, line)
            if name in name_wanted:
                labels[pair.group(1)] = _ESCAPE.sub(lambda m: _UNESCAPE[m.group(0)], pair.group(2))
            pos = pair.end()
            closed = _CLOSE.match(line, pos)
            if closed is None and not pair.group(3):
                raise _bad(number, line)
        pos = closed.end()
    rest = line[pos:]
    words = rest.split()
    if rest[:1] not in (" ", "\t") or not 1 <= len(words) <= 2 or (len(words) == 2 and not _is_int(words[1])):
        raise _bad(number, line)
    try:
        return name, labels, float(words[0])
    except ValueError:
        raise UserError(f"not Prometheus exposition text: line {number}: bad value {words[0][:40]!r}") from None


def _is_int(word: str) -> bool:
    return word.lstrip("-").isdigit()


def _bad(number: int, line: str) -> UserError:
    return UserError(f"not Prometheus exposition text: line {number}: {line[:80]!r}")
