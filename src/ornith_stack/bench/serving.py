"""Load generation and serving metrics as `vllm bench serve` and SGLang's bench_serving define them.

Load: requests arrive at a rate (Poisson when burstiness is 1; gamma inter-arrival times with
shape = burstiness and scale = 1 / (rate x burstiness) otherwise, rescaled so N requests span N / rate
seconds as vLLM does; evenly spaced, 1 / rate apart, when burstiness is inf), and at most `max_concurrency` are in flight: with an infinite rate that is a
sustained concurrency over N prompts, a new request starting as soon as one ends.

Metrics over one run of N requests: TTFT, TPOT = (E2E - TTFT) / (output tokens - 1), ITL (one value per
gap between token chunks), E2E; request throughput = completed / duration, output tok/s = total output
tokens / duration (duration: first request sent to last request done); goodput = requests meeting
every SLO per second.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ornith_stack.bench import stats
from ornith_stack.bench.client import EngineClient, RequestSample
from ornith_stack.bench.result import RunMetrics, RunSpread, Sample
from ornith_stack.errors import UserError

SLO_KEYS = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class Load:
    """How requests of one level arrive: `rate` per second (inf: all at once) and a concurrency cap."""

    rate: float = math.inf
    max_concurrency: int | None = None
    burstiness: float = 1.0

    @property
    def label(self) -> str:
        rate = "inf" if math.isinf(self.rate) else f"{self.rate:g}/s"
        cap = "unbounded" if self.max_concurrency is None else str(self.max_concurrency)
        return f"rate {rate}, max concurrency {cap}"


@dataclass
class LoadRun:
    """The samples of the requests that finished, in the order they were sent, and the duration."""

    samples: list[RequestSample] = field(default_factory=list)
    duration_s: float = 0.0
    interrupted: bool = False  # Ctrl-C came during the run: the caller records it, then stops


def parse_goodput(words: list[str]) -> dict[str, float]:
    """`ttft:MS tpot:MS e2el:MS` (any subset), as `vllm bench serve --goodput` takes them."""
    slos: dict[str, float] = {}
    for word in words:
        key, _, value = word.partition(":")
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if key not in SLO_KEYS or number <= 0:
            raise UserError(f"--goodput {word!r}: expected KEY:MILLISECONDS with KEY one of {', '.join(SLO_KEYS)}")
        slos[key] = number
    return slos


def arrival_offsets(n: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Seconds after the start at which each of n requests is sent."""
    if burstiness <= 0:
        raise UserError(f"--burstiness {burstiness}: expected a positive number")
    if math.isinf(rate):
        return [0.0] * n
    if rate <= 0:
        raise UserError(f"--request-rate {rate}: expected a positive rate (requests per second) or inf")
    if math.isinf(burstiness):  # the gamma's limit: every gap is 1 / rate, evenly spaced arrivals
        return [(i + 1) / rate for i in range(n)]
    gaps = [rng.gammavariate(burstiness, 1.0 / (rate * burstiness)) for _ in range(n)]
    offsets = [sum(gaps[: i + 1]) for i in range(n)]
    # vLLM rescales so the N requests span exactly N / rate seconds, whatever the draw.
    scale = (n / rate) / offsets[-1] if offsets and offsets[-1] > 0 else 1.0
    return [o * scale for o in offsets]


def run_load(client: EngineClient, bodies: list[dict[str, Any]], load: Load, rng: random.Random,
             on_done: Callable[[RequestSample], None] | None = None,
             enough: Callable[[], bool] | None = None) -> LoadRun:
    """Send every body under `load` and wait for all of them, each request a task on the client's event
    loop (as `vllm bench serve` does): a request starts as soon as its arrival time has come and a slot
    is free. Ctrl-C (or `client.stop` set) ends the run within 0.2 s; the samples that finished stay in
    the result, the requests still in flight are dropped.

    Everything alive before the run (the tokenizer, a loaded torch, earlier levels' samples) is frozen out
    of the garbage collector first, as `vllm bench serve` does: a full collection over that heap in the
    middle of a run pauses every stream at once, and the client's pause would read as the engine's latency.
    Thawed afterwards, so a long tune still collects what its runs left; left frozen where the process had
    frozen its heap itself (thawing is all or nothing).

    `enough`, asked before each request is sent: once it says so, no more are sent and the run ends when
    those in flight have finished (the bodies not sent are not in the result)."""
    offsets = arrival_offsets(len(bodies), load.rate, load.burstiness, rng)
    frozen_by_caller = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    try:
        return client.run(_load(client, bodies, offsets, load.max_concurrency, on_done, enough))
    finally:
        if not frozen_by_caller:
            gc.unfreeze()


async def _load(client: EngineClient, bodies: list[dict[str, Any]], offsets: list[float], limit: int | None,
                on_done: Callable[[RequestSample], None] | None, enough: Callable[[], bool] | None) -> LoadRun:
    run = LoadRun()
    done: list[RequestSample | None] = [None] * len(bodies)
    slots = asyncio.Semaphore(limit or len(bodies) or 1)
    finished = asyncio.Event()
    remaining = len(bodies)
    tasks: list[asyncio.Task[None]] = []
    start = time.perf_counter()
    last_end = start

    async def one(index: int, body: dict[str, Any]) -> None:
        nonlocal remaining, last_end
        try:
            sample = await client.astream_chat(body)
        except Exception as exc:  # a bug in one request must not hang the run
            sample = RequestSample(error=f"{type(exc).__name__}: {exc}")
        finally:
            slots.release()
        if client.stop.is_set():
            return  # cut short by the stop: not a finished request
        done[index] = sample
        last_end = time.perf_counter()
        remaining -= 1
        if remaining == 0:
            finished.set()
        if on_done is not None:
            on_done(sample)

    async def dispatch() -> None:
        nonlocal remaining
        for index, (body, offset) in enumerate(zip(bodies, offsets, strict=True)):
            if (wait := start + offset - time.perf_counter()) > 0:
                await asyncio.sleep(wait)
            await slots.acquire()
            if enough is not None and enough():
                slots.release()
                remaining -= len(bodies) - index  # never sent: the run ends with those in flight
                if remaining == 0:
                    finished.set()
                return
            tasks.append(asyncio.create_task(one(index, body)))

    dispatcher = asyncio.create_task(dispatch())
    try:
        while bodies and not finished.is_set():
            if client.stop.is_set():
                raise asyncio.CancelledError
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), 0.2)
    except asyncio.CancelledError:  # Ctrl-C or the stop: keep what finished
        client.stop.set()
        run.interrupted = True
    finally:
        run.duration_s = last_end - start
        run.samples = [s for s in done if s is not None]
        for task in (dispatcher, *tasks):
            task.cancel()
        await asyncio.gather(dispatcher, *tasks, return_exceptions=True)
    return run


def serving_metrics(samples: Sequence[Sample], duration_s: float, slos: dict[str, float] | None = None,
                    client_cpu_s: float | None = None) -> RunMetrics:
    """The peers' table over one run's samples; `client_cpu_s`: the bench process's CPU time over the run
    (time.process_time), kept per 1,000 output tokens so a client that saturates its core shows."""
    ok = [s for s in samples if not s.error]
    output = sum(s.completion_tokens or 0 for s in ok)
    prompt = sum(s.prompt_tokens or 0 for s in ok)
    good = sum(1 for s in ok if _meets(s, slos)) if slos else None
    ms = 1000.0
    return RunMetrics(
        completed=len(ok), failed=len(samples) - len(ok), duration_s=duration_s, total_input_tokens=prompt,
        total_output_tokens=output, request_throughput=stats.ratio(len(ok), duration_s),
        output_tok_s=stats.ratio(output, duration_s), total_tok_s=stats.ratio(output + prompt, duration_s),
        goodput=stats.ratio(good, duration_s) if good is not None else None, slos_ms=slos or {},
        ttft_ms=stats.distribution(s.ttft_s * ms for s in ok if s.ttft_s is not None),
        tpot_ms=stats.distribution(s.tpot_s * ms for s in ok if s.tpot_s is not None),
        itl_ms=stats.distribution(g * ms for s in ok for g in s.itl_s),
        e2el_ms=stats.distribution(s.e2e_s * ms for s in ok if s.e2e_s is not None),
        errors=_error_counts(samples), client_cpu_s=client_cpu_s,
        client_cpu_s_per_1k_tokens=stats.ratio(client_cpu_s * 1000.0, output) if client_cpu_s is not None else None,
    )


def spread(runs: Sequence[RunMetrics]) -> RunSpread:
    """Each headline figure across repeated runs of one level: median, min, max, stdev."""
    return RunSpread(output_tok_s=stats.summary(r.output_tok_s for r in runs),
                     request_throughput=stats.summary(r.request_throughput for r in runs),
                     ttft_ms_median=stats.summary(r.ttft_ms.median for r in runs),
                     tpot_ms_median=stats.summary(r.tpot_ms.median for r in runs),
                     itl_ms_median=stats.summary(r.itl_ms.median for r in runs),
                     e2el_ms_median=stats.summary(r.e2el_ms.median for r in runs),
                     client_cpu_s_per_1k_tokens=stats.summary(r.client_cpu_s_per_1k_tokens for r in runs))


def _meets(sample: Sample, slos: dict[str, float]) -> bool:
    """vLLM's rule: a request is good when each of its latencies is within its SLO (TPOT 0 for a
    one-token answer)."""
    values = {"ttft": sample.ttft_s, "tpot": sample.tpot_s or 0.0, "e2el": sample.e2e_s}
    return all((v := values[key]) is not None and v * 1000.0 <= limit for key, limit in slos.items())


def _error_counts(samples: Sequence[Sample]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for sample in samples:
        if sample.error:
            key = sample.error[:120]
            counts[key] = counts.get(key, 0) + 1
    return counts
