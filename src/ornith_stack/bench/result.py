"""The bench result as frozen dataclasses: the run with its settings, each suite, each load level, each request.

`bench.json` is `to_json(BenchResult)`; a saved one is read back with `load_result`, which checks every
field's type and names the file and the field that does not fit. Fields added in later versions have
defaults, so results saved by earlier versions load (their missing figures are None or empty).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ornith_stack.bench.codec import OMIT_NONE, Malformed, from_json
from ornith_stack.errors import UserError
from ornith_stack.reading import MAX_CONFIG_BYTES, read_json_object

FORMAT = "ornith-stack-bench/1"
# A saved result holds every request's text: a full seed 004 run (640 answers of up to 4,096 tokens) is
# about 20 MB, the 64 MiB cap on configuration files is above it.
MAX_RESULT_BYTES = MAX_CONFIG_BYTES


# -- spreads -----------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Summary:
    """Median and spread of the values that exist; n counts them."""

    n: int = 0
    median: float | None = None
    min: float | None = None
    max: float | None = None
    stdev: float | None = None


@dataclass(frozen=True, kw_only=True)
class Distribution:
    """Latency percentiles as the peers' serving benchmarks report them."""

    n: int = 0
    mean: float | None = None
    median: float | None = None
    p90: float | None = None
    p99: float | None = None
    stdev: float | None = None
    min: float | None = None
    max: float | None = None


# -- one request -------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SpecWindow:
    """The engine's speculative counters' movement over one request."""

    steps: float
    accepted: float
    drafted: float | None = None
    accepted_per_position: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Extra:
    """What the engine says about one request besides the stream: its counters around it, its own step count."""

    engine_generation_tokens: float | None = field(default=None, metadata=OMIT_NONE)
    acceptance_length: float | None = field(default=None, metadata=OMIT_NONE)
    spec: SpecWindow | None = field(default=None, metadata=OMIT_NONE)
    spec_verify_ct: int | None = field(default=None, metadata=OMIT_NONE)  # SGLang's meta_info, non-streaming
    completion_tokens_from: str | None = field(default=None, metadata=OMIT_NONE)  # "tokenizer": no usage


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One timed request (client.RequestSample frozen, with its derived rates)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    decode_s: float | None = None
    e2e_s: float | None = None
    chunks: int = 0
    itl_s: tuple[float, ...] = ()
    finish_reason: str | None = None
    text: str = ""
    reasoning: str = ""
    started_at: float = 0.0
    error: str | None = None
    extra: Extra = field(default_factory=Extra)
    decode_tok_s: float | None = None
    tpot_s: float | None = None
    repeat: int | None = field(default=None, metadata=OMIT_NONE)  # load levels: which recorded run


@dataclass(frozen=True, kw_only=True)
class TaskSample(Sample):
    """A task request with its problem and the checker's verdict (passed None: the task has no checker)."""

    id: str = ""
    passed: bool | None = None
    extracted: str | None = None
    check: str | None = None


# -- suites ------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class DecodeSuite:
    max_tokens: int | None = None
    samples: tuple[Sample, ...] = ()
    decode_tok_s: Summary = field(default_factory=Summary)
    engine_decode_tok_s: Summary = field(default_factory=Summary)
    ttft_s: Summary = field(default_factory=Summary)
    errors: int = 0
    acceptance_length: float | None = None


@dataclass(frozen=True, kw_only=True)
class Acceptance:
    """A task's acceptance in both definitions (acceptance.py), its draft-acceptance rate and per-position rates."""

    requests: int
    per_request_mean: float
    token_weighted: float
    draft_acceptance_rate: float | None = None
    per_position: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TaskThroughput:
    """Seed 004's throughput at one concurrency: total output tokens over end-to-end wall time."""

    concurrency: int
    requests: int = 0
    errors: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0
    output_tok_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class TaskEntry:
    """One task: its problems' samples, pass rate, decode rate, acceptance and throughput per concurrency."""

    source: str = ""
    available: int | None = None  # the problems the source holds, before --task-limit
    samples: tuple[TaskSample, ...] = ()
    throughput: tuple[TaskThroughput, ...] = ()
    n: int = 0
    checked: int | None = None
    passed: int = 0
    accuracy: float | None = None
    decode_tok_s: Summary = field(default_factory=Summary)
    task_decode_tok_s: float | None = None
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    completion_tokens: int = 0
    errors: int = 0
    acceptance_length: float | None = None
    acceptance: Acceptance | None = None


@dataclass(frozen=True, kw_only=True)
class SamplingSettings:
    temperature: float
    top_p: float
    top_k: int


@dataclass(frozen=True, kw_only=True)
class TasksSuite:
    max_tokens: int | None = None
    prompt_format: str = "seed000"
    order: str | None = None  # datasets.TASK_ORDERS
    thinking: bool = False
    requested_samples: int | None = None
    sampling: SamplingSettings | str = "greedy"
    tasks: dict[str, TaskEntry] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SweepPoint:
    """One prompt length of the TTFT sweep: its requests and their medians (error: why none succeeded)."""

    target_prompt_tokens: int | None = None
    samples: tuple[Sample, ...] = ()
    prompt_tokens: int | None = None
    ttft_s: float | None = None
    decode_tok_s: float | None = None
    ttft_spread: Summary | None = None
    decode_spread: Summary | None = None
    error: str | None = None
    errors: int = 0


@dataclass(frozen=True, kw_only=True)
class SweepSuite:
    max_tokens: int | None = None
    max_model_len: int | None = None
    max_total_tokens: int | None = None
    dropped_lengths: tuple[int, ...] = ()
    points: tuple[SweepPoint, ...] = ()
    tokens_per_word: float | None = None


@dataclass(frozen=True, kw_only=True)
class RunMetrics:
    """The peers' table over one recorded run of a load level (serving.serving_metrics)."""

    completed: int = 0
    failed: int = 0
    duration_s: float = 0.0
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    request_throughput: float | None = None
    output_tok_s: float | None = None
    total_tok_s: float | None = None
    goodput: float | None = None
    slos_ms: dict[str, float] = field(default_factory=dict)
    ttft_ms: Distribution = field(default_factory=Distribution)
    tpot_ms: Distribution = field(default_factory=Distribution)
    itl_ms: Distribution = field(default_factory=Distribution)
    e2el_ms: Distribution = field(default_factory=Distribution)
    errors: dict[str, int] = field(default_factory=dict)
    # The bench process's own CPU seconds over the run (time.process_time), and per 1,000 output tokens:
    # a client near one CPU second per wall second is measuring itself, not the engine.
    client_cpu_s: float | None = None
    client_cpu_s_per_1k_tokens: float | None = None


@dataclass(frozen=True, kw_only=True)
class RunSpread:
    """Each headline figure across the recorded runs of one level."""

    output_tok_s: Summary = field(default_factory=Summary)
    request_throughput: Summary = field(default_factory=Summary)
    ttft_ms_median: Summary = field(default_factory=Summary)
    tpot_ms_median: Summary = field(default_factory=Summary)
    itl_ms_median: Summary = field(default_factory=Summary)
    e2el_ms_median: Summary = field(default_factory=Summary)
    client_cpu_s_per_1k_tokens: Summary = field(default_factory=Summary)


@dataclass(frozen=True, kw_only=True)
class Level:
    """One load level: its recorded runs, every request of them, and the spread across runs."""

    load: str = ""
    runs: tuple[RunMetrics, ...] = ()
    samples: tuple[Sample, ...] = ()
    flushed_cache: str | None = None  # the engine route that emptied the prefix cache first
    spread: RunSpread | None = None
    output_tok_s: float | None = None
    errors: int = 0
    decode_tok_s: Summary | None = None


@dataclass(frozen=True, kw_only=True)
class ConcurrencyLevel(Level):
    concurrency: int


@dataclass(frozen=True, kw_only=True)
class ServingLevel(Level):
    request_rate: float | str = "inf"
    max_concurrency: int | None = None
    exceeds_pool: bool | None = field(default=None, metadata=OMIT_NONE)  # SGLang's token pool is smaller


@dataclass(frozen=True, kw_only=True)
class ConcurrencySuite:
    max_tokens: int | None = None
    repeats: int | None = None
    levels: tuple[ConcurrencyLevel, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ServingSuite:
    input_len: int | None = None  # None: prompts from --dataset-path
    output_len: int = 0
    num_prompts: int = 0
    repeats: int = 0
    seed: int = 0
    burstiness: float = 1.0
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)
    max_total_tokens: int | None = None
    levels: tuple[ServingLevel, ...] = ()
    dataset: str | None = field(default=None, metadata=OMIT_NONE)
    tokens_per_word: float | None = field(default=None, metadata=OMIT_NONE)
    template_tokens: int | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, kw_only=True)
class Suites:
    decode: DecodeSuite | None = field(default=None, metadata=OMIT_NONE)
    tasks: TasksSuite | None = field(default=None, metadata=OMIT_NONE)
    ttft_sweep: SweepSuite | None = field(default=None, metadata=OMIT_NONE)
    concurrency: ConcurrencySuite | None = field(default=None, metadata=OMIT_NONE)
    serving: ServingSuite | None = field(default=None, metadata=OMIT_NONE)


# -- comparison --------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Figures:
    """The headline numbers of one result (compare.figures)."""

    decode_tok_s: float | None = None
    decode_source: str | None = None  # "tasks" or "essays"
    essay_decode_tok_s: float | None = None
    ttft_s: float | None = None
    acceptance_length: dict[str, float | None] = field(default_factory=dict)
    accuracy: dict[str, float | None] = field(default_factory=dict)
    task_decode_tok_s: dict[str, float | None] = field(default_factory=dict)
    task_throughput: dict[str, dict[str, float | None]] = field(default_factory=dict)
    decode_acceptance_length: float | None = None
    concurrency_tok_s: dict[str, float | None] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class BaselineFigures(Figures):
    file: str = ""
    url: str | None = None


@dataclass(frozen=True, kw_only=True)
class SeedPoint:
    prompt_tokens: int
    ttft_s: float | None = None
    decode_tok_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class SeedFigures:
    """The profile's `expected` block: the seed's published figures."""

    source: str = ""
    decode_tok_s: float | None = None
    baseline_decode_tok_s: float | None = None
    speedup: float | None = None
    acceptance_length: dict[str, float] = field(default_factory=dict)
    accuracy: dict[str, float] = field(default_factory=dict)
    baseline_accuracy: dict[str, float] = field(default_factory=dict)
    sweep: tuple[SeedPoint, ...] = ()
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    attention_block_size: int | None = None
    weights_gib: float | None = None


@dataclass(frozen=True, kw_only=True)
class RooflineFigures:
    shape: str
    active_params: int
    bytes_per_token: float
    bandwidth_gbps: float
    tok_s: float
    percent: float | None = None  # this run's decode as a share of the roofline


@dataclass(frozen=True, kw_only=True)
class Comparison:
    this_run: Figures = field(default_factory=Figures)
    baseline: BaselineFigures | None = field(default=None, metadata=OMIT_NONE)
    speedup_vs_baseline: float | None = field(default=None, metadata=OMIT_NONE)
    speedup_per_task_vs_baseline: dict[str, float | None] | None = field(default=None, metadata=OMIT_NONE)
    concurrency_speedup_vs_baseline: dict[str, float | None] | None = field(default=None, metadata=OMIT_NONE)
    task_throughput_speedup_vs_baseline: dict[str, dict[str, float | None]] | None = field(default=None,
                                                                                           metadata=OMIT_NONE)
    seed: SeedFigures | None = field(default=None, metadata=OMIT_NONE)
    percent_of_seed_decode: float | None = field(default=None, metadata=OMIT_NONE)
    speedup_vs_seed_baseline: float | None = field(default=None, metadata=OMIT_NONE)
    speedup_per_task_vs_seed_baseline: dict[str, float | None] | None = field(default=None, metadata=OMIT_NONE)
    roofline: RooflineFigures | None = field(default=None, metadata=OMIT_NONE)
    roofline_note: str | None = field(default=None, metadata=OMIT_NONE)


# -- the run -----------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SandboxSettings:
    wall_s: float | None = None
    memory_mb: int | None = None
    bubblewrap: bool | None = field(default=None, metadata=OMIT_NONE)  # isolation available


@dataclass(frozen=True, kw_only=True)
class Settings:
    """The run's configuration as given (suites.BenchConfig), for reading a result later."""

    method: str | None = None
    tasks: tuple[str, ...] = ()
    prompt_format: str | None = None
    task_order: str | None = None
    thinking: bool | None = None
    task_concurrency: tuple[int, ...] = ()
    requested_task_samples: int | None = None
    random_input_len: int | None = None
    random_output_len: int | None = None
    dataset_path: str | None = None
    num_prompts: int | None = None
    max_concurrency: tuple[int, ...] = ()
    request_rate: tuple[float | str, ...] = ()
    burstiness: float | None = None
    seed: int | None = None
    repeats: int | None = None
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)
    timeout_s: float | None = None
    max_tokens: int | None = None
    samples: int | None = None
    warmup: int | None = None
    prompt_lengths: tuple[int, ...] = ()
    concurrency: tuple[int, ...] = ()
    task_limit: int | None = None
    task_max_tokens: int | None = None
    tasks_dir: str | None = None
    ignore_eos: bool | None = None
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)


@dataclass(frozen=True, kw_only=True)
class Failures:
    """Failed requests of the whole run: their count, and how many failed for each reason."""

    count: int = 0
    reasons: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class BenchResult:
    """One bench run: where and what it measured, each suite's results, and the comparison."""

    format: str = FORMAT
    url: str = ""
    model: str | None = None
    max_model_len: int | None = None
    profile: str | None = None
    engine: str | None = None
    suites_requested: tuple[str, ...] = ()
    started_at: float | None = None
    started_at_iso: str = ""
    interrupted: bool = False
    method: str | None = None
    aborted: str | None = None  # why the suites did not run
    settings: Settings = field(default_factory=Settings)
    suites: Suites
    duration_s: float | None = None
    failures: Failures = field(default_factory=Failures)
    comparison: Comparison = field(default_factory=Comparison)


def load_result(path: Path, flag: str = "--baseline") -> BenchResult:
    """A saved bench result (the bench.json this command writes); anything else is one error line naming
    the file and the field."""
    try:
        data: Any = read_json_object(path, MAX_RESULT_BYTES)
    except UserError as exc:
        raise UserError(f"{flag}: {exc}") from None
    if data.get("format", FORMAT) != FORMAT:
        raise UserError(f"{flag} {path}: format: not an ornith-stack bench result ({FORMAT})")
    try:
        return from_json(BenchResult, data)
    except Malformed as exc:
        what = "not an ornith-stack bench result (no 'suites')" if exc.path == "suites" and exc.problem == "missing" else exc.problem
        raise UserError(f"{flag} {path}: {exc.path}: {what}") from None
