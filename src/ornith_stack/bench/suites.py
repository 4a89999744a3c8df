"""The benchmark suites: decode, tasks, ttft-sweep, concurrency, serving.

Every suite appends raw samples to the shared result as it goes, so an interrupted run (Ctrl-C) still
holds every finished request; summaries are computed from whatever samples exist. A failed request is
a sample with its error: the run goes on, and the summaries count it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ornith_stack.bench import prompts, stats
from ornith_stack.bench.acceptance import per_request, summarize_acceptance
from ornith_stack.bench.checkers import check
from ornith_stack.bench.client import EngineClient, RequestSample, ServerInfo
from ornith_stack.bench.datasets import (
    SEED000_TASKS,
    Problem,
    ServingPrompt,
    TaskSet,
    load_serving_prompts,
    load_tasks,
)
from ornith_stack.bench.result import (
    ConcurrencyLevel,
    ConcurrencySuite,
    DecodeSuite,
    Level,
    RunMetrics,
    Sample,
    SamplingSettings,
    ServingLevel,
    ServingSuite,
    Suites,
    SweepPoint,
    SweepSuite,
    TaskEntry,
    TaskSample,
    TasksSuite,
    TaskThroughput,
)
from ornith_stack.bench.sandbox import Limits, require_sandbox
from ornith_stack.bench.serving import Load, run_load, serving_metrics, spread
from ornith_stack.engines import EngineAdapter, SpecCounters, acceptance_length, detect_adapter
from ornith_stack.errors import UserError
from ornith_stack.profiles.model import Sampling
from ornith_stack.wire.metrics import Samples
from ornith_stack.wire.stream import decode_rate

SUITES = ("decode", "tasks", "ttft-sweep", "concurrency", "serving")
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
    method: str = "custom"  # seed000, seed004: the seed's settings (methods.py)
    api_key: str | None = None
    tasks: tuple[str, ...] = SEED000_TASKS
    prompt_format: str = "seed000"
    # datasets.TASK_ORDERS; None: the method's (seed 004 ran on dflash's server path), else "shuffled".
    task_order: str | None = None
    thinking: bool = False  # chat_template_kwargs.enable_thinking of task requests
    task_concurrency: tuple[int, ...] = ()  # seed 004: each task's problems again at these concurrencies
    requested_task_samples: int | None = None  # what the method asks for (seed 004: 128 per task)
    # Tasks at concurrency 1 ask the engine for each request's own verification steps where it reports
    # them (SGLang: non-streaming, so those requests have no TTFT or decode rate): seed 004's acceptance.
    per_request_steps: bool = False
    # The serving suite's random workload, as `vllm bench serve --dataset-name random` takes it.
    random_input_len: int = 1024
    random_output_len: int = 128
    # Prompts from a file instead (`vllm bench serve --dataset-name custom`'s JSONL), the same every run.
    dataset_path: Path | None = None
    num_prompts: int = 64
    max_concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    request_rate: tuple[float, ...] = (math.inf,)
    burstiness: float = 1.0
    seed: int = 0
    tokenizer: str | None = None  # counts the tokens of a stream without usage (a Hugging Face name or path)
    repeats: int = 3  # runs per load level (at least 3 gives a spread)
    goodput: dict[str, float] = field(default_factory=dict)  # SLOs in ms: ttft, tpot, e2el


L = TypeVar("L", bound=Level)

# The engine flag that sets the context window a request's prompt and new tokens must fit in.
CONTEXT_FLAGS = "vLLM --max-model-len, SGLang --context-length"


def refuse_what_cannot_fit(config: BenchConfig, max_model_len: int | None,
                           prompts_from_file: list[ServingPrompt] | None = None) -> None:
    """Before any request: every suite's largest request (prompt tokens, at least one, plus the new
    tokens it asks) must fit the served context, else one error naming the flags that fix it. An engine
    answers a request that does not fit with HTTP 400, so a run would spend its time collecting errors."""
    if not max_model_len:
        return
    for suite in config.suites:
        prompt, new, flag = _largest_request(config, suite, prompts_from_file)
        if prompt + new > max_model_len:
            source = f"--method {config.method}" if config.method != "custom" and suite == "tasks" else flag
            raise UserError(
                f"the {suite} suite asks {prompt + new} tokens per request ({prompt} or more of prompt + {new} new, "
                f"set by {source}) but the engine serves {max_model_len} (max_model_len in /v1/models): "
                f"start the engine with a larger context ({CONTEXT_FLAGS}) or lower {flag}")


def largest_concurrency(config: BenchConfig) -> int:
    """The most requests the chosen suites have in flight at once (the HTTP pool's size)."""
    levels = {"concurrency": config.concurrency, "tasks": (1, *config.task_concurrency),
              "serving": config.max_concurrency}
    return max((c for suite in config.suites for c in levels.get(suite, (1,))), default=1)


def serving_prompts(config: BenchConfig) -> list[ServingPrompt] | None:
    """The serving suite's prompts from --dataset-path, read before any request so a bad file costs none."""
    return load_serving_prompts(config.dataset_path) if config.dataset_path and "serving" in config.suites else None


def _largest_request(config: BenchConfig, suite: str,
                     prompts_from_file: list[ServingPrompt] | None) -> tuple[int, int, str]:
    """(prompt tokens at least, new tokens, the bench flag that sets them) of a suite's largest request."""
    if suite == "tasks":
        return 1, config.task_max_tokens, "--task-max-tokens"
    if suite == "serving" and prompts_from_file is None:
        return config.random_input_len, config.random_output_len, "--random-input-len/--random-output-len"
    if suite == "serving" and prompts_from_file is not None:
        longest = max((p.output_tokens or 0 for p in prompts_from_file), default=0)
        return 1, max(longest, config.random_output_len), "--random-output-len or the file's output_tokens"
    return 1, config.max_tokens, "--max-tokens"


class Progress(Protocol):
    def start(self, suite: str, total: int) -> None: ...
    def advance(self, note: str = "") -> None: ...


class NoProgress:
    def start(self, suite: str, total: int) -> None:
        pass

    def advance(self, note: str = "") -> None:
        pass


class Runner:
    """Runs the suites against one endpoint and replaces `suites` (frozen) after every request, so an
    interrupted run keeps every request that finished."""

    def __init__(self, config: BenchConfig, client: EngineClient, info: ServerInfo,
                 progress: Progress | None = None, prompts_from_file: list[ServingPrompt] | None = None) -> None:
        self.config = config
        self.client = client
        self.info = info
        self.progress = progress or NoProgress()
        self.suites = Suites()
        # The endpoint's own metric names tell which adapter reads its counters (no --profile needed).
        scrape = client.metrics()
        self.adapter: EngineAdapter | None = detect_adapter(scrape) if scrape else None
        # SGLang caps prompt + output of everything running by its KV pool (--max-total-tokens).
        self.pool_tokens = client.pool_tokens(self.adapter.info_paths) if self.adapter else None
        self.rng = random.Random(config.seed)
        self.serving_prompts = prompts_from_file  # --dataset-path's, read before the run (serving_prompts)

    # -- requests ---------------------------------------------------------------------------------
    def body(self, content: str, max_tokens: int, *, speed: bool) -> dict[str, Any]:
        """A chat request as the seeds send it: speed suites are greedy with thinking off and ignore EOS
        so every request generates exactly max_tokens; tasks use the method's (or the profile's)
        sampling and thinking setting."""
        thinking = self.config.thinking and not speed
        body: dict[str, Any] = {
            "model": self.info.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "chat_template_kwargs": {"enable_thinking": thinking},
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

    def measured(self, body: dict[str, Any], own_steps: bool = False) -> RequestSample:
        """One request alone on the engine, with the engine's counters read around it: generation tokens
        and speculative acceptance over exactly this request's window. With `own_steps`, on an engine
        that reports a request's verification steps, the request asks for them instead of streaming."""
        before = self.scrape()
        fields = self.adapter.per_request_steps_fields if self.adapter else {}
        if own_steps and fields:
            sample = self.client.complete_chat(body | fields)
        else:
            sample = self.client.stream_chat(body)
        after = self.settled(before, sample.completion_tokens)
        gen_before, gen_after = self.generated(before), self.generated(after)
        if gen_before is not None and gen_after is not None:
            sample.extra = replace(sample.extra, engine_generation_tokens=gen_after - gen_before)
        spec_before, spec_after = self.spec(before), self.spec(after)
        if spec_after is not None:
            sample.extra = replace(sample.extra, acceptance_length=acceptance_length(spec_before, spec_after),
                                   spec=per_request(spec_before, spec_after))
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
        """A request the suite cannot go on without (prompt-size calibration): fail loudly, once."""
        if sample.error:
            raise UserError(f"{self.client.url}: {what} failed: {sample.error}")
        return sample

    # -- suites -----------------------------------------------------------------------------------
    def warm_up(self) -> str | None:
        """Unrecorded requests first; the error of the last one when none of them succeeded (the
        endpoint does not work: the run stops and the report says why)."""
        errors = []
        for i in range(self.config.warmup):
            body = self.body(prompts.decode_prompt(i), min(self.config.max_tokens, 64), speed=True)
            sample = self.client.stream_chat(body)
            if not sample.error:
                return None
            errors.append(sample.error)
        return errors[-1] if errors else None

    def decode(self) -> None:
        cfg = self.config
        samples: list[Sample] = []
        self.suites = replace(self.suites, decode=DecodeSuite(max_tokens=cfg.max_tokens))
        self.progress.start("decode", cfg.samples)
        first_spec = self.spec(self.scrape())
        for i in range(cfg.samples):
            sample = self.measured(self.body(prompts.decode_prompt(i), cfg.max_tokens, speed=True))
            samples.append(sample.record())
            self.suites = replace(self.suites, decode=summarize_speed(cfg.max_tokens, samples,
                                                                     self.window_acceptance(first_spec)))
            self.progress.advance(_note(sample))

    def tasks(self) -> None:
        """Each task's problems one at a time (decode, pass rate, acceptance per request), then again at
        each of the method's concurrencies for throughput (seed 004: 1, 8, 32)."""
        cfg = self.config
        require_sandbox(cfg.sandbox)
        sets = load_tasks(cfg.tasks_dir, cfg.task_limit, cfg.tasks, cfg.prompt_format, cfg.task_order or "shuffled")
        sampling = cfg.sampling
        suite = TasksSuite(max_tokens=cfg.task_max_tokens, prompt_format=cfg.prompt_format,
                           order=cfg.task_order or "shuffled", thinking=cfg.thinking,
                           requested_samples=cfg.requested_task_samples,
                           sampling=SamplingSettings(temperature=sampling.temperature, top_p=sampling.top_p,
                                                     top_k=sampling.top_k) if sampling else "greedy")
        entries: dict[str, TaskEntry] = {}

        def publish(name: str, entry: TaskEntry) -> None:
            entries[name] = entry
            self.suites = replace(self.suites, tasks=replace(suite, tasks=dict(entries)))

        self.suites = replace(self.suites, tasks=suite)
        loads = [c for c in cfg.task_concurrency if c > 1]
        self.progress.start("tasks", sum(len(s.problems) * (1 + len(loads)) for s in sets))
        for task_set in sets:
            self.task(task_set, loads, partial(publish, task_set.task))

    def task(self, task_set: TaskSet, loads: list[int], publish: Callable[[TaskEntry], None]) -> None:
        """One task's problems alone on the engine, then its throughput at each concurrency."""
        cfg = self.config
        samples: list[TaskSample] = []
        throughput: list[TaskThroughput] = []

        def entry(acceptance: float | None) -> TaskEntry:
            return replace(summarize_task(samples), source=task_set.source, available=task_set.available,
                           throughput=tuple(throughput), acceptance_length=acceptance,
                           acceptance=summarize_acceptance(samples))

        publish(entry(None))
        self.task_warm_up(task_set, 1)
        first_spec = self.spec(self.scrape())
        acceptance = None
        for problem in task_set.problems:
            sample = self.measured(self.body(problem.message, cfg.task_max_tokens, speed=False),
                                   own_steps=cfg.per_request_steps)
            samples.append(sample.task_record(problem.id, *self.verdict(problem, sample)))
            acceptance = self.window_acceptance(first_spec)
            publish(entry(acceptance))
            self.progress.advance(f"{problem.id} {_verdict_word(samples[-1].passed)}")
        if 1 in cfg.task_concurrency:
            # At concurrency 1 the measured pass is the throughput run; its wall time is the
            # requests' own (one after another), not the checking and scraping between them.
            throughput.append(_throughput(1, samples, sum(x.e2e_s or 0.0 for x in samples)))
            publish(entry(acceptance))
        for level in loads:
            measured = self.task_warm_up(task_set, level)
            bodies = [self.body(p.message, cfg.task_max_tokens, speed=False) for p in measured]
            run = run_load(self.client, bodies, Load(max_concurrency=level), self.rng,
                           on_done=lambda s: self.progress.advance(_note(s)))
            throughput.append(_throughput(level, [x.record() for x in run.samples], run.duration_s))
            publish(entry(acceptance))
            if run.interrupted:
                raise KeyboardInterrupt

    def task_warm_up(self, task_set: TaskSet, level: int) -> list[Problem]:
        """Empty the prefix cache where the engine allows it and send the warm-up requests of one
        concurrency level (server order: the first `level` rows, all at once, unrecorded), as dflash does;
        return the problems to measure at that level."""
        warm, measured = task_set.window(level)
        self.client.flush_cache()
        bodies = [self.body(p.message, self.config.task_max_tokens, speed=False) for p in warm]
        if bodies and run_load(self.client, bodies, Load(max_concurrency=level), self.rng).interrupted:
            raise KeyboardInterrupt
        return measured

    def verdict(self, problem: Problem, sample: RequestSample) -> tuple[bool | None, str | None, str]:
        """(passed, the answer the checker extracted, its detail); passed None where the task has no checker."""
        if sample.error:
            return False, None, sample.error
        v = check(problem, sample.text, self.config.sandbox)
        if v is None:
            return None, None, "no checker"
        return v.passed, v.extracted, v.detail

    def ttft_sweep(self) -> None:
        cfg = self.config
        window = min(n for n in (self.info.max_model_len, self.pool_tokens, 10**12) if n)
        lengths, dropped = prompts.sweep_lengths(list(cfg.prompt_lengths), window if window < 10**12 else None,
                                                 cfg.max_tokens)
        suite = SweepSuite(max_tokens=cfg.max_tokens, max_model_len=self.info.max_model_len,
                           max_total_tokens=self.pool_tokens, dropped_lengths=tuple(dropped))
        self.suites = replace(self.suites, ttft_sweep=suite)
        self.progress.start("ttft-sweep", len(lengths) * cfg.repeats + 2)
        scale = self.calibrate()
        suite = replace(suite, tokens_per_word=scale.per_word)
        points: list[SweepPoint] = []
        for n, target in enumerate(lengths):
            samples: list[Sample] = []
            points.append(summarize_point(target, samples))
            for repeat in range(cfg.repeats):
                words = scale.words_for(target)
                sample = self.measured(self.body(prompts.sized_prompt(words, seed=n * 1000 + repeat), cfg.max_tokens,
                                                 speed=True))
                samples.append(sample.record())
                points[-1] = summarize_point(target, samples)
                self.suites = replace(self.suites, ttft_sweep=replace(suite, points=tuple(points)))
                self.progress.advance(f"{target} tokens: {_note(sample)}")

    def calibrate(self, body: Callable[[str], dict[str, Any]] | None = None) -> prompts.TokenScale:
        """Prompt tokens per filler word, measured with requests shaped as `body` makes them (the chat
        template and its arguments count towards the prompt)."""
        make = body or (lambda content: self.body(content, 2, speed=True))
        points = []
        for words in (100, 400):
            points.append((words, self.prompt_tokens(make(prompts.sized_prompt(words)))))
            self.progress.advance("calibrating prompt size")
        return prompts.TokenScale(points)

    def prompt_tokens(self, body: dict[str, Any]) -> int:
        sample = self.require_ok(self.client.stream_chat(body), "a prompt-size calibration request")
        if sample.prompt_tokens is None:
            raise UserError(f"{self.client.url} reports no prompt_tokens in usage; cannot size prompts")
        return int(sample.prompt_tokens)

    def concurrency(self) -> None:
        """Essay prompts with ignore_eos at each concurrency, sustained over 4 x level requests: a new
        request starts when one ends, so every level keeps `level` streams busy."""
        cfg = self.config
        suite = ConcurrencySuite(max_tokens=cfg.max_tokens, repeats=cfg.repeats)
        levels: list[ConcurrencyLevel] = []

        def publish(entry: ConcurrencyLevel) -> None:
            levels[-1] = entry
            self.suites = replace(self.suites, concurrency=replace(suite, levels=tuple(levels)))

        self.suites = replace(self.suites, concurrency=suite)
        self.progress.start("concurrency", sum(4 * c * cfg.repeats for c in cfg.concurrency))
        for level in cfg.concurrency:
            bodies = [self.body(prompts.decode_prompt(i), cfg.max_tokens, speed=True) for i in range(4 * level)]
            levels.append(ConcurrencyLevel(concurrency=level))
            self.level(levels[-1], Load(max_concurrency=level), _fixed(bodies), publish)

    def serving(self) -> None:
        """The random workload of `vllm bench serve --dataset-name random` (or the prompts of
        `--dataset-path`, as its custom dataset): fixed output lengths, at each request rate and max
        concurrency, repeated for a spread."""
        cfg = self.config
        suite = ServingSuite(input_len=cfg.random_input_len, output_len=cfg.random_output_len,
                             num_prompts=cfg.num_prompts, repeats=cfg.repeats, seed=cfg.seed,
                             burstiness=cfg.burstiness, goodput_slos_ms=cfg.goodput, max_total_tokens=self.pool_tokens)
        self.suites = replace(self.suites, serving=suite)
        levels: list[ServingLevel] = []

        def publish(entry: ServingLevel) -> None:
            levels[-1] = entry
            self.suites = replace(self.suites, serving=replace(suite, levels=tuple(levels)))

        loads = [Load(rate, c, cfg.burstiness) for rate in cfg.request_rate for c in cfg.max_concurrency]
        if self.serving_prompts is not None:
            suite = replace(suite, dataset=str(cfg.dataset_path), input_len=None)
            self.progress.start("serving", len(loads) * cfg.num_prompts * cfg.repeats)
            bodies = _fixed(self.dataset_bodies(self.serving_prompts))
        else:
            self.progress.start("serving", 2 + len(loads) * cfg.num_prompts * cfg.repeats)
            bodies, per_word, template = self.random_bodies()
            suite = replace(suite, tokens_per_word=per_word, template_tokens=template)
        for load in loads:
            exceeds = None
            if self.pool_tokens and load.max_concurrency and self.serving_prompts is None:
                exceeds = load.max_concurrency * (cfg.random_input_len + cfg.random_output_len) > self.pool_tokens
            levels.append(ServingLevel(request_rate=load.rate if not math.isinf(load.rate) else "inf",
                                       max_concurrency=load.max_concurrency, exceeds_pool=exceeds))
            self.level(levels[-1], load, bodies, publish)

    def random_bodies(self) -> tuple[Callable[[], list[dict[str, Any]]], float, int]:
        """Fresh random prompts for each run, with the tokens per filler word and the chat template's own
        tokens. `vllm bench serve --dataset-name random` makes the message content input_len tokens long
        and the chat template comes on top, so the prompt is sized to input_len plus the template's."""
        cfg = self.config

        def sizing(content: str) -> dict[str, Any]:
            return self.random_body(content) | {"max_tokens": 2}

        scale = self.calibrate(sizing)
        # The chat template's own tokens: a one-letter message less its one token. SGLang's Model Gateway
        # refuses an empty message (HTTP 400 "message content cannot be empty", sglang-router 0.3.2).
        template = self.prompt_tokens(sizing("x")) - 1
        words = scale.words_for(cfg.random_input_len + template)
        seeds = random.Random(cfg.seed)

        def bodies() -> list[dict[str, Any]]:
            return [self.random_body(prompts.sized_prompt(words, seed=seeds.randrange(1 << 30), reproducible=True))
                    for _ in range(cfg.num_prompts)]
        return bodies, scale.per_word, template

    def dataset_bodies(self, rows: list[ServingPrompt]) -> list[dict[str, Any]]:
        """`--num-prompts` requests from the file's lines in order, starting over when the file is shorter;
        a line's output_tokens overrides --random-output-len."""
        chosen = [rows[i % len(rows)] for i in range(self.config.num_prompts)]
        return [self.random_body(row.prompt) | ({"max_tokens": row.output_tokens} if row.output_tokens else {})
                for row in chosen]

    def random_body(self, content: str) -> dict[str, Any]:
        """A request of the random workload as `vllm bench serve --backend openai-chat` sends it."""
        body: dict[str, Any] = {"model": self.info.model, "messages": [{"role": "user", "content": content}],
                                "max_tokens": self.config.random_output_len, "temperature": 0.0}
        if self.config.ignore_eos:
            body["ignore_eos"] = True
        return body

    def level(self, entry: L, load: Load, bodies: Callable[[], list[dict[str, Any]]],
              publish: Callable[[L], None]) -> None:
        """One load level, published after each recorded run: unrecorded warm-up requests (`--warmup`
        full rounds of the level's concurrency, so every batch size the level runs has run once: an
        engine compiles or captures a new batch size on first use), then `repeats` recorded runs, each
        after emptying the prefix cache where the engine allows it (the warm-up and the runs before may
        have sent the same prompts) and each summarized as the peers do, with the client's own CPU time
        and the spread of the headline figures across runs. Ctrl-C keeps the requests of the current run
        that finished."""
        cfg = self.config
        entry = replace(entry, load=load.label, flushed_cache=self.client.flush_cache())
        publish(entry)
        warm = bodies()[: max(cfg.warmup, 0) * (load.max_concurrency or 1)]
        if warm and run_load(self.client, warm, Load(max_concurrency=load.max_concurrency), self.rng).interrupted:
            raise KeyboardInterrupt
        runs: list[RunMetrics] = []
        samples: list[Sample] = []
        for repeat in range(cfg.repeats):
            sent = bodies()
            self.client.flush_cache()
            cpu = time.process_time()
            run = run_load(self.client, sent, load, self.rng, on_done=lambda s: self.progress.advance(_note(s)))
            cpu = time.process_time() - cpu
            recorded = [s.record(repeat) for s in run.samples]
            samples += recorded
            runs.append(serving_metrics(recorded, run.duration_s, cfg.goodput, client_cpu_s=cpu))
            publish(summarize_level(entry, runs, samples))
            if run.interrupted:
                raise KeyboardInterrupt

    def window_acceptance(self, first: SpecCounters | None) -> float | None:
        """Acceptance over the suite so far (only this suite's requests ran in that window)."""
        last = self.spec(self.scrape())
        return acceptance_length(first, last) if last is not None else None


def summarize_speed(max_tokens: int, samples: Sequence[Sample], acceptance: float | None) -> DecodeSuite:
    """Decode and TTFT spreads, and the same decode rate counted by the engine: its generation-token
    counter over the request's window divided by the same decode interval. The two differ when other
    clients used the engine during the measurement, which the report then says."""
    ok = [s for s in samples if not s.error]
    engine = [decode_rate(int(s.extra.engine_generation_tokens), s.decode_s)
              for s in ok if s.extra.engine_generation_tokens is not None]
    return DecodeSuite(max_tokens=max_tokens, samples=tuple(samples), decode_tok_s=stats.summary(s.decode_tok_s for s in ok),
                       engine_decode_tok_s=stats.summary(engine), ttft_s=stats.summary(s.ttft_s for s in ok),
                       errors=len(samples) - len(ok), acceptance_length=acceptance)


def summarize_point(target: int, samples: Sequence[Sample]) -> SweepPoint:
    """One sweep length: median TTFT and decode of its requests (distinct prompts, so no prefix-cache
    hits), their spread, and the first error when none succeeded."""
    ok = [s for s in samples if not s.error]
    ttft, decode = stats.summary(s.ttft_s for s in ok), stats.summary(s.decode_tok_s for s in ok)
    return SweepPoint(target_prompt_tokens=target, samples=tuple(samples),
                      prompt_tokens=ok[0].prompt_tokens if ok else None, ttft_s=ttft.median,
                      decode_tok_s=decode.median, ttft_spread=ttft, decode_spread=decode,
                      error=samples[-1].error if samples and not ok else None, errors=len(samples) - len(ok))


def summarize_task(samples: Sequence[TaskSample]) -> TaskEntry:
    """Pass rate over the checked problems (MT-Bench has no checker) and the task's decode rate: total
    decode tokens over total decode time (seed 000's per-task figure), with the per-request spread."""
    ok = [s for s in samples if not s.error]
    checked = [s for s in samples if s.passed is not None]
    timed = [s for s in ok if s.decode_tok_s and s.completion_tokens and s.decode_s]
    tokens = sum((s.completion_tokens or 1) - 1 for s in timed)
    seconds = sum(s.decode_s or 0.0 for s in timed)
    passed = sum(1 for s in checked if s.passed)
    return TaskEntry(samples=tuple(samples), n=len(samples), checked=len(checked), passed=passed,
                     accuracy=stats.ratio(passed, len(checked)), decode_tok_s=stats.summary(s.decode_tok_s for s in ok),
                     task_decode_tok_s=stats.ratio(tokens, seconds), decode_tokens=tokens, decode_seconds=seconds,
                     completion_tokens=sum(s.completion_tokens or 0 for s in ok), errors=len(samples) - len(ok))


def summarize_level(entry: L, runs: Sequence[RunMetrics], samples: Sequence[Sample]) -> L:
    """A load level with its recorded runs, every request of them, and the spread across runs."""
    figures = spread(runs)
    return replace(entry, runs=tuple(runs), samples=tuple(samples), spread=figures,
                   output_tok_s=figures.output_tok_s.median, errors=sum(r.failed for r in runs),
                   decode_tok_s=stats.summary(s.decode_tok_s for s in samples if not s.error))


def _throughput(level: int, samples: Sequence[Sample], wall_s: float) -> TaskThroughput:
    """Seed 004's throughput: total output tokens over end-to-end wall time at one concurrency."""
    ok = [s for s in samples if not s.error]
    output = sum(s.completion_tokens or 0 for s in ok)
    return TaskThroughput(concurrency=level, requests=len(samples), errors=len(samples) - len(ok),
                          output_tokens=output, wall_s=wall_s, output_tok_s=stats.ratio(output, wall_s))


def _fixed(bodies: list[dict[str, Any]]) -> Callable[[], list[dict[str, Any]]]:
    """The same requests for every run of a level."""
    return lambda: bodies


def _verdict_word(passed: bool | None) -> str:
    return "unchecked" if passed is None else "pass" if passed else "fail"


def _note(sample: RequestSample) -> str:
    if sample.error:
        return f"error: {sample.error[:60]}"
    rate = sample.decode_tok_s
    return f"{rate:.1f} tok/s" if rate else "done"
