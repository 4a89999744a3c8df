"""SGLang's adapter: launch, endpoints, key hand-off and what its metrics mean (0.5.17 and 0.5.21)."""

from __future__ import annotations

from typing import Any, ClassVar

from ornith_stack.engines import capabilities
from ornith_stack.engines.base import (
    ArgValue,
    EngineAdapter,
    EngineInfo,
    MetricNames,
    PanelQuery,
    PromQL,
    ReportedAcceptance,
    ServedProfile,
    ServeSettings,
    SpecCounters,
    TuneAxis,
    first,
    float_arg,
    int_arg,
    str_arg,
)
from ornith_stack.engines.sglang import accounting
from ornith_stack.engines.sglang import metrics as names
from ornith_stack.engines.sglang.flags import FLAGS
from ornith_stack.errors import UserError
from ornith_stack.sizing.model import Caps, Plan, PlanRequest
from ornith_stack.wire.metrics import Samples


class SglangAdapter(EngineAdapter):
    kind = "sglang"
    module = "sglang.launch_server"
    model_flag = "model-path"
    tp_flag = "tp-size"
    context_flag = "context-length"
    display_name = "SGLang"
    metric_prefix = names.PREFIX
    flags = FLAGS
    # /server_info answers the server args plus "version" and "internal_states" (0.5.17 and 0.5.21);
    # /get_server_info is its deprecated alias and logs a warning on every call.
    info_paths = ("/server_info",)
    spec_samples = names.SPEC_SAMPLES
    extra_samples = names.EXTRA_SAMPLES
    length_histograms = names.LENGTHS
    histograms = names.HISTOGRAMS
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
    # Its own sizing lines (tests/fixtures/engines/sglang-0.5.17/*/engine.log; rank 0's come first). The
    # scheduler's line is the final pool: "KV Cache is allocated" only when it never got that far.
    sizing_patterns: ClassVar[dict[str, tuple[str, ...]]] = {
        "weights_gib": (r"Load weight end\..*?mem usage=([\d.]+) GB",),  # SGLang's "GB" is bytes / 2**30
        "state_slots": (r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+)",),
        "kv_tokens": (r"max_total_num_tokens=(\d+)", r"KV Cache is allocated\. dtype: \S+, #tokens: (\d+)"),
        "running_requests": (r"max_total_num_tokens=\d+,.*?max_running_requests=(\d+)",),
    }
    metrics: ClassVar[MetricNames] = names.NAMES
    ttft_buckets: ClassVar[tuple[float, ...]] = names.TTFT_BUCKETS
    requests_finished: ClassVar[str] = names.REQUESTS_FINISHED
    requests_failed: ClassVar[str] = names.REQUESTS_FAILED

    # server_args.py 0.5.17. The speculative axis is DFlash's block: the drafted tokens plus the verified one.
    tune_axes = (
        # Running requests move the state slots, the verify buffers and the KV pool (`tune_caps`): no separate
        # --max-total-tokens or --max-mamba-cache-size axis. The decode-graph flag is spelled as both 0.5.17
        # and 0.5.21 parse it (0.5.21 has no --cuda-graph-max-bs). The depth axis writes whichever DFlash
        # flag the profile speculates with (`depth_flag`).
        TuneAxis("max-running-requests", "max-running-requests", (None, 8, 32, 128), cap=True, running=True),
        TuneAxis("spec-block", "speculative-dflash-block-size", (0, 4, 8, 16), speculative=True),
        TuneAxis("chunked-prefill-size", "chunked-prefill-size", (2048, 8192), cap=True),
        TuneAxis("cuda-graph-max-bs-decode", "cuda-graph-max-bs-decode", (None, 32, 128), cap=True),
        TuneAxis("mem-fraction-static", "mem-fraction-static", (0.8, 0.85, 0.9), pool=True),
    )
    # The flags that set DFlash's depth (they must agree when both are given).
    depth_flags = ("speculative-dflash-block-size", "speculative-num-draft-tokens")
    # Flags that only mean something with speculation on; removed with it.
    speculative_flags = ("speculative-algorithm", "speculative-dflash-block-size", "speculative-num-draft-tokens",
                         "speculative-num-steps", "speculative-eagle-topk")

    # SGLang 0.5.17 reads no environment variable for its key (server_args.py: `api_key` is a flag only),
    # but `--config FILE.yaml` merges the file's options into the parsed arguments inside the process
    # (server_args_config_parser.py), so the key stays out of argv. Its auth middleware leaves /health* and
    # /metrics* open (utils/auth.py), so probes and scrapes need no key.
    key_config = ("--config", "api-key")
    # Without `admin-api-key` the users' `api-key` unlocks the admin routes (@auth_level(ADMIN_OPTIONAL) in
    # http_server.py: /update_weights_from_disk, /init_weights_update_group, /configure_logging,
    # /release_memory_occupation, /pause_generation...; utils/auth.py decide_request_auth); with it, only it.
    admin_key_option = "admin-api-key"
    admin_routes = (("POST", "/update_weights_from_disk"), ("POST", "/init_weights_update_group"),
                    ("POST", "/send_weights_to_remote_instance"), ("POST", "/configure_logging"),
                    ("POST", "/release_memory_occupation"), ("POST", "/pause_generation"))
    operator_probe = ("POST", "/flush_cache")  # the radix cache: refilled by the next requests

    def profile_args(self, profile: ServedProfile) -> dict[str, ArgValue]:
        args: dict[str, ArgValue] = {}
        for flag, value in profile.serve.args.items():
            args[flag] = value
            # The seeds put the draft right after the algorithm; keep that order for readability.
            if flag == "speculative-algorithm" and profile.draft is not None and profile.draft.repo:
                args["speculative-draft-model-path"] = profile.draft.repo
                if profile.draft.revision != "main":
                    args["speculative-draft-model-revision"] = profile.draft.revision
        return args

    def models_named(self, flags: dict[str, str], positional: str | None) -> list[tuple[str | None, str | None]]:
        return [*super().models_named(flags, positional),
                (flags.get("--speculative-draft-model-path"), flags.get("--speculative-draft-model-revision"))]

    def depth_flag(self, args: dict[str, ArgValue], flag: str) -> str:
        return next((f for f in self.depth_flags if f in args), flag)

    def tune_caps(self, req: PlanRequest, running: int | None) -> dict[str, int | float | None]:
        return accounting.running_caps(req, running)

    def set_speculative_depth(self, args: dict[str, ArgValue], flag: str, depth: int | float | None) -> bool:
        if depth:
            for depth_flag in self.depth_flags:  # both given: both move (SGLang refuses them unequal)
                if depth_flag == flag or depth_flag in args:
                    args[depth_flag] = int(depth)
            return False
        for spec_flag in self.speculative_flags:
            args.pop(spec_flag, None)
        return True

    def listen_args(self, host: str, port: int) -> list[str]:
        return [*super().listen_args(host, port), "--enable-metrics"]

    def multinode_args(self, nodes: int | str, rank: str, leader: str, port: int | str) -> list[str]:
        # Every node runs the same launch_server; rank 0 serves HTTP, the others only schedule.
        return ["--nnodes", str(nodes), "--node-rank", rank, "--dist-init-addr", f"{leader}:{port}"]

    def settings(self, profile: ServedProfile) -> ServeSettings:
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

    def plan(self, req: PlanRequest) -> Plan:
        return accounting.plan(req)

    def card_caps(self, req: PlanRequest) -> Caps:
        return accounting.card_caps(req)

    def attention_backend_line(self, args: dict[str, ArgValue], compute_capability: str | None,
                               speculative: bool) -> str | None:
        return capabilities.attention_backend_line(args, compute_capability, speculative)

    def expected_log(self, plan: Plan) -> str | None:
        # The scheduler's "max_total_num_tokens=..., max_running_requests=..." line (after CUDA-graph capture).
        details = plan.engine_details
        if "running_requests_capped_by" not in details:
            return None
        return (f"SGLang will log max_total_num_tokens={details['max_total_num_tokens']}, "
                f"max_running_requests={details['max_running_requests']} (capped by "
                f"{details['running_requests_capped_by']}).")

    def simulated_acceptance_env(self, profile: ServedProfile, length: float) -> dict[str, str]:
        # srt/environ.py (0.5.17 and 0.5.21): SGLANG_SIMULATE_ACC_LEN, a float, off below 0; EAGLE's and
        # DFlash's verify steps then accept that many tokens (bonus included) whatever the draft proposed.
        block = int_arg(first(dict(profile.serve.args), "speculative-dflash-block-size",
                              "speculative-num-draft-tokens"))
        if not str_arg(profile.serve.args.get("speculative-algorithm")) or block is None:
            raise UserError(f"--acceptance: profile {profile.name!r} runs without speculative decoding "
                            "(no --speculative-algorithm with a block size): there is no acceptance to simulate")
        if not 1.0 <= length <= block:
            raise UserError(f"--acceptance {length:g}: an acceptance length is from 1 to the block size {block} of "
                            f"profile {profile.name!r} (tokens per verification step, bonus token included)")
        return {"SGLANG_SIMULATE_ACC_LEN": f"{length:g}"}

    def spec_counters(self, samples: Samples, info: EngineInfo | None = None) -> SpecCounters | None:
        # SGLang counts verification steps; every generated token is either a bonus token (one per
        # step) or an accepted draft token, so accepted = generated - steps. This is the seed's own
        # definition: completion tokens divided by verification steps. Both counters move when a
        # request finishes. SGLang has no drafted-token counter: each step verifies a block of
        # num_draft_tokens, the first of which is the bonus position, so drafted = steps x (block - 1).
        steps = self.read(samples, names.VERIFY_CALLS)
        if steps is None:
            return None
        generated = self.read(samples, self.metrics.generation_tokens) or 0.0
        block = info.num_draft_tokens if info is not None and info.num_draft_tokens else None
        if block is None:
            gauge = samples.max(names.NUM_DRAFT_TOKENS)
            block = int(gauge) if gauge is not None and gauge > 1 else None
        drafted = steps * (block - 1) if block else None
        return SpecCounters(steps=steps, accepted=max(generated - steps, 0.0), drafted=drafted)

    def panel_queries(self, q: PromQL) -> dict[str, tuple[PanelQuery, ...]]:
        return names.panel_queries(q)

    def read(self, samples: Samples, name: str, **match: str) -> float | None:
        # Scheduler metrics carry tp_rank; by default only rank 0 reports, but with
        # --enable-metrics-for-all-schedulers every rank of a tensor-parallel group reports the same
        # batch, and summing them would count it tp times. Data-parallel ranks still add up.
        rank0 = samples.total(name, tp_rank="0", **match)
        return rank0 if rank0 is not None else samples.total(name, **match)

    def decode_tokens(self, samples: Samples) -> float | None:
        return self.read(samples, names.REALTIME_TOKENS, mode="decode")

    def aborted_requests(self, samples: Samples) -> float | None:
        # Abort calls, not the requests they end (one abort_all ended four streams: canary-abort recording):
        # a lower bound, absent until the first call.
        return self.read(samples, names.ABORT_CALLS)

    def mamba_usage(self, samples: Samples) -> float | None:
        return samples.max(names.MAMBA_USAGE)

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
        lengths = [s.value for s in samples.get(names.ACCEPT_LENGTH, []) if s.value >= 1.0]
        if not lengths:
            return None
        ratio = samples.mean(names.ACCEPT_RATE)
        return ReportedAcceptance(length=sum(lengths) / len(lengths),
                                  ratio=ratio if ratio is not None and 0.0 <= ratio <= 1.0 else None)

