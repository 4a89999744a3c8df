"""The benchmark suites: decode, tasks, ttft-sweep, concurrency.

Every suite appends raw samples to the shared result as it goes, so an interrupted run (Ctrl-C) still
holds every finished request; summaries are computed from whatever samples exist.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ornith_stack.bench import prompts, stats
from ornith_stack.bench.checkers import check
from ornith_stack.bench.client import EngineClient, RequestSample, ServerInfo, decode_rate
from ornith_stack.bench.datasets import Problem, load_tasks
from ornith_stack.bench.sandbox import Limits, require_sandbox
from ornith_stack.engines import EngineAdapter, SpecCounters, acceptance_length, detect_adapter
from ornith_stack.engines.exposition import Samples
from ornith_stack.errors import UserError
from ornith_stack.profiles.model import Sampling

SUITES = ("decode", "tasks", "ttft-sweep", "concurrency")
# Seed 003's sweep: 0.5K, 2K, 8K, 32K, 131K and 250K prompt tokens.
DEFAULT_PROMPT_LENGTHS = (512, 2048, 8192, 32768, 131072, 250000)
# Seed 004 reports throughput at concurrency 1, 8 and 32.
DEFAULT_CONCURRENCY = (1, 8, 32)
# Seed 000: "single-stream greedy decoding and 640-token generations".
DEFAULT_MAX_TOKENS = 640


@dataclass
class BenchConfig:
    url: str
    suites: tuple[str, ...] = SUITES
    model: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    samples: int = 5
    warmup: int = 1
    prompt_lengths: tuple[int, ...] = DEFAULT_PROMPT_LENGTHS
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    task_limit: int | None = None
    task_max_tokens: int = 1024
    tasks_dir: Path | None = None
    sampling: Sampling | None = None  # the profile's sampling for the tasks suite; None = greedy
    ignore_eos: bool = True
    timeout_s: float = 900.0
    sandbox: Limits = field(default_factory=Limits)


class Progress(Protocol):
    def start(self, suite: str, total: int) -> None: ...
    def advance(self, note: str = "") -> None: ...


class NoProgress:
    def start(self, suite: str, total: int) -> None:
        pass

    def advance(self, note: str = "") -> None:
        pass


class Runner:
    """Runs the suites against one endpoint and fills `result` (plain JSON-ready data) as it goes."""

    def __init__(self, config: BenchConfig, client: EngineClient, info: ServerInfo,
                 progress: Progress | None = None) -> None:
        self.config = config
        self.client = client
        self.info = info
        self.progress = progress or NoProgress()
        self.result: dict[str, Any] = {}
        # The endpoint's own metric names tell which adapter reads its counters (no --profile needed).
        scrape = client.metrics()
        self.adapter: EngineAdapter | None = detect_adapter(scrape) if scrape else None

    # -- requests ---------------------------------------------------------------------------------
    def body(self, content: str, max_tokens: int, *, speed: bool) -> dict[str, Any]:
        """A chat request as the seeds send it: thinking off; speed suites are greedy and ignore EOS so
        every request generates exactly max_tokens; tasks use the profile's sampling if it has one."""
        body: dict[str, Any] = {
            "model": self.info.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "chat_template_kwargs": {"enable_thinking": False},
        }
        sampling = None if speed else self.config.sampling
        if sampling is None:
            body["temperature"] = 0.0
        else:
            body.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        if speed and self.config.ignore_eos:
            body["ignore_eos"] = True
        return body

    def scrape(self) -> Samples | None:
        return self.client.metrics() if self.adapter else None

    def spec(self, samples: Samples | None) -> SpecCounters | None:
        return self.adapter.spec_counters(samples) if self.adapter and samples else None

    def generated(self, samples: Samples | None) -> float | None:
        return samples.total(self.adapter.metrics.generation_tokens) if self.adapter and samples else None

    def measured(self, body: dict[str, Any]) -> RequestSample:
        """One request alone on the engine, with the engine's counters read around it: generation tokens
        and speculative acceptance over exactly this request's window."""
        before = self.scrape()
        sample = self.client.stream_chat(body)
        after = self.settled(before, sample.completion_tokens)
        gen_before, gen_after = self.generated(before), self.generated(after)
        if gen_before is not None and gen_after is not None:
            sample.extra["engine_generation_tokens"] = gen_after - gen_before
        spec_before, spec_after = self.spec(before), self.spec(after)
        if spec_after is not None:
            sample.extra["acceptance_length"] = acceptance_length(spec_before, spec_after)
        return sample

    def settled(self, before: Samples | None, expected: int | None, patience_s: float = 2.0) -> Samples | None:
        """A scrape after a request, once the engine has counted its tokens: engines update counters
        after streaming the last chunk, so read until the count reaches the request's or stops moving."""
        after = self.scrape()
        if after is None or before is None or not expected:
            return after
        deadline = time.monotonic() + patience_s
        start = self.generated(before) or 0.0
        while (self.generated(after) or 0.0) - start < expected and time.monotonic() < deadline:
            time.sleep(0.05)
            after = self.scrape() or after
        return after

    def require_ok(self, sample: RequestSample, what: str) -> RequestSample:
        """The first request of a run tells whether the endpoint works at all: fail loudly, once."""
        if sample.error:
            raise UserError(f"{self.client.url}: {what} failed: {sample.error}")
        return sample

    # -- suites -----------------------------------------------------------------------------------
    def warm_up(self) -> None:
        for i in range(self.config.warmup):
            body = self.body(prompts.decode_prompt(i), min(self.config.max_tokens, 64), speed=True)
            self.require_ok(self.client.stream_chat(body), "the warm-up request")

    def decode(self) -> None:
        cfg = self.config
        suite: dict[str, Any] = {"max_tokens": cfg.max_tokens, "samples": []}
        self.result["decode"] = suite
        self.progress.start("decode", cfg.samples)
        first_spec = self.spec(self.scrape())
        for i in range(cfg.samples):
            sample = self.measured(self.body(prompts.decode_prompt(i), cfg.max_tokens, speed=True))
            if i == 0:
                self.require_ok(sample, "the first decode request")
            suite["samples"].append(sample.to_json())
            suite.update(summarize_speed(suite["samples"]))
            suite["acceptance_length"] = self.window_acceptance(first_spec)
            self.progress.advance(_note(sample))

    def tasks(self) -> None:
        cfg = self.config
        require_sandbox(cfg.sandbox)
        sets = load_tasks(cfg.tasks_dir, cfg.task_limit)
        suite: dict[str, Any] = {"max_tokens": cfg.task_max_tokens,
                                 "sampling": cfg.sampling.model_dump() if cfg.sampling else "greedy",
                                 "tasks": {}}
        self.result["tasks"] = suite
        self.progress.start("tasks", sum(len(s.problems) for s in sets))
        for task_set in sets:
            entry: dict[str, Any] = {"source": task_set.source, "samples": []}
            suite["tasks"][task_set.task] = entry
            first_spec = self.spec(self.scrape())
            for problem in task_set.problems:
                sample = self.measured(self.body(problem.message, cfg.task_max_tokens, speed=False))
                record = sample.to_json() | {"id": problem.id, **self.verdict(problem, sample)}
                entry["samples"].append(record)
                entry.update(summarize_task(entry["samples"]))
                entry["acceptance_length"] = self.window_acceptance(first_spec)
                self.progress.advance(f"{problem.id} {'pass' if record['passed'] else 'fail'}")

    def verdict(self, problem: Problem, sample: RequestSample) -> dict[str, Any]:
        if sample.error:
            return {"passed": False, "extracted": None, "check": sample.error}
        v = check(problem, sample.text, self.config.sandbox)
        if v is None:
            return {"passed": None, "extracted": None, "check": "no checker"}
        return {"passed": v.passed, "extracted": v.extracted, "check": v.detail}

    def ttft_sweep(self) -> None:
        cfg = self.config
        lengths, dropped = prompts.sweep_lengths(list(cfg.prompt_lengths), self.info.max_model_len, cfg.max_tokens)
        suite: dict[str, Any] = {"max_tokens": cfg.max_tokens, "max_model_len": self.info.max_model_len,
                                 "dropped_lengths": dropped, "points": []}
        self.result["ttft_sweep"] = suite
        self.progress.start("ttft-sweep", len(lengths) + 2)
        scale = self.calibrate()
        suite["tokens_per_word"] = scale.per_word
        for n, target in enumerate(lengths):
            body = self.body(prompts.sized_prompt(scale.words_for(target), seed=n), cfg.max_tokens, speed=True)
            sample = self.measured(body)
            suite["points"].append(sample.to_json() | {"target_prompt_tokens": target})
            self.progress.advance(f"{target} tokens: {_note(sample)}")

    def calibrate(self) -> prompts.TokenScale:
        points = []
        for words in (100, 400):
            sample = self.client.stream_chat(self.body(prompts.sized_prompt(words), 2, speed=True))
            self.require_ok(sample, "a prompt-size calibration request")
            if sample.prompt_tokens is None:
                raise UserError(f"{self.client.url} reports no prompt_tokens in usage; cannot size prompts")
            points.append((words, sample.prompt_tokens))
            self.progress.advance("calibrating prompt size")
        return prompts.TokenScale(points)

    def concurrency(self) -> None:
        cfg = self.config
        suite: dict[str, Any] = {"max_tokens": cfg.max_tokens, "levels": []}
        self.result["concurrency"] = suite
        self.progress.start("concurrency", sum(cfg.concurrency))
        for level in cfg.concurrency:
            entry: dict[str, Any] = {"concurrency": level, "samples": []}
            suite["levels"].append(entry)
            self.wave(level, entry)

    def wave(self, level: int, entry: dict[str, Any]) -> None:
        """`level` streams started together; total output tok/s over the wave's wall time."""
        bodies = [self.body(prompts.decode_prompt(i), self.config.max_tokens, speed=True) for i in range(level)]
        start = time.time()
        pool = ThreadPoolExecutor(max_workers=level)
        futures = [pool.submit(self.client.stream_chat, body) for body in bodies]
        try:
            for future in futures:
                wait([future])
                sample = future.result()
                entry["samples"].append(sample.to_json())
                self.progress.advance(_note(sample))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            done = [s for s in entry["samples"] if not s["error"]]
            end = max((s["started_at"] + s["e2e_s"] for s in done), default=start)
            entry["output_tok_s"] = stats.throughput((s["completion_tokens"] for s in done), start, end)
            entry["wall_s"] = end - start
            entry["decode_tok_s"] = stats.summary(s["decode_tok_s"] for s in done)
            entry["errors"] = len(entry["samples"]) - len(done)

    def window_acceptance(self, first: SpecCounters | None) -> float | None:
        """Acceptance over the suite so far (only this suite's requests ran in that window)."""
        last = self.spec(self.scrape())
        return acceptance_length(first, last) if last is not None else None


def summarize_speed(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Decode and TTFT spreads, and the same decode rate counted by the engine: its generation-token
    counter over the request's window divided by the same decode interval. The two differ when other
    clients used the engine during the measurement, which the report then says."""
    ok = [s for s in samples if not s["error"]]
    engine = [decode_rate(int(s["extra"]["engine_generation_tokens"]), s["decode_s"])
              for s in ok if s["extra"].get("engine_generation_tokens") is not None]
    return {
        "decode_tok_s": stats.summary(s["decode_tok_s"] for s in ok),
        "engine_decode_tok_s": stats.summary(engine),
        "ttft_s": stats.summary(s["ttft_s"] for s in ok),
        "errors": len(samples) - len(ok),
    }


def summarize_task(samples: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "n": len(samples),
        "passed": sum(1 for s in samples if s["passed"]),
        "accuracy": stats.ratio(sum(1 for s in samples if s["passed"]), len(samples)),
        "decode_tok_s": stats.summary(s["decode_tok_s"] for s in samples if not s["error"]),
        "errors": sum(1 for s in samples if s["error"]),
    }


def _note(sample: RequestSample) -> str:
    if sample.error:
        return f"error: {sample.error[:60]}"
    rate = sample.decode_tok_s
    return f"{rate:.1f} tok/s" if rate else "done"
