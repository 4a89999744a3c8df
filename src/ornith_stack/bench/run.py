"""One bench run: connect, run the suites, compare; Ctrl-C keeps what was gathered."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from ornith_stack.bench.client import EngineClient, ServerInfo
from ornith_stack.bench.compare import compare
from ornith_stack.bench.result import BenchResult, Failures, Sample, SandboxSettings, Settings, Suites
from ornith_stack.bench.sandbox import isolation
from ornith_stack.bench.suites import (
    BenchConfig,
    Progress,
    Runner,
    largest_concurrency,
    refuse_what_cannot_fit,
    serving_prompts,
)
from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError
from ornith_stack.profiles.model import Profile
from ornith_stack.wire.session import Transport


def run_bench(config: BenchConfig, profile: Profile | None = None, baseline: BenchResult | None = None,
              baseline_path: Path | None = None, progress: Progress | None = None,
              transport: Transport | None = None) -> BenchResult:
    """Run the configured suites and return the result (raw samples, summaries, comparison).

    Engine down or not OpenAI-compatible: UserError before any suite starts. Ctrl-C: the suites stop,
    `interrupted` is set, and the result holds every request that finished."""
    from_file = serving_prompts(config)
    stop = threading.Event()
    client = EngineClient(config.url, timeout_s=config.timeout_s, stop=stop, transport=transport,
                          api_key=config.api_key, connections=largest_concurrency(config),
                          count_tokens=token_counter(config.tokenizer) if config.tokenizer else None)
    try:
        info = client.server_info(config.model)
        if info.max_model_len is None and profile is not None:
            # Not every engine lists max_model_len in /v1/models; the profile's flag is the next best.
            info = ServerInfo(info.model, adapter_for(profile).settings(profile).max_model_len)
        refuse_what_cannot_fit(config, info.max_model_len, from_file)
        runner = Runner(config, client, info, progress, from_file)
        result = _header(config, profile, info.model, info.max_model_len, runner)
        started = time.perf_counter()
        problem, interrupted = None, False
        try:
            problem = runner.warm_up() if config.suites else None
            for suite in config.suites if not problem else ():
                getattr(runner, suite.replace("-", "_"))()
        except KeyboardInterrupt:
            stop.set()
            interrupted = True
        result = replace(result, suites=runner.suites, interrupted=interrupted,
                         aborted=f"every warm-up request failed: {problem}" if problem else None,
                         duration_s=time.perf_counter() - started, failures=failures(runner.suites))
        return replace(result, comparison=compare(result, profile, baseline, str(baseline_path or "")))
    finally:
        client.close()


def token_counter(name: str) -> Callable[[str], int]:
    """Tokens of a generated text by the model's tokenizer, without special tokens, as `vllm bench serve`
    counts a stream that reports no usage: a checkpoint folder's tokenizer.json (the tokenizers package),
    else a Hugging Face name or folder through transformers."""
    local = Path(name) / "tokenizer.json"
    try:
        if local.is_file():
            from tokenizers import Tokenizer

            fast = Tokenizer.from_file(str(local))
            return lambda text: len(fast.encode(text, add_special_tokens=False).ids)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(name)
    except ImportError:
        raise UserError(f"--tokenizer {name}: needs the tokenizers and transformers packages "
                        "(pip install 'ornith-stack[tiny]')") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"--tokenizer {name}: cannot load it ({_first_line(exc)})") from None
    return lambda text: len(tokenizer(text, add_special_tokens=False).input_ids)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def failures(suites: Suites) -> Failures:
    """Failed requests of the whole run: their count, and how many failed for each reason."""
    reasons: dict[str, int] = {}
    for sample in all_samples(suites):
        if sample.error and sample.error != "interrupted":
            key = sample.error[:160]
            reasons[key] = reasons.get(key, 0) + 1
    return Failures(count=sum(reasons.values()), reasons=reasons)


def all_samples(suites: Suites) -> Iterator[Sample]:
    """Every request sample recorded anywhere in the suites' results."""
    if suites.decode:
        yield from suites.decode.samples
    for task in suites.tasks.tasks.values() if suites.tasks else ():
        yield from task.samples
    for point in suites.ttft_sweep.points if suites.ttft_sweep else ():
        yield from point.samples
    for level in (*(suites.concurrency.levels if suites.concurrency else ()),
                  *(suites.serving.levels if suites.serving else ())):
        yield from level.samples


def _header(config: BenchConfig, profile: Profile | None, model: str, max_model_len: int | None,
            runner: Runner) -> BenchResult:
    now = datetime.now(UTC)
    return BenchResult(
        url=config.url, model=model, max_model_len=max_model_len, profile=profile.name if profile else None,
        engine=runner.adapter.kind if runner.adapter else None, suites_requested=tuple(config.suites),
        started_at=now.timestamp(), started_at_iso=now.isoformat(timespec="seconds"), method=config.method,
        settings=_settings(config), suites=Suites())


def _settings(config: BenchConfig) -> Settings:
    return Settings(
        method=config.method, tasks=tuple(config.tasks), prompt_format=config.prompt_format,
        task_order=config.task_order, thinking=config.thinking, task_concurrency=tuple(config.task_concurrency),
        requested_task_samples=config.requested_task_samples, random_input_len=config.random_input_len,
        random_output_len=config.random_output_len,
        dataset_path=str(config.dataset_path) if config.dataset_path else None, num_prompts=config.num_prompts,
        max_concurrency=tuple(config.max_concurrency),
        request_rate=tuple(r if r != float("inf") else "inf" for r in config.request_rate),
        burstiness=config.burstiness, seed=config.seed, repeats=config.repeats, goodput_slos_ms=config.goodput,
        timeout_s=config.timeout_s, max_tokens=config.max_tokens, samples=config.samples, warmup=config.warmup,
        prompt_lengths=tuple(config.prompt_lengths), concurrency=tuple(config.concurrency),
        task_limit=config.task_limit, task_max_tokens=config.task_max_tokens,
        tasks_dir=str(config.tasks_dir) if config.tasks_dir else None, ignore_eos=config.ignore_eos,
        sandbox=SandboxSettings(wall_s=config.sandbox.wall_s, memory_mb=config.sandbox.memory_mb,
                                bubblewrap=isolation().problem is None),
    )
