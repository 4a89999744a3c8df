"""`ornith-stack bench --url URL [--profile NAME] [--suite ...] [--baseline RESULT.json] [--out DIR]`."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from ornith_stack.bench import SUITES, BenchConfig, run_bench
from ornith_stack.bench.datasets import PROMPT_FORMATS, SEED000_TASKS, TASK_ORDERS, TASKS
from ornith_stack.bench.methods import METHODS, apply_method
from ornith_stack.bench.report import write_outputs
from ornith_stack.bench.result import load_result
from ornith_stack.bench.sandbox import UNSAFE_FLAG, Limits, require_sandbox
from ornith_stack.bench.serving import parse_goodput
from ornith_stack.bench.suites import DEFAULT_CONCURRENCY, DEFAULT_MAX_TOKENS, DEFAULT_PROMPT_LENGTHS
from ornith_stack.errors import UserError, shown
from ornith_stack.profiles import load_profile
from ornith_stack.urls import engine_url

out = Console()
err = Console(stderr=True)


class RichProgress:
    """The library's progress protocol drawn as one rich bar per suite."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: TaskID | None = None
        self.suite = ""

    def start(self, suite: str, total: int) -> None:
        # Drawn from the first suite on, so a connection error prints only its error line.
        if self.task is None:
            self.progress.start()
        else:
            self.progress.update(self.task, description=f"[green]{self.suite}[/] done")
        self.suite = suite
        self.task = self.progress.add_task(suite, total=total)

    def advance(self, note: str = "") -> None:
        if self.task is not None:
            self.progress.update(self.task, advance=1, description=f"{self.suite}: {note}"[:70])


def parse_suites(value: str) -> tuple[str, ...]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if names == ["all"]:
        return SUITES
    unknown = [n for n in names if n not in SUITES]
    if unknown or not names:
        raise UserError(f"--suite {value!r}: choose from {', '.join(SUITES)} or all (comma-separated)")
    return tuple(n for n in SUITES if n in names)


# Bounds past which a run cannot be what was meant: 10^12 streams was a MemoryError, a rate of 1e-300
# requests a second a wait past the end of the universe (a hang), an infinite timeout a hang on a stuck engine.
MAX_STREAMS = 100_000
MAX_PROMPT_TOKENS = 100_000_000
MIN_REQUEST_RATE = 0.001  # one request every 1,000 s
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def parse_ints(flag: str, value: str, high: int = MAX_STREAMS) -> tuple[int, ...]:
    try:
        numbers = tuple(int(v.replace("_", "")) for v in value.split(",") if v.strip())
    except ValueError:
        raise UserError(f"{flag} {shown(value)}: expected comma-separated whole numbers, e.g. 512,2048") from None
    if not numbers or min(numbers) < 1:
        raise UserError(f"{flag} {shown(value)}: expected positive numbers")
    if max(numbers) > high:
        raise UserError(f"{flag} {shown(value)}: at most {high:,}")
    return numbers


def parse_rates(value: str) -> tuple[float, ...]:
    try:
        rates = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise UserError(f"--request-rate {shown(value)}: expected requests per second, comma-separated, "
                        "or inf") from None
    if not rates or any(not r >= MIN_REQUEST_RATE for r in rates):  # `not >=`: NaN too
        raise UserError(f"--request-rate {shown(value)}: expected rates of at least {MIN_REQUEST_RATE:g} "
                        "requests per second, or inf")
    return rates


def parse_tasks(value: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    if names == ("all",):
        return TASKS
    unknown = [n for n in names if n not in TASKS]
    if unknown or not names:
        raise UserError(f"--tasks {value!r}: choose from {', '.join(TASKS)} or all (comma-separated)")
    return names


@contextlib.contextmanager
def output_dir(path: Path) -> Iterator[Path]:
    """`--out` made and proven writable before the run starts (a bad path must not lose a finished run);
    a directory made here is removed again when the run fails before writing into it."""
    if path.exists() and not path.is_dir():
        raise UserError(f"--out {path}: exists and is not a directory")
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise UserError(f"--out {path}: cannot write there ({exc.strerror or exc})") from None
    try:
        yield path
    except UserError:
        if created and not any(path.iterdir()):
            path.rmdir()
        raise


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench(
        url: Annotated[str, typer.Option(help="The engine's OpenAI-compatible address, e.g. http://127.0.0.1:8000.")],
        profile: Annotated[str | None, typer.Option(help="Compare with this profile's seed figures and roofline.")] = None,
        suite: Annotated[str, typer.Option(help=f"{', '.join(SUITES)} or all; comma-separated.")] = "all",
        method: Annotated[str, typer.Option(help=f"{', '.join(METHODS)}: a seed's whole method (suites, tasks, "
                                            "prompts, sampling); custom: the flags as given.")] = "custom",
        api_key: Annotated[str | None, typer.Option(envvar=["ORNITH_BENCH_API_KEY", "ORNITH_API_KEY"],
                                                    show_default=False,
                                                    help="Sent as Authorization: Bearer KEY.")] = None,
        baseline: Annotated[Path | None, typer.Option(help="A previous bench.json to compute speedups against.")] = None,
        out_dir: Annotated[Path, typer.Option("--out", help="Directory for bench.json, bench.md and the plots.")] = Path("bench-results"),
        model: Annotated[str | None, typer.Option(help="Served model name (default: the first in /v1/models).")] = None,
        max_tokens: Annotated[int, typer.Option(min=2, help="Tokens generated per speed request.")] = DEFAULT_MAX_TOKENS,
        samples: Annotated[int, typer.Option(min=1, help="Decode requests (median and spread).")] = 5,
        warmup: Annotated[int, typer.Option(min=0, help="Unrecorded warm-up requests first.")] = 1,
        prompt_lengths: Annotated[str, typer.Option(help="ttft-sweep prompt tokens, comma-separated.")] = ",".join(map(str, DEFAULT_PROMPT_LENGTHS)),
        concurrency: Annotated[str, typer.Option(help="Concurrent streams per level, comma-separated.")] = ",".join(map(str, DEFAULT_CONCURRENCY)),
        task_limit: Annotated[int | None, typer.Option(min=1, help="At most this many problems per task.")] = None,
        task_max_tokens: Annotated[int, typer.Option(min=16, help="Token budget of a task answer.")] = 1024,
        tasks_dir: Annotated[Path | None, typer.Option(help="Folder with gsm8k.jsonl / humaneval.jsonl[.gz].")] = None,
        tasks: Annotated[str, typer.Option(help=f"Task sets, comma-separated: {', '.join(TASKS)} or all.")] = ",".join(SEED000_TASKS),
        prompt_format: Annotated[str, typer.Option(help=f"Task prompts: {' or '.join(PROMPT_FORMATS)}.")] = "seed000",
        task_order: Annotated[str | None, typer.Option(help="Task problems: server (z-lab/dflash's server path: file "
                                                        "order, the first `concurrency` rows warm-up; seed004's "
                                                        "default) or shuffled (its seeded draw; the default).")] = None,
        thinking: Annotated[bool, typer.Option(help="enable_thinking for task requests.")] = False,
        random_input_len: Annotated[int, typer.Option(min=1, help="serving: prompt tokens of each request.")] = 1024,
        random_output_len: Annotated[int, typer.Option(min=2, help="serving: output tokens of each request.")] = 128,
        dataset_path: Annotated[Path | None, typer.Option(help="serving: prompts from this JSONL (`prompt`, optional "
                                                          "`output_tokens`), as vllm bench serve's custom dataset.")] = None,
        num_prompts: Annotated[int, typer.Option(min=1, help="serving: requests per run.")] = 64,
        max_concurrency: Annotated[str, typer.Option(help="serving: concurrency caps, comma-separated.")] = ",".join(map(str, DEFAULT_CONCURRENCY)),
        request_rate: Annotated[str, typer.Option(help="serving: requests per second, comma-separated; inf: no pacing.")] = "inf",
        burstiness: Annotated[float, typer.Option(min=0.01, help="serving: gamma shape of arrivals (1: Poisson).")] = 1.0,
        seed: Annotated[int, typer.Option(help="serving: seed of prompts and arrival times.")] = 0,
        tokenizer: Annotated[str | None, typer.Option(help="The model's Hugging Face tokenizer (name or path): counts "
                                                      "the tokens of a stream that reports no usage.")] = None,
        repeats: Annotated[int, typer.Option(min=1, help="Recorded runs per load level (3 or more gives a spread).")] = 3,
        goodput: Annotated[str, typer.Option(help="SLOs for goodput, e.g. 'ttft:500 tpot:50 e2el:10000' (ms).")] = "",
        ignore_eos: Annotated[bool, typer.Option(help="Send ignore_eos so speed requests generate max-tokens.")] = True,
        timeout: Annotated[float, typer.Option(min=1, help="Seconds one request may take.")] = 900.0,
        code_timeout: Annotated[float, typer.Option(min=0.5, help="Seconds one HumanEval program may run.")] = 10.0,
        unsafe_run_code_without_sandbox: Annotated[bool, typer.Option(
            UNSAFE_FLAG, help="Run model-written code unconfined where bubblewrap cannot isolate it.")] = False,
    ) -> None:
        """Measure decode, TTFT, task accuracy and acceptance, and throughput; write JSON, Markdown and plots."""
        if not 1 <= timeout <= MAX_TIMEOUT_S:  # typer's min=1 lets inf through
            raise UserError(f"--timeout {timeout:g}: seconds from 1 to {MAX_TIMEOUT_S:g}")
        if model is not None and not model.strip():
            raise UserError("--model '': name a served model, or leave it out for the first in /v1/models")
        chosen = load_profile(profile) if profile else None
        config = BenchConfig(
            url=engine_url(url, "--url"), suites=parse_suites(suite), model=model, max_tokens=max_tokens, samples=samples,
            warmup=warmup, prompt_lengths=parse_ints("--prompt-lengths", prompt_lengths, MAX_PROMPT_TOKENS),
            concurrency=parse_ints("--concurrency", concurrency), task_limit=task_limit,
            task_max_tokens=task_max_tokens, tasks_dir=tasks_dir,
            sampling=chosen.serve.sampling if chosen else None, ignore_eos=ignore_eos, timeout_s=timeout,
            sandbox=Limits(wall_s=code_timeout, unsafe_without_sandbox=unsafe_run_code_without_sandbox),
            api_key=api_key, tasks=parse_tasks(tasks), prompt_format=prompt_format, thinking=thinking,
            task_order=task_order,
            random_input_len=random_input_len, random_output_len=random_output_len, num_prompts=num_prompts,
            dataset_path=dataset_path,
            max_concurrency=parse_ints("--max-concurrency", max_concurrency),
            request_rate=parse_rates(request_rate), burstiness=burstiness, seed=seed, repeats=repeats,
            tokenizer=tokenizer,
            goodput=parse_goodput(goodput.replace(",", " ").split()),
        )
        if prompt_format not in PROMPT_FORMATS:
            raise UserError(f"--prompt-format {prompt_format!r}: choose from {', '.join(PROMPT_FORMATS)}")
        if task_order is not None and task_order not in TASK_ORDERS:
            raise UserError(f"--task-order {task_order!r}: choose from {', '.join(TASK_ORDERS)}")
        config = apply_method(config, method)
        if "tasks" in config.suites:
            require_sandbox(config.sandbox)
        base = load_result(baseline) if baseline else None
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        bar = Progress(*columns, console=err, transient=False)
        with output_dir(out_dir):
            try:
                result = run_bench(config, chosen, base, baseline, RichProgress(bar))
            finally:
                if bar.live.is_started:  # drawn from the first suite on: a refusal before it is its error line
                    bar.stop()
        paths = write_outputs(result, out_dir)
        # Plain Markdown, so the tables paste into an issue or a README as they are.
        out.print(paths["markdown"].read_text(), markup=False, highlight=False, soft_wrap=True)
        for kind, path in paths.items():
            out.print(f"{kind:>11}: {path}", highlight=False)
        if result.interrupted:
            err.print("[yellow]interrupted:[/] wrote the samples gathered so far")
            raise typer.Exit(130)
        if result.aborted or result.failures.count:
            failed = result.failures.count
            err.print(f"[red]failed:[/] {result.aborted or f'{failed} request(s) failed'} (see the report)")
            raise typer.Exit(1)

