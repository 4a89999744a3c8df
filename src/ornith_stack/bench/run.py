"""One bench run: connect, run the suites, compare; Ctrl-C keeps what was gathered."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from ornith_stack.bench.client import EngineClient, ServerInfo
from ornith_stack.bench.compare import compare
from ornith_stack.bench.sandbox import isolation
from ornith_stack.bench.suites import BenchConfig, Progress, Runner, largest_concurrency, refuse_what_cannot_fit
from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError
from ornith_stack.profiles.model import Profile


def run_bench(config: BenchConfig, profile: Profile | None = None, baseline: dict[str, Any] | None = None,
              baseline_path: Path | None = None, progress: Progress | None = None,
              transport: httpx.BaseTransport | None = None) -> dict[str, Any]:
    """Run the configured suites and return the result (raw samples, summaries, comparison).

    Engine down or not OpenAI-compatible: UserError before any suite starts. Ctrl-C: the suites stop,
    `interrupted` is set, and the result holds every request that finished."""
    stop = threading.Event()
    client = EngineClient(config.url, timeout_s=config.timeout_s, stop=stop, transport=transport,
                          api_key=config.api_key, connections=largest_concurrency(config),
                          count_tokens=token_counter(config.tokenizer) if config.tokenizer else None)
    try:
        info = client.server_info(config.model)
        if info.max_model_len is None and profile is not None:
            # Not every engine lists max_model_len in /v1/models; the profile's flag is the next best.
            info = ServerInfo(info.model, adapter_for(profile).settings(profile).max_model_len)
        refuse_what_cannot_fit(config, info.max_model_len)
        runner = Runner(config, client, info, progress)
        result = _header(config, profile, info.model, info.max_model_len, runner)
        result["suites"] = runner.result
        started = time.perf_counter()
        try:
            problem = runner.warm_up() if config.suites else None
            if problem:
                result["aborted"] = f"every warm-up request failed: {problem}"
            for suite in config.suites if not problem else ():
                getattr(runner, suite.replace("-", "_"))()
        except KeyboardInterrupt:
            stop.set()
            result["interrupted"] = True
        result["duration_s"] = time.perf_counter() - started
        result["failures"] = failures(runner.result)
        result["comparison"] = compare(result, profile, baseline, str(baseline_path or ""))
        return result
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


def failures(suites: dict[str, Any]) -> dict[str, Any]:
    """Failed requests of the whole run: their count, and how many failed for each reason."""
    reasons: dict[str, int] = {}
    for sample in _samples(suites):
        if sample.get("error") and sample["error"] != "interrupted":
            key = str(sample["error"])[:160]
            reasons[key] = reasons.get(key, 0) + 1
    return {"count": sum(reasons.values()), "reasons": reasons}


def _samples(node: Any) -> Iterator[dict[str, Any]]:
    """Every request sample recorded anywhere in the suites' results."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "samples" and isinstance(value, list):
                yield from (s for s in value if isinstance(s, dict))
            elif isinstance(value, dict | list):
                yield from _samples(value)
    elif isinstance(node, list):
        for item in node:
            yield from _samples(item)


def _header(config: BenchConfig, profile: Profile | None, model: str, max_model_len: int | None,
            runner: Runner) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "format": "ornith-stack-bench/1",
        "url": config.url,
        "model": model,
        "max_model_len": max_model_len,
        "profile": profile.name if profile else None,
        "engine": runner.adapter.kind if runner.adapter else None,
        "suites_requested": list(config.suites),
        "started_at": now.timestamp(),
        "started_at_iso": now.isoformat(timespec="seconds"),
        "interrupted": False,
        "method": config.method,
        "aborted": None,
        "settings": {
            "method": config.method,
            "tasks": list(config.tasks),
            "prompt_format": config.prompt_format,
            "task_order": config.task_order,
            "thinking": config.thinking,
            "task_concurrency": list(config.task_concurrency),
            "requested_task_samples": config.requested_task_samples,
            "random_input_len": config.random_input_len,
            "random_output_len": config.random_output_len,
            "dataset_path": str(config.dataset_path) if config.dataset_path else None,
            "num_prompts": config.num_prompts,
            "max_concurrency": list(config.max_concurrency),
            "request_rate": [r if r != float("inf") else "inf" for r in config.request_rate],
            "burstiness": config.burstiness,
            "seed": config.seed,
            "repeats": config.repeats,
            "goodput_slos_ms": config.goodput,
            "timeout_s": config.timeout_s,
            "max_tokens": config.max_tokens,
            "samples": config.samples,
            "warmup": config.warmup,
            "prompt_lengths": list(config.prompt_lengths),
            "concurrency": list(config.concurrency),
            "task_limit": config.task_limit,
            "task_max_tokens": config.task_max_tokens,
            "tasks_dir": str(config.tasks_dir) if config.tasks_dir else None,
            "ignore_eos": config.ignore_eos,
            "sandbox": {"wall_s": config.sandbox.wall_s, "memory_mb": config.sandbox.memory_mb,
                        "bubblewrap": isolation().problem is None},
        },
    }
