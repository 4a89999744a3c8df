"""SGLang: flags, endpoints and metric names (0.5.17 and 0.5.21)."""

from __future__ import annotations

from typing import Any, ClassVar

from ornith_stack.engines.base import (
    EngineAdapter,
    EngineInfo,
    MetricNames,
    ReportedAcceptance,
    ServeSettings,
    SpecCounters,
    first,
    float_arg,
    int_arg,
    str_arg,
)
from ornith_stack.engines.exposition import Samples
from ornith_stack.profiles.model import ArgValue, Profile


class SglangAdapter(EngineAdapter):
    kind = "sglang"
    module = "sglang.launch_server"
    model_flag = "model-path"
    metric_prefix = "sglang:"
    # /get_server_info (0.5.17) was renamed /server_info later; both answer the server args plus
    # "version" and "internal_states".
    info_paths = ("/get_server_info", "/server_info")
    spec_samples = ("sglang:spec_verify_calls_total", "sglang:spec_accept_length", "sglang:spec_accept_rate")
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

    def multinode_args(self, nodes: int | str, rank: str, leader: str, port: int | str) -> list[str]:
        # Every node runs the same launch_server; rank 0 serves HTTP, the others only schedule.
        return ["--nnodes", str(nodes), "--node-rank", rank, "--dist-init-addr", f"{leader}:{port}"]

    def settings(self, profile: Profile) -> ServeSettings:
        args = profile.serve.args
        method = first(args, "speculative-algorithm")
        block = int_arg(first(args, "speculative-dflash-block-size", "speculative-num-draft-tokens"))
        return ServeSettings(
            tp=int(first(args, "tp-size", "tp", "tensor-parallel-size", default=1)),
            max_model_len=int_arg(first(args, "context-length")),
            mem_fraction_static=float_arg(first(args, "mem-fraction-static")),
            kv_cache_dtype=str(first(args, "kv-cache-dtype", default="auto")),
            enable_prefix_caching=False if args.get("disable-radix-cache", False) else None,
            max_total_tokens=int_arg(first(args, "max-total-tokens")),
            max_running_requests=int_arg(first(args, "max-running-requests")),
            speculative_method=str(method).lower() if method else None,
            # A DFlash block of 16 verifies 15 drafted tokens plus the bonus token.
            num_speculative_tokens=block - 1 if block else 0,
            draft_block_size=block,
            extra={k: v for k, v in args.items() if k.startswith("mamba-")},
            dtype=str_arg(first(args, "dtype")),
            block_size=int_arg(first(args, "page-size")),
            mamba_ssm_cache_dtype=str_arg(first(args, "mamba-ssm-dtype")),
            mamba_full_memory_ratio=float_arg(first(args, "mamba-full-memory-ratio")),
            max_mamba_cache_size=int_arg(first(args, "max-mamba-cache-size")),
            # 0.5.17 spells it --mamba-scheduler-strategy, 0.5.21 --mamba-radix-cache-strategy.
            mamba_radix_cache_strategy=str_arg(first(args, "mamba-radix-cache-strategy", "mamba-scheduler-strategy")),
            overlap_schedule=not args.get("disable-overlap-schedule", False),
        )

    def spec_counters(self, samples: Samples) -> SpecCounters | None:
        # SGLang counts verification steps; every generated token is either a bonus token (one per
        # step) or an accepted draft token, so accepted = generated - steps. This is the seed's own
        # definition: completion tokens divided by verification steps.
        steps = self.read(samples, "sglang:spec_verify_calls_total")
        if steps is None:
            return None
        generated = self.read(samples, self.metrics.generation_tokens) or 0.0
        return SpecCounters(steps=steps, accepted=max(generated - steps, 0.0))

    def read(self, samples: Samples, name: str) -> float | None:
        # Scheduler metrics carry tp_rank; by default only rank 0 reports, but with
        # --enable-metrics-for-all-schedulers every rank of a tensor-parallel group reports the same
        # batch, and summing them would count it tp times. Data-parallel ranks still add up.
        rank0 = samples.total(name, tp_rank="0")
        return rank0 if rank0 is not None else samples.total(name)

    def parse_info(self, payload: Any) -> EngineInfo:
        if not isinstance(payload, dict):
            return EngineInfo()

        def text(key: str) -> str | None:
            value = payload.get(key)
            return str(value) if value not in (None, "") else None

        return EngineInfo(version=text("version"), model=text("served_model_name") or text("model_path"),
                          draft=text("speculative_draft_model_path"))

    def reported_acceptance(self, samples: Samples) -> ReportedAcceptance | None:
        # Gauges averaged by SGLang over its log interval; per tp rank they are equal, so take the mean.
        length = samples.mean("sglang:spec_accept_length")
        ratio = samples.mean("sglang:spec_accept_rate")
        if length is None and ratio is None:
            return None
        return ReportedAcceptance(length=length, ratio=ratio)
