"""A load test that counts (issue 43): steady streaming requests through a change, and what failed.

The bench's own client and load loop (client.EngineClient, serving.run_load) send `requests` streaming chat
completions, evenly spaced at `rate` per second with at most `max_concurrency` in flight, while an operator
(or a test) changes the deployment and marks the change window (`ChangeWindow.begin()` / `.end()`, from any
thread). Bounded in count (`requests`) and in time: the last request is sent at requests / rate seconds and
each may take the client's deadline at most.

The report counts requests sent, completed and failed, the failures split into those refused before their
stream began (the gateway could have retried them on another replica) and those that failed once it had
begun (HTTP 200 sent: in flight on a replica that died, with or without tokens yet; they cannot be saved), and gives TTFT and E2E percentiles of
the completed requests before, during and after the window. A request belongs to "before" when it ended
before the window began, to "after" when it was sent after the window ended, else to "during".
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from ornith_stack.bench import stats
from ornith_stack.bench.client import EngineClient, RequestSample
from ornith_stack.bench.result import Distribution
from ornith_stack.bench.serving import Load, run_load
from ornith_stack.errors import UserError

PHASES = ("before", "during", "after")
PROMPT = "Count from one to one hundred, one number per line."


@dataclass(frozen=True)
class SteadyLoad:
    """How many requests, how fast, how long each."""

    requests: int = 60
    rate: float = 2.0  # requests per second, evenly spaced
    max_concurrency: int = 8
    max_tokens: int = 64
    # Stop sending this long after the change window ended (None: send every request): `requests` is then a
    # bound, and the run lasts as long as the change did.
    after_s: float | None = None

    def __post_init__(self) -> None:
        if self.requests < 1 or not (0 < self.rate < math.inf) or self.max_concurrency < 1 or self.max_tokens < 1:
            raise UserError("steady load: requests, rate, max concurrency and max tokens must be positive, the rate finite")
        if self.after_s is not None and not 0 <= self.after_s < math.inf:
            raise UserError("steady load: the time to go on after the change must be 0 or more seconds")

    @property
    def sending_s(self) -> float:
        return self.requests / self.rate


class ChangeWindow:
    """When the change happened (wall clock), marked from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.began: float | None = None
        self.ended: float | None = None

    def begin(self) -> None:
        with self._lock:
            self.began = time.time()

    def end(self) -> None:
        with self._lock:
            self.ended = time.time()

    def over(self, after_s: float | None) -> bool:
        """Whether `after_s` seconds have passed since the window ended (never when `after_s` is None)."""
        with self._lock:
            return after_s is not None and self.ended is not None and time.time() >= self.ended + after_s

    def phase(self, sample: RequestSample, finished: float) -> str:
        """Where a request sent at sample.started_at and finished at `finished` (wall clock) falls."""
        if self.began is None or finished < self.began:
            return "before"
        if self.ended is not None and sample.started_at >= self.ended:
            return "after"
        return "during"


@dataclass(frozen=True)
class Counts:
    sent: int = 0
    completed: int = 0
    failed_before_first_token: int = 0
    failed_streaming: int = 0
    ttft_s: Distribution = field(default_factory=Distribution)
    e2e_s: Distribution = field(default_factory=Distribution)

    @property
    def failed(self) -> int:
        return self.failed_before_first_token + self.failed_streaming


@dataclass(frozen=True)
class SteadyReport:
    total: Counts
    phases: dict[str, Counts]
    errors: dict[str, int]  # each failure message, counted
    window_s: float | None  # how long the change took

    def text(self) -> str:
        """The report as a table, one row per phase and the total."""
        lines = ["phase   sent  completed  failed  (before 1st token / streaming)  TTFT p50/p90/p99 s    E2E p50/p99 s"]
        for name, counts in [*self.phases.items(), ("total", self.total)]:
            t, e = counts.ttft_s, counts.e2e_s
            lines.append(f"{name:<7} {counts.sent:>4} {counts.completed:>10} {counts.failed:>7}  "
                         f"({counts.failed_before_first_token} / {counts.failed_streaming}){'':<22} "
                         f"{_s(t.median)}/{_s(t.p90)}/{_s(t.p99)}   {_s(e.median)}/{_s(e.p99)}")
        if self.window_s is not None:
            lines.append(f"change window: {self.window_s:.1f} s")
        lines += [f"failed {n}x: {message}" for message, n in self.errors.items()]
        return "\n".join(lines)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def streaming_failure(sample: RequestSample) -> bool:
    """A failed request whose stream had begun (HTTP 200: the gateway had committed it to a replica, which died
    before or while it sent tokens): it was in flight there, and no retry could save it."""
    return bool(sample.error) and (sample.accepted or sample.chunks > 0 or sample.ttft_s is not None)


def counts(samples: list[RequestSample]) -> Counts:
    ok = [s for s in samples if not s.error]
    streaming = sum(1 for s in samples if streaming_failure(s))
    return Counts(sent=len(samples), completed=len(ok), failed_streaming=streaming,
                  failed_before_first_token=len(samples) - len(ok) - streaming,
                  ttft_s=stats.distribution(s.ttft_s for s in ok), e2e_s=stats.distribution(s.e2e_s for s in ok))


def report(samples: list[RequestSample], window: ChangeWindow, finished: dict[int, float] | None = None) -> SteadyReport:
    """`finished`: when each sample (by id) ended, wall clock; else its start plus its E2E time."""
    by_phase: dict[str, list[RequestSample]] = {name: [] for name in PHASES}
    for sample in samples:
        end = (finished or {}).get(id(sample), sample.started_at + (sample.e2e_s or 0.0))
        by_phase[window.phase(sample, end)].append(sample)
    span = window.ended - window.began if window.began is not None and window.ended is not None else None
    errors = Counter(str(s.error) for s in samples if s.error)
    return SteadyReport(total=counts(samples), phases={n: counts(s) for n, s in by_phase.items()},
                        errors=dict(errors.most_common()), window_s=span)


def run_steady(client: EngineClient, model: str, load: SteadyLoad, window: ChangeWindow,
               prompt: str = PROMPT) -> SteadyReport:
    """Send the load through `client` and count it; every request streams exactly max_tokens tokens
    (ignore_eos), so each occupies a replica for as long as the next. Each prompt starts with its number: a
    cache-aware gateway then spreads them by load instead of sending one shared prefix to one replica."""
    bodies = [{"model": model, "messages": [{"role": "user", "content": f"{i}. {prompt}"}],
               "max_tokens": load.max_tokens, "temperature": 0, "ignore_eos": True} for i in range(load.requests)]
    finished: dict[int, float] = {}  # a refused request has no E2E time: when it ended, by the wall clock

    def done(sample: RequestSample) -> None:
        finished[id(sample)] = time.time()

    run = run_load(client, bodies,
                   Load(rate=load.rate, max_concurrency=load.max_concurrency, burstiness=math.inf), random.Random(0),
                   on_done=done, enough=lambda: window.over(load.after_s))
    if run.interrupted:
        raise KeyboardInterrupt
    return report(run.samples, window, finished)
