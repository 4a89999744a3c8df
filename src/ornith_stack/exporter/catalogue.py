"""The one list of metrics ornith-stack exports: name, type, unit, help and labels.

The exporter, the recording and alert rules, the dashboards and monitoring/README.md all read names
from here, so a renamed metric cannot leave a dead panel or a silent alert. Conventions: `ornith_`
prefix, base units (seconds, ratios 0-1), counters end in `_total` on the wire (prometheus_client adds
it), no colons (those are for recording rules). The exporter keeps no window of its own: it passes the
engines' counters through, and `RECORDED` holds the rate() expressions that turn them into acceptance
length, draft-acceptance ratio and tokens/s. A gauge is exported only where the engine has nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["gauge", "counter", "histogram"]

# The unit of a share: a figure in it outside [0, 1] is rejected, not passed on.
RATIO = "ratio 0-1"
# Labels every per-target engine metric carries.
TARGET = ("target", "profile")
ENGINE = ("target", "profile", "engine", "model")
# Labels of the host's own series (GPUs, the model cache): the exporter's --profile, not a target.
GPU = ("profile", "gpu", "uuid", "name")
CACHE = ("profile", "path")


@dataclass(frozen=True)
class Metric:
    name: str  # family name; counters get `_total` on the wire, histograms `_bucket`/`_sum`/`_count`
    kind: Kind
    unit: str  # what one unit of the value is, for the README and the dashboard axes
    help: str
    labels: tuple[str, ...]
    concern: str  # which collector produces it

    @property
    def series(self) -> str:
        """The name a PromQL query uses for a counter or gauge."""
        return f"{self.name}_total" if self.kind == "counter" else self.name

    @property
    def bucket(self) -> str:
        assert self.kind == "histogram", self.name
        return f"{self.name}_bucket"

    @property
    def sample_names(self) -> tuple[str, ...]:
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.series,)


def _m(name: str, kind: Kind, unit: str, labels: tuple[str, ...], concern: str, help_: str) -> Metric:
    return Metric(name, kind, unit, help_, labels, concern)


# -- engine and info ---------------------------------------------------------------------------
ENGINE_UP = _m("ornith_engine_up", "gauge", "1 or 0", TARGET, "engine",
               "1 if the last scrape of the engine's /metrics succeeded and parsed, else 0.")
ENGINE_INFO = _m("ornith_engine_info", "gauge", "always 1",
                 ("target", "profile", "engine", "version", "model", "draft"), "engine",
                 "Engine kind and version, served model and draft model of a target (value 1).")

# -- speculative decoding: the engines' counters under our names ------------------------------
SPEC_STEPS = _m("ornith_spec_verify_steps", "counter", "steps", ENGINE, "spec",
                "Verification steps (vLLM: spec_decode_num_drafts; SGLang: spec_verify_calls, which moves "
                "when a request finishes), the engine's own counter.")
SPEC_ACCEPTED_TOKENS = _m("ornith_spec_accepted_tokens", "counter", "tokens", ENGINE, "spec",
                          "Drafted tokens accepted (vLLM: spec_decode_num_accepted_tokens; SGLang: "
                          "generation_tokens - spec_verify_calls, one bonus token per step).")
SPEC_DRAFT_TOKENS = _m("ornith_spec_draft_tokens", "counter", "tokens", ENGINE, "spec",
                       "Drafted tokens proposed for verification (vLLM: spec_decode_num_draft_tokens; SGLang: "
                       "verify steps x (num_draft_tokens - 1), the block size from /server_info).")
SPEC_ACCEPTED_PER_POSITION = _m(
    "ornith_spec_accepted_tokens_per_position", "counter", "tokens", (*ENGINE, "position"), "spec",
    "Accepted drafted tokens by draft position, 0 = first (vLLM only), the engine's own counter.")
SPEC_ENGINE_ACCEPTANCE_LENGTH = _m(
    "ornith_spec_engine_acceptance_length", "gauge", "tokens per verification step", ENGINE, "spec",
    "The engine's own acceptance-length gauge over its last log interval (SGLang spec_accept_length, "
    "40 decode iterations); absent before the first interval, where SGLang shows 0.0.")
SPEC_ENGINE_DRAFT_ACCEPTANCE_RATIO = _m(
    "ornith_spec_engine_draft_acceptance_ratio", "gauge", RATIO, ENGINE, "spec",
    "The engine's own draft-acceptance gauge over its last log interval (SGLang spec_accept_rate); "
    "absent before the first interval.")

# -- tokens ------------------------------------------------------------------------------------
GENERATION_TOKENS = _m("ornith_generation_tokens", "counter", "tokens", ENGINE, "throughput",
                       "Generated tokens, the engine's own counter (SGLang counts a request's tokens when it "
                       "finishes).")
PROMPT_TOKENS = _m("ornith_prompt_tokens", "counter", "tokens", ENGINE, "throughput",
                   "Prompt tokens processed, the engine's own counter.")
DECODE_TOKENS = _m("ornith_decode_tokens", "counter", "tokens", ENGINE, "throughput",
                   "Tokens produced by decode steps, counted every engine iteration (SGLang "
                   "realtime_tokens{mode=\"decode\"}; vLLM generation_tokens, which it counts per iteration).")

# -- requests and caches -----------------------------------------------------------------------
REQUESTS_RUNNING = _m("ornith_requests_running", "gauge", "requests", ENGINE, "requests",
                      "Requests being decoded now.")
REQUESTS_WAITING = _m("ornith_requests_waiting", "gauge", "requests", ENGINE, "requests",
                      "Requests queued, waiting to be scheduled.")
KV_CACHE_USAGE = _m("ornith_kv_cache_usage_ratio", "gauge", RATIO, ENGINE, "requests",
                    "Share of the KV cache in use on the fullest data-parallel rank (vLLM kv_cache_usage_perc, "
                    "SGLang full_token_usage).")
MAMBA_CACHE_USAGE = _m("ornith_mamba_cache_usage_ratio", "gauge", RATIO, ENGINE, "requests",
                       "Share of the mamba state slots in use on the fullest rank (SGLang mamba_usage; "
                       "engines that do not report it have no series).")

REQUESTS_FINISHED = _m("ornith_requests_finished", "counter", "requests", ENGINE, "requests",
                       "Requests the engine finished, whatever the outcome (vLLM request_success, every "
                       "finished_reason; SGLang num_requests, those an abort ended included), the engine's own "
                       "counter: the abort ratio's denominator.")
REQUESTS_ABORTED = _m("ornith_requests_aborted", "counter", "requests", ENGINE, "requests",
                      "Requests ended by an abort, mostly clients that went away (vLLM request_success with "
                      "finished_reason=\"abort\"). SGLang counts abort calls instead (num_aborted_requests: one "
                      "abort_all that ends four streams counts 1, so a lower bound), from the first one on; SGLang "
                      "0.5.17 lets the request of a client that went away run on and counts nothing for it.")

# -- latency: the engine's histograms passed through under our names ---------------------------
TTFT = _m("ornith_time_to_first_token_seconds", "histogram", "seconds", ENGINE, "latency",
          "Time to first token per request (the engine's histogram, buckets as the engine sets them).")
ITL = _m("ornith_inter_token_latency_seconds", "histogram", "seconds", ENGINE, "latency",
         "Time between output tokens (the engine's histogram; with speculation several tokens may "
         "arrive in one step).")
E2E = _m("ornith_e2e_request_latency_seconds", "histogram", "seconds", ENGINE, "latency",
         "End-to-end request latency (the engine's histogram).")

# -- canary ------------------------------------------------------------------------------------
CANARY_SUCCESS = _m("ornith_canary_success", "gauge", "1 or 0", TARGET, "canary",
                    "1 if the last canary request completed (HTTP 200 and an answer), else 0.")
CANARY_CORRECT = _m("ornith_canary_correct", "gauge", "1 or 0", TARGET, "canary",
                    "1 if the last completed canary answer was the known right answer, else 0; absent with "
                    "--canary-check liveness.")
CANARY_TTFT = _m("ornith_canary_ttft_seconds", "gauge", "seconds", TARGET, "canary",
                 "Time to first token of the last completed canary request.")
CANARY_DECODE_RATE = _m("ornith_canary_decode_tokens_per_second", "gauge", "tokens/s", TARGET, "canary",
                        "Decode speed of the last canary decode request (tokens after the first / time between "
                        "the first and the last); absent when it produced too few tokens to time.")
CANARY_RUNS = _m("ornith_canary_runs", "counter", "requests", (*TARGET, "outcome"), "canary",
                 "Canary requests by outcome: correct, wrong, failed, unchecked (an answer streamed; the "
                 "exporter runs with --canary-check liveness, for a model that cannot know the answer).")
CANARY_LAST_RUN = _m("ornith_canary_last_run_timestamp_seconds", "gauge", "unix seconds", TARGET, "canary",
                     "When the last canary run finished, whatever its outcome (stale: the canary stopped).")

# -- the host: GPUs through NVML, the model cache's disk ----------------------------------------
GPU_NVML_STATE = _m("ornith_gpu_nvml_state", "gauge", "1 or 0", ("profile", "state"), "gpu",
                    "NVML as the exporter's last scrape found it: 1 for the state it is in, 0 for the others. ok: "
                    "NVML answered; no_gpu: no NVIDIA driver or device where the exporter runs (a CPU host; with "
                    "--gpu-metrics auto, also a container without the NVIDIA runtime); error: NVML failed (driver "
                    "not loaded, no permission, a GPU lost, or no NVML where --gpu-metrics required expects "
                    "GPUs). Absent with --gpu-metrics off.")
GPU_UP = _m("ornith_gpu_up", "gauge", "1 or 0", GPU, "gpu",
            "1 if NVML answered the GPU's queries in the last scrape; 0 if one failed (GPU lost, unknown error) or "
            "NVML no longer lists a GPU it listed before (fallen off the bus), which stays until the exporter "
            "restarts.")
GPU_MEMORY_USED = _m("ornith_gpu_memory_used_bytes", "gauge", "bytes", GPU, "gpu",
                     "GPU memory in use by every process (NVML). An engine holds its static pools, 80-90% of the "
                     "memory, from start to stop: high is normal. Absent where the GPU has no memory of its own "
                     "(DGX Spark's unified memory: NVML answers NOT_SUPPORTED).")
GPU_MEMORY_TOTAL = _m("ornith_gpu_memory_total_bytes", "gauge", "bytes", GPU, "gpu",
                      "GPU memory in total (NVML); absent where the GPU has no memory of its own.")
GPU_UTILIZATION = _m("ornith_gpu_utilization_ratio", "gauge", RATIO, GPU, "gpu",
                     "Share of NVML's last sample period (1/6 s to 1 s, by GPU) in which a kernel ran on the GPU "
                     "(utilization.gpu / 100): busy time, not how much of the GPU the kernels used.")
MODEL_CACHE_SIZE = _m("ornith_model_cache_size_bytes", "gauge", "bytes", CACHE, "disk",
                      "Size of the file system holding the model cache path (statvfs: f_blocks x f_frsize).")
MODEL_CACHE_FREE = _m("ornith_model_cache_free_bytes", "gauge", "bytes", CACHE, "disk",
                      "Bytes an unprivileged writer can still use on the model cache's file system (statvfs: "
                      "f_bavail x f_frsize): what a model download has left.")
MODEL_CACHE_READABLE = _m("ornith_model_cache_readable", "gauge", "1 or 0", CACHE, "disk",
                          "1 if the exporter could read the model cache path's file system (statvfs), 0 if not "
                          "(not mounted into the exporter, removed, an I/O error): the disk figures are then absent.")

# -- the exporter itself -----------------------------------------------------------------------
SCRAPE_DURATION = _m("ornith_exporter_scrape_duration_seconds", "gauge", "seconds", TARGET, "self",
                     "How long the last scrape of the target took (fetch and parse).")
SCRAPES = _m("ornith_exporter_scrapes", "counter", "scrapes", TARGET, "self",
             "Scrapes of the target attempted (exporter answers made while one is in flight share it).")
SCRAPE_ERRORS = _m("ornith_exporter_scrape_errors", "counter", "scrapes", (*TARGET, "reason"), "self",
                   "Failed scrapes by reason: timeout (the scrape's deadline), connect, http_status, too_large, "
                   "truncated (the body ended short of its length or mid-line), not_exposition, duplicate (a "
                   "series exposed twice), unknown_engine, internal (an exporter bug; logged). A shared scrape "
                   "counts once; an answer that stopped waiting for one still running counts a timeout.")
ENGINE_RESTARTS = _m("ornith_exporter_engine_restarts", "counter", "restarts", TARGET, "self",
                     "Times the engine's counters went down between two scrapes by this exporter (a restart).")
SKIPPED_SAMPLES = _m("ornith_exporter_skipped_samples", "counter", "samples", (*TARGET, "reason"), "self",
                     "Engine samples left out of the unified metrics (or a label value cut), by reason: bad_bucket "
                     "(a histogram bucket whose le is not a number, NaN or -Inf, or whose count is not finite or "
                     "negative), too_many_buckets (past the cap per histogram, thinned evenly), too_many_series "
                     "(past the cap per target), not_finite (NaN or Inf), negative (a count below 0), "
                     "out_of_range (a ratio outside 0-1), long_label (an engine label value such as the model "
                     "name, cut to the cap).")
COLLECT_DURATION = _m("ornith_exporter_collect_duration_seconds", "gauge", "seconds", ("collector",), "self",
                      "How long the last collection of a host collector took: gpu (NVML queries), model_cache "
                      "(statvfs); present for the collectors that run.")
DUPLICATE_TARGET = _m("ornith_exporter_duplicate_target", "gauge", "always 1", (*TARGET, "same_as"), "self",
                      "Present while the target reaches the same engine as the earlier target `same_as` (same "
                      "engine kind, address and port, every loopback address as one, and path): its figures are "
                      "reported once, under `same_as`.")

# Bounded label values: every `reason` the exporter can emit.
ERROR_REASONS = ("timeout", "connect", "http_status", "too_large", "truncated", "not_exposition", "duplicate",
                 "unknown_engine", "internal")
SKIP_REASONS = ("bad_bucket", "too_many_buckets", "too_many_series", "not_finite", "negative", "out_of_range",
                "long_label")
CANARY_OUTCOMES = ("correct", "wrong", "failed", "unchecked")
GPU_STATES = ("ok", "no_gpu", "error")
HOST_COLLECTORS = ("gpu", "model_cache")
# GPUs one exporter reports (NVML's first ones; an HGX board has 8) and model cache paths it watches.
MAX_GPUS = 16
MAX_MODEL_CACHE_PATHS = 4
# Bounds on what one target adds to an answer, whatever the engine sends (a 100,000-bucket histogram made a
# 15 MB answer, a 1 MiB model name a 100 MB one). Draft positions beyond MAX_POSITIONS are not exported.
MAX_POSITIONS = 64
# Buckets per histogram, +Inf included: the recorded engines have at most 23 (tests/fixtures/engines/).
MAX_BUCKETS = 64
# Characters of an engine-supplied label value (model, version, draft); a model path is about 120.
MAX_LABEL_LENGTH = 256
# Unified engine series per target (a histogram counts its buckets, _sum and _count): the recordings
# make 90 to 130.
MAX_SERIES_PER_TARGET = 256

CATALOGUE: tuple[Metric, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Metric))
BY_NAME: dict[str, Metric] = {m.name: m for m in CATALOGUE}

# Targets one exporter serves: the exporter job's sample limit in Prometheus is sized for this many, so
# the exporter refuses more (a second exporter serves the rest).
MAX_TARGETS = 64
# The values of the labels an exporter adds itself, per metric.
_LABEL_VALUES = {SCRAPE_ERRORS.name: ERROR_REASONS, SKIPPED_SAMPLES.name: SKIP_REASONS,
                 CANARY_RUNS.name: CANARY_OUTCOMES}


def max_samples_per_target() -> int:
    """The most samples one target can add to an answer: its engine series (capped) and one sample per
    label value of every other per-target metric."""
    other = sum(len(_LABEL_VALUES.get(m.name, ("",))) for m in CATALOGUE
                if m.labels[: len(TARGET)] == TARGET and m.labels[: len(ENGINE)] != ENGINE)
    return MAX_SERIES_PER_TARGET + other


def max_host_samples() -> int:
    """The most samples the host collectors add to an answer, whatever the number of targets."""
    per_gpu = sum(1 for m in CATALOGUE if m.labels == GPU)
    per_path = sum(1 for m in CATALOGUE if m.labels == CACHE)
    return MAX_GPUS * per_gpu + len(GPU_STATES) + MAX_MODEL_CACHE_PATHS * per_path + len(HOST_COLLECTORS)


# -- derived series: recording rules over the counters above ------------------------------------
@dataclass(frozen=True)
class Recorded:
    """A series Prometheus computes from the exported counters with rate(), so every Prometheus server
    (and every window) sees the same figure whoever else scrapes the exporter."""

    name: str  # level:metric:operation, the recording-rule convention
    unit: str
    help: str
    expr: str

    @property
    def series(self) -> str:
        return self.name


# Recording rules keep the exporter's engine labels, and `namespace` where Kubernetes' scrape adds it:
# prometheus-operator scopes an AlertmanagerConfig's routes and inhibitions to alerts carrying its
# namespace, so an alert on a recorded series without it would miss the chart's webhook. Where no
# scrape adds it (compose, Ansible) the label is simply absent.
BY = ", ".join((*ENGINE, "namespace"))


def _rate(metric: Metric, window: str, by: str = BY) -> str:
    return f"sum by ({by}) (rate({metric.series}[{window}]))"


def _per(numerator: str, denominator: str) -> str:
    """numerator / denominator, absent (not NaN) while the denominator does not move."""
    return f"{numerator} / ({denominator} > 0)"


SPEC_ACCEPTANCE_LENGTH = Recorded(
    "ornith:spec_acceptance_length:rate5m", "tokens per verification step",
    "Mean tokens per verification step over 5 minutes, bonus token included (1 + accepted / steps); "
    "absent while no step happens. SGLang counts both when requests finish.",
    "1 + " + _per(_rate(SPEC_ACCEPTED_TOKENS, "5m"), _rate(SPEC_STEPS, "5m")))
SPEC_DRAFT_ACCEPTANCE_RATIO = Recorded(
    "ornith:spec_draft_acceptance_ratio:rate5m", RATIO,
    "Share of drafted tokens accepted over 5 minutes (accepted / drafted); absent while nothing is drafted.",
    _per(_rate(SPEC_ACCEPTED_TOKENS, "5m"), _rate(SPEC_DRAFT_TOKENS, "5m")))
SPEC_POSITION_ACCEPTANCE_RATIO = Recorded(
    "ornith:spec_position_acceptance_ratio:rate5m", RATIO,
    "Share of verification steps whose draft token at `position` (0 = first) was accepted, over 5 minutes "
    "(vLLM only).",
    f"{_rate(SPEC_ACCEPTED_PER_POSITION, '5m', f'{BY}, position')} / on ({BY}) group_left () "
    f"({_rate(SPEC_STEPS, '5m')} > 0)")
GENERATION_TOKENS_PER_SECOND = Recorded(
    "ornith:decode_tokens:rate1m", "tokens/s",
    "Tokens decoded per second over 1 minute, from the per-iteration counter (smooth on long generations).",
    _rate(DECODE_TOKENS, "1m"))
PROMPT_TOKENS_PER_SECOND = Recorded(
    "ornith:prompt_tokens:rate1m", "tokens/s", "Prompt tokens processed per second over 1 minute.",
    _rate(PROMPT_TOKENS, "1m"))

SPEC_VERIFY_STEPS_PER_SECOND = Recorded(
    "ornith:spec_verify_steps:rate5m", "steps/s",
    "Verification steps per second over 5 minutes: the acceptance alert's guard (real traffic, not the canary).",
    _rate(SPEC_STEPS, "5m"))


def _quantile(q: float, metric: Metric) -> str:
    return f"histogram_quantile({q}, sum by ({BY}, le) (rate({metric.bucket}[5m])))"


TTFT_P50 = Recorded("ornith:time_to_first_token_seconds:p50_5m", "seconds",
                    "Median time to first token over 5 minutes.", _quantile(0.5, TTFT))
TTFT_P95 = Recorded("ornith:time_to_first_token_seconds:p95_5m", "seconds",
                    "95th percentile time to first token over 5 minutes (what the TTFT alert reads).",
                    _quantile(0.95, TTFT))
ITL_P50 = Recorded("ornith:inter_token_latency_seconds:p50_5m", "seconds",
                   "Median inter-token latency over 5 minutes.", _quantile(0.5, ITL))
ITL_P95 = Recorded("ornith:inter_token_latency_seconds:p95_5m", "seconds",
                   "95th percentile inter-token latency over 5 minutes.", _quantile(0.95, ITL))

RECORDED: tuple[Recorded, ...] = (SPEC_ACCEPTANCE_LENGTH, SPEC_DRAFT_ACCEPTANCE_RATIO, SPEC_POSITION_ACCEPTANCE_RATIO,
                                  GENERATION_TOKENS_PER_SECOND, PROMPT_TOKENS_PER_SECOND,
                                  SPEC_VERIFY_STEPS_PER_SECOND, TTFT_P50, TTFT_P95, ITL_P50, ITL_P95)

# Per-profile constant series (one rule per profile, written from its published results by
# generate/alerts.py): the alerts compare the recorded figures above with them.
EXPECTED_ACCEPTANCE = "ornith:profile_expected_acceptance_length"
TTFT_THRESHOLD = "ornith:profile_ttft_p95_threshold_seconds"


def exported_sample_names() -> set[str]:
    """Every sample name the exporter can put on the wire (what PromQL may select)."""
    return {name for metric in CATALOGUE for name in metric.sample_names}
