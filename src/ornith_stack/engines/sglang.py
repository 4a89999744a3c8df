"""SGLang: flags, endpoints and metric names (0.5.17 and 0.5.21)."""

from __future__ import annotations

from typing import ClassVar

from ornith_stack.engines.base import EngineAdapter, MetricNames, ServeSettings, SpecCounters, first
from ornith_stack.engines.exposition import Samples
from ornith_stack.engines.vllm import _float_or_none, _int_or_none
from ornith_stack.profiles.model import ArgValue, Profile


class SglangAdapter(EngineAdapter):
    kind = "sglang"
    module = "sglang.launch_server"
    model_flag = "model-path"
    # SGLang exports /metrics only when asked to.
    serving_flags = ("host", "port", "enable-metrics")
    metrics: ClassVar[MetricNames] = MetricNames(
        generation_tokens="sglang:generation_tokens_total",
        prompt_tokens="sglang:prompt_tokens_total",
        requests_running="sglang:num_running_reqs",
        requests_waiting="sglang:num_queue_reqs",
        kv_cache_usage="sglang:token_usage",
        ttft="sglang:time_to_first_token_seconds",
        itl="sglang:inter_token_latency_seconds",
        e2e="sglang:e2e_request_latency_seconds",
    )

    def profile_args(self, profile: Profile) -> dict[str, ArgValue]:
        args: dict[str, ArgValue] = {}
        for flag, value in profile.serve.args.items():
            args[flag] = value
            # The seeds put the draft right after the algorithm; keep that order for readability.
            if flag == "speculative-algorithm" and profile.draft is not None and profile.draft.repo:
                args["speculative-draft-model-path"] = profile.draft.repo
                if profile.draft.revision != "main":
                    args["speculative-draft-model-revision"] = profile.draft.revision
        return args

    def listen_args(self, host: str, port: int) -> list[str]:
        return [*super().listen_args(host, port), "--enable-metrics"]

    def settings(self, profile: Profile) -> ServeSettings:
        args = profile.serve.args
        method = first(args, "speculative-algorithm")
        block = _int_or_none(first(args, "speculative-dflash-block-size", "speculative-num-draft-tokens"))
        return ServeSettings(
            tp=int(first(args, "tp", "tp-size", "tensor-parallel-size", default=1)),
            max_model_len=_int_or_none(first(args, "context-length")),
            mem_fraction_static=_float_or_none(first(args, "mem-fraction-static")),
            kv_cache_dtype=str(first(args, "kv-cache-dtype", default="auto")),
            enable_prefix_caching=not args.get("disable-radix-cache", False),
            max_total_tokens=_int_or_none(first(args, "max-total-tokens")),
            max_running_requests=_int_or_none(first(args, "max-running-requests")),
            speculative_method=str(method).lower() if method else None,
            # A DFlash block of 16 verifies 15 drafted tokens plus the bonus token.
            num_speculative_tokens=block - 1 if block else 0,
            draft_block_size=block,
            extra={k: v for k, v in args.items() if k.startswith("mamba-")},
        )

    def spec_counters(self, samples: Samples) -> SpecCounters | None:
        # SGLang counts verification steps; every generated token is either a bonus token (one per
        # step) or an accepted draft token, so accepted = generated - steps. This is the seed's own
        # definition: completion tokens divided by verification steps.
        steps = samples.total("sglang:spec_verify_calls_total")
        if steps is None:
            return None
        generated = samples.total(self.metrics.generation_tokens) or 0.0
        return SpecCounters(steps=steps, accepted=max(generated - steps, 0.0))
