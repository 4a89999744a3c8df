"""SGLang's metric names (0.5.17 and 0.5.21, `--enable-metrics`) and the dashboard panels of its own series.

Read in SGLang 0.5.17's /metrics (tests/fixtures/engines/sglang-0.5.17/tp1/metrics-after.txt). The
exporter turns the figures of `NAMES` into ornith_* metrics; the panels below show series it passes by.
"""

from __future__ import annotations

from ornith_stack.engines.base import MetricNames, PanelQuery, PromQL

PREFIX = "sglang:"
NAMES = MetricNames(
    generation_tokens="sglang:generation_tokens_total",
    prompt_tokens="sglang:prompt_tokens_total",
    requests_running="sglang:num_running_reqs",
    requests_waiting="sglang:num_queue_reqs",
    # token_usage is the fullest of the KV, SWA and mamba pools; full_token_usage is the KV pool alone.
    kv_cache_usage="sglang:full_token_usage",
    ttft="sglang:time_to_first_token_seconds",
    itl="sglang:inter_token_latency_seconds",
    e2e="sglang:e2e_request_latency_seconds",
)
VERIFY_CALLS = "sglang:spec_verify_calls_total"
ACCEPT_LENGTH = "sglang:spec_accept_length"
ACCEPT_RATE = "sglang:spec_accept_rate"
NUM_DRAFT_TOKENS = "sglang:spec_num_draft_tokens"
SPEC_SAMPLES = (VERIFY_CALLS, ACCEPT_LENGTH, ACCEPT_RATE, NUM_DRAFT_TOKENS)
# realtime_tokens_total{mode="decode"} grows every decode iteration (batch size plus accepted drafts);
# generation_tokens_total only when a request finishes.
REALTIME_TOKENS = "sglang:realtime_tokens_total"
MAMBA_USAGE = "sglang:mamba_usage"
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
# SGLang counts every finished request (those an abort ended too); its abort counter counts abort *calls*
# (one `abort_all` that ended four streams reads 1: tests/fixtures recording canary-abort), not failed
# requests, so it is no failure count: the error-ratio SLO has none from SGLang (its gateway's covers it).
REQUESTS_FINISHED = "sglang:num_requests_total"
REQUESTS_FAILED = ""
ABORT_CALLS = "sglang:num_aborted_requests_total"
# What the adapter reads beyond NAMES and the speculative samples (the abort calls: ornith_requests_aborted).
EXTRA_SAMPLES = (REALTIME_TOKENS, MAMBA_USAGE, ABORT_CALLS)

# -- the dashboard's panels of SGLang's own series --------------------------------------------------
# Request length histograms: (bucket, panel title, description).
LENGTHS = (
    ("sglang:prompt_tokens_histogram_bucket", "Prompt length (SGLang)", "Prompt tokens per request (SGLang)."),
    ("sglang:generation_tokens_histogram_bucket", "Output length (SGLang)", "Generated tokens per request (SGLang)."),
)
# Latency histograms by panel: queue_time, tpot, prefill_time, decode_time.
HISTOGRAMS = {"queue_time": "sglang:queue_time_seconds_bucket"}


def panel_queries(q: PromQL) -> dict[str, tuple[PanelQuery, ...]]:
    """The queries SGLang adds to the dashboard's engine panels, by panel."""
    return {
        "finished": (
            PanelQuery(q.rate_by(REQUESTS_FINISHED, "target"), "{{target}} finished"),
            PanelQuery(q.rate_by(ABORT_CALLS, "target"), "{{target}} abort calls"),
        ),
        "prefix_cache": (PanelQuery(q.sel("sglang:cache_hit_rate"), "{{target}} radix cache"),),
        # SGLang creates its retraction counter at the first retraction: until then the panel reads 0
        # from the gauge of the last step's retractions, which it exports from the start.
        "preemptions": (
            PanelQuery(
                f"{q.rate_by('sglang:num_retracted_requests_total', 'target')} or "
                f"(sum by (target) ({q.sel('sglang:num_retracted_reqs')}) * 0)",
                "{{target}} retracted",
            ),
        ),
    }
