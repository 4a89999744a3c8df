"""The one list of metrics ornith-stack exports: name, type, unit, help and labels.

The exporter, the recording and alert rules, the dashboards and monitoring/README.md all read names
from here, so a renamed metric cannot leave a dead panel or a silent alert. Conventions: `ornith_`
prefix, base units (seconds, ratios 0-1), counters end in `_total` on the wire (prometheus_client adds
it), no colons (those are for recording rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["gauge", "counter", "histogram"]

# Labels every per-target engine metric carries.
TARGET = ("target", "profile")
ENGINE = ("target", "profile", "engine", "model")


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

# -- speculative decoding ----------------------------------------------------------------------
SPEC_ACCEPTANCE_LENGTH = _m(
    "ornith_spec_acceptance_length", "gauge", "tokens per verification step", ENGINE, "spec",
    "Mean tokens produced per verification step, bonus token included (1 + accepted/steps) over the "
    "window since the previous scrape; lifetime value on the first scrape or after an engine restart; "
    "keeps its last value while no step happens.")
SPEC_DRAFT_ACCEPTANCE_RATIO = _m(
    "ornith_spec_draft_acceptance_ratio", "gauge", "ratio 0-1", ENGINE, "spec",
    "Share of drafted tokens that were accepted over the window (vLLM: accepted/draft tokens; "
    "SGLang: its spec_accept_rate gauge).")
SPEC_POSITION_ACCEPTANCE_RATIO = _m(
    "ornith_spec_position_acceptance_ratio", "gauge", "ratio 0-1", (*ENGINE, "position"), "spec",
    "Share of verification steps whose draft token at `position` (0 = first) was accepted, over the "
    "window. Only engines that count per position (vLLM).")
SPEC_STEPS = _m("ornith_spec_verify_steps", "counter", "steps", ENGINE, "spec",
                "Verification steps (vLLM: drafts; SGLang: verify calls), the engine's own counter.")
SPEC_ACCEPTED_TOKENS = _m("ornith_spec_accepted_tokens", "counter", "tokens", ENGINE, "spec",
                          "Drafted tokens accepted, the engine's own counter (SGLang: generated - steps).")
SPEC_DRAFT_TOKENS = _m("ornith_spec_draft_tokens", "counter", "tokens", ENGINE, "spec",
                       "Drafted tokens proposed for verification (engines that count them: vLLM).")
SPEC_ACCEPTED_PER_POSITION = _m(
    "ornith_spec_accepted_tokens_per_position", "counter", "tokens", (*ENGINE, "position"), "spec",
    "Accepted drafted tokens by draft position (vLLM), the engine's own counter.")

# -- throughput --------------------------------------------------------------------------------
GENERATION_TOKENS_PER_SECOND = _m(
    "ornith_generation_tokens_per_second", "gauge", "tokens/s", ENGINE, "throughput",
    "Generated tokens per second over the window between the last two scrapes (absent on the first).")
PROMPT_TOKENS_PER_SECOND = _m(
    "ornith_prompt_tokens_per_second", "gauge", "tokens/s", ENGINE, "throughput",
    "Prompt tokens processed per second over the window between the last two scrapes.")
GENERATION_TOKENS = _m("ornith_generation_tokens", "counter", "tokens", ENGINE, "throughput",
                       "Generated tokens, the engine's own counter.")
PROMPT_TOKENS = _m("ornith_prompt_tokens", "counter", "tokens", ENGINE, "throughput",
                   "Prompt tokens processed, the engine's own counter.")

# -- requests and KV cache ---------------------------------------------------------------------
REQUESTS_RUNNING = _m("ornith_requests_running", "gauge", "requests", ENGINE, "requests",
                      "Requests being decoded now.")
REQUESTS_WAITING = _m("ornith_requests_waiting", "gauge", "requests", ENGINE, "requests",
                      "Requests queued, waiting to be scheduled.")
KV_CACHE_USAGE = _m("ornith_kv_cache_usage_ratio", "gauge", "ratio 0-1", ENGINE, "requests",
                    "Share of the KV cache in use (vLLM kv_cache_usage_perc, SGLang token_usage).")

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
                    "1 if the last completed canary answer was the known right answer, else 0.")
CANARY_TTFT = _m("ornith_canary_ttft_seconds", "gauge", "seconds", TARGET, "canary",
                 "Time to first token of the last completed canary request.")
CANARY_DECODE_RATE = _m("ornith_canary_decode_tokens_per_second", "gauge", "tokens/s", TARGET, "canary",
                        "Decode speed of the last completed canary request (tokens after the first / time).")
CANARY_RUNS = _m("ornith_canary_runs", "counter", "requests", (*TARGET, "outcome"), "canary",
                 "Canary requests by outcome: correct, wrong, failed.")
CANARY_LAST_RUN = _m("ornith_canary_last_run_timestamp_seconds", "gauge", "unix seconds", TARGET, "canary",
                     "When the last canary request finished.")

# -- the exporter itself -----------------------------------------------------------------------
SCRAPE_DURATION = _m("ornith_exporter_scrape_duration_seconds", "gauge", "seconds", TARGET, "self",
                     "How long the last scrape of the target took (fetch and parse).")
SCRAPES = _m("ornith_exporter_scrapes", "counter", "scrapes", TARGET, "self",
             "Scrapes of the target attempted.")
SCRAPE_ERRORS = _m("ornith_exporter_scrape_errors", "counter", "scrapes", (*TARGET, "reason"), "self",
                   "Failed scrapes by reason: timeout, connect, http_status, not_exposition, unknown_engine, "
                   "internal (an exporter bug; logged).")
COUNTER_RESETS = _m("ornith_exporter_counter_resets", "counter", "resets", TARGET, "self",
                    "Times the engine's counters went down between scrapes (engine restarts).")

# Bounded label values: every `reason` the exporter can emit.
ERROR_REASONS = ("timeout", "connect", "http_status", "not_exposition", "unknown_engine", "internal")
CANARY_OUTCOMES = ("correct", "wrong", "failed")
# Draft positions beyond this are not exported (bounded labels even if an engine misbehaves).
MAX_POSITIONS = 64

CATALOGUE: tuple[Metric, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Metric))
BY_NAME: dict[str, Metric] = {m.name: m for m in CATALOGUE}


def exported_sample_names() -> set[str]:
    """Every sample name the exporter can put on the wire (what PromQL may select)."""
    return {name for metric in CATALOGUE for name in metric.sample_names}
