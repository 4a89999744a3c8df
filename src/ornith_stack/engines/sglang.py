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
from ornith_stack.profiles.model import ArgValue, Profile
from ornith_stack.wire.metrics import Samples


class SglangAdapter(EngineAdapter):
    kind = "sglang"
    module = "sglang.launch_server"
    model_flag = "model-path"
    tp_flag = "tp-size"
    metric_prefix = "sglang:"
    # /server_info answers the server args plus "version" and "internal_states" (0.5.17 and 0.5.21);
    # /get_server_info is its deprecated alias and logs a warning on every call.
    info_paths = ("/server_info",)
    spec_samples = ("sglang:spec_verify_calls_total", "sglang:spec_accept_length", "sglang:spec_accept_rate",
                    "sglang:spec_num_draft_tokens")
    # realtime_tokens_total{mode="decode"} grows every decode iteration (batch size plus accepted drafts);
    # generation_tokens_total only when a request finishes.
    extra_samples = ("sglang:realtime_tokens_total", "sglang:mamba_usage")
    # SGLang exports /metrics only when asked to.
    serving_flags = ("host", "port", "enable-metrics")
    # 0.5.17's chat route returns each choice's meta_info (prompt and completion tokens, spec_verify_ct)
    # when asked, on non-streaming requests only (a streaming one with it is refused).
    per_request_steps_fields: ClassVar[dict[str, bool]] = {"return_meta_info": True}
    # Lines of SGLang 0.5.17's log (tests/fixtures/engines/sglang-0.5.17/tp1/engine.log).
    start_phases: ClassVar[tuple[tuple[str, str], ...]] = (
        ("weights loaded", r"Load weight end"),
        ("KV pool sized", r"KV Cache is allocated"),
        ("CUDA graphs captured", r"CUDA graph end"),
        ("API up", r"The server is fired up"),
    )
    metrics: ClassVar[MetricNames] = MetricNames(
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
    # SGLang 0.5.17 (tests/fixtures/engines/sglang-0.5.17/tp1/metrics-after.txt).
    ttft_buckets: ClassVar[tuple[float, ...]] = (
        0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
    # SGLang counts every finished request, and aborted ones (errors, timeouts, cancelled) apart.
    requests_finished: ClassVar[str] = "sglang:num_requests_total"
    requests_failed: ClassVar[str] = "sglang:num_aborted_requests_total"

    # SGLang 0.5.17 reads no environment variable for its key (server_args.py: `api_key` is a flag only),
    # but `--config FILE.yaml` merges the file's options into the parsed arguments inside the process
    # (server_args_config_parser.py), so the key stays out of argv. Its auth middleware leaves /health* and
    # /metrics* open (utils/auth.py), so probes and scrapes need no key.
    key_config = ("--config", "api-key")

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
            # Every flag as given: the planner checks them against the release's removed and deprecated ones.
            extra=dict(args),
            dtype=str_arg(first(args, "dtype")),
            block_size=int_arg(first(args, "page-size")),
            mamba_ssm_cache_dtype=str_arg(first(args, "mamba-ssm-dtype")),
            mamba_full_memory_ratio=float_arg(first(args, "mamba-full-memory-ratio")),
            max_mamba_cache_size=int_arg(first(args, "max-mamba-cache-size")),
            # 0.5.17 spells it --mamba-scheduler-strategy, 0.5.21 --mamba-radix-cache-strategy.
            mamba_radix_cache_strategy=str_arg(first(args, "mamba-radix-cache-strategy", "mamba-scheduler-strategy")),
            overlap_schedule=not args.get("disable-overlap-schedule", False),
            language_model_only=bool(args.get("language-model-only", False)),
            attention_backend=str_arg(first(args, "attention-backend")),
        )

    def spec_counters(self, samples: Samples, info: EngineInfo | None = None) -> SpecCounters | None:
        # SGLang counts verification steps; every generated token is either a bonus token (one per
        # step) or an accepted draft token, so accepted = generated - steps. This is the seed's own
        # definition: completion tokens divided by verification steps. Both counters move when a
        # request finishes. SGLang has no drafted-token counter: each step verifies a block of
        # num_draft_tokens, the first of which is the bonus position, so drafted = steps x (block - 1).
        steps = self.read(samples, "sglang:spec_verify_calls_total")
        if steps is None:
            return None
        generated = self.read(samples, self.metrics.generation_tokens) or 0.0
        block = info.num_draft_tokens if info is not None and info.num_draft_tokens else None
        if block is None:
            gauge = samples.max("sglang:spec_num_draft_tokens")
            block = int(gauge) if gauge is not None and gauge > 1 else None
        drafted = steps * (block - 1) if block else None
        return SpecCounters(steps=steps, accepted=max(generated - steps, 0.0), drafted=drafted)

    def read(self, samples: Samples, name: str, **match: str) -> float | None:
        # Scheduler metrics carry tp_rank; by default only rank 0 reports, but with
        # --enable-metrics-for-all-schedulers every rank of a tensor-parallel group reports the same
        # batch, and summing them would count it tp times. Data-parallel ranks still add up.
        rank0 = samples.total(name, tp_rank="0", **match)
        return rank0 if rank0 is not None else samples.total(name, **match)

    def decode_tokens(self, samples: Samples) -> float | None:
        return self.read(samples, "sglang:realtime_tokens_total", mode="decode")

    def mamba_usage(self, samples: Samples) -> float | None:
        return samples.max("sglang:mamba_usage")

    def parse_info(self, payload: Any) -> EngineInfo:
        if not isinstance(payload, dict):
            return EngineInfo()

        def text(key: str) -> str | None:
            value = payload.get(key)
            return str(value) if value not in (None, "") else None

        block = payload.get("speculative_num_draft_tokens") or payload.get("speculative_dflash_block_size")
        return EngineInfo(version=text("version"), model=text("served_model_name") or text("model_path"),
                          draft=text("speculative_draft_model_path"),
                          num_draft_tokens=block if isinstance(block, int) and block > 1 else None)

    def reported_acceptance(self, samples: Samples) -> ReportedAcceptance | None:
        # Gauges averaged by SGLang over its last log interval; per tp rank they are equal, so take the
        # mean. Both read 0.0 until the first decode log: an acceptance length is at least 1 (the bonus
        # token), so a length below 1 means "no interval yet", and the rate of that interval is unknown.
        lengths = [s.value for s in samples.get("sglang:spec_accept_length", []) if s.value >= 1.0]
        if not lengths:
            return None
        ratio = samples.mean("sglang:spec_accept_rate")
        return ReportedAcceptance(length=sum(lengths) / len(lengths),
                                  ratio=ratio if ratio is not None and 0.0 <= ratio <= 1.0 else None)
