"""SGLang memory accounting for hybrid (gated-delta + full attention) models with a DFlash draft.

Each step is one pure function named after the quantity SGLang logs or resolves, read in the 0.5.17
and 0.5.21 wheels (tests/unit/test_engine_defaults.py runs both releases' own functions beside these);
what differs between them is one `Release` record, chosen by the profile's engine version:
- `resolve_mem_fraction_static`: server_args.py `_handle_gpu_memory_settings` (reserve by GPU size,
  chunked prefill and CUDA graphs) and `adjust_mem_fraction_for_vlm`, when the flag is absent;
- `resolve_page_size`: overrides.py `_mla_backend_page_constraints`, `_fa4_page_constraint` and
  `_page_size_default` (trtllm_mha and hpc_ops force 64, fa4 128, otherwise 1 on CUDA);
- `resolve_mamba_strategy`: arg_groups/overrides.py `_mamba_radix_cache_resolution` ("auto" becomes
  "extra_buffer" for Qwen3.5 with the overlap scheduler and the triton linear-attention backend);
- `static_pool_rest`: kv_cache_configurator.py `_profile_available_bytes` (memory after weights, target
  and draft, minus total x (1 - mem_fraction_static); 0.5.21 also minus `mm_runtime_reservation_gb`);
- `load_extras`: what SGLang holds on the GPU at that point besides the checkpoint's tensors (RoPE caches,
  deepstack mergers a config without `deepstack_visual_indexes` gets, DFlash's fused KV weights, and the
  allocator's share measured at real size);
- `mamba_pool`: `_handle_max_mamba_cache` (state slots K and the DFlash verify buffers solved jointly
  inside the static pool, each with the pool's +1 padding slot);
- `kv_cell_bytes` and `max_total_num_tokens`: pool_configurator.py `DefaultPoolConfigurator` (full
  attention layers plus the DFlash draft's: 0.5.17 scales the target cell by layer counts, 0.5.21 adds
  the draft's own KV bytes; page-aligned; capped by --max-total-tokens);
- `running_requests`: `resolve_max_num_reqs` (requested or estimated, tokens / 2, slots / mamba ratio).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from packaging.version import InvalidVersion, Version

from ornith_stack.engines.capabilities import attention_backend_line, parse_sm, unrunnable
from ornith_stack.errors import UserError
from ornith_stack.sizing.common import attention_bytes_per_token, mamba_state_bytes, tp_divisibility
from ornith_stack.sizing.engine_memory import SGLANG_LOAD_UNTRACKED_GIB
from ornith_stack.sizing.model import GIB, Caps, Plan, PlanRequest, Problem, cdiv, gib
from ornith_stack.sizing.shapes import ModelShape, VisionShape

MIB = 1 << 20
# server_args.py ServerArgs field defaults.
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
DEFAULT_PAGE_SIZE = 1  # overrides.py `_page_size_default`: page_size None resolves to 1 on CUDA
DEFAULT_LINEAR_ATTN_BACKEND = "triton"
# overrides.py (0.5.17 and 0.5.21) per attention backend of a non-MLA model: (page sizes it accepts, the
# one it changes any other to). `_mla_backend_page_constraints` snaps trtllm_mha and hpc_ops,
# `_fa4_page_constraint` forces fa4 to 128 (Blackwell). Every other backend keeps the default of 1.
BACKEND_PAGE_SIZES: dict[str, tuple[tuple[int, ...], int]] = {
    "trtllm_mha": ((16, 32, 64, 128), 64),
    "hpc_ops": ((64,), 64),
    "fa4": ((128,), 128),
}
# arg_groups/speculative_hook.py `_handle_dflash` (and the ngram and EAGLE handlers): max_running_requests
# when unset; DFlash's block size when neither the flags nor the draft config give one.
DFLASH_DEFAULT_MAX_RUNNING_REQUESTS = 48
DFLASH_DEFAULT_BLOCK_SIZE = 16
# mem_cache/kv_cache_configurator.py: state slots per running request.
MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3
MAMBA_EXTRA_BUFFER_SLOTS = {True: 2, False: 1}  # ping-pong buffers with / without the overlap scheduler
# arg_groups/overrides.py `_MAMBA_EXTRA_BUFFER_ARCHS` (the Qwen3.5 family among them).
MAMBA_EXTRA_BUFFER_ARCHS = frozenset({
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen3NextForCausalLM",
    "KimiLinearForCausalLM", "BailingMoeV2_5ForCausalLM", "FalconH1ForCausalLM",
    "GraniteMoeHybridForCausalLM", "NemotronHForCausalLM",
})




@dataclass(frozen=True)
class Release:
    """What the planner's arithmetic takes from one SGLang release, read in its wheel."""

    version: tuple[int, ...]
    # server_args.py / memory_hook.py `handle_gpu_memory_settings`, GPUs of 20-35 GiB: chunked prefill
    # and decode CUDA-graph max batch at tp < 4 and tp >= 4.
    mid_gpu: tuple[int, int, int]
    # pool_configurator.py: the DFlash draft's KV bytes per token from its own geometry (0.5.21,
    # `dflash_draft_cell_size_per_token`) rather than the target cell scaled by layer counts (0.5.17).
    exact_draft_cell: bool
    # kv_cache_configurator.py `mm_runtime_reservation_gb` (0.5.21): environ.py SGLANG_VLM_CACHE_SIZE_MB
    # (100) for a multimodal model, plus SGLANG_MM_FEATURE_CACHE_MB (1024) with a GPU feature transport.
    mm_reservation_mib: int
    mm_feature_cache_mib: int
    # --language-model-only: a flag of 0.5.21 that makes the model not multimodal.
    has_language_model_only: bool
    # Flags the release refuses, and flags it accepts but deprecates: flag -> what it does instead.
    removed_flags: dict[str, str]
    deprecated_flags: dict[str, str]
    # The model quantizations (None: unquantized) for which `_qwen3_moe_family_overrides` picks the
    # flashinfer_trtllm MoE runner on sm10x (0.5.17 arg_groups/overrides.py; 0.5.21
    # arg_groups/model_overrides/qwen3_moe.py adds modelopt_mixed).
    trtllm_moe_quantizations: frozenset[str | None] = frozenset({None, "fp8", "modelopt_fp4"})

    @property
    def name(self) -> str:
        return ".".join(map(str, self.version))


RELEASES = (
    Release((0, 5, 17), mid_gpu=(2048, 24, 80), exact_draft_cell=False, mm_reservation_mib=0,
            mm_feature_cache_mib=0, has_language_model_only=False, removed_flags={},
            deprecated_flags={"mamba-scheduler-strategy": "an alias of --mamba-radix-cache-strategy"}),
    Release((0, 5, 21), mid_gpu=(4096, 48, 160), exact_draft_cell=True, mm_reservation_mib=100,
            mm_feature_cache_mib=1024, has_language_model_only=True,
            removed_flags={"mamba-scheduler-strategy": "use --mamba-radix-cache-strategy",
                           "cuda-graph-max-bs": "use --cuda-graph-max-bs-decode / --cuda-graph-max-bs-prefill "
                           "(argparse calls the old spelling ambiguous)"},
            deprecated_flags={"enable-flashinfer-allreduce-fusion": "SGLang warns and maps it to "
                              "--flashinfer-allreduce-fusion-backend auto"},
            trtllm_moe_quantizations=frozenset({None, "fp8", "modelopt_fp4", "modelopt_mixed"})),
)  # fmt: skip
# GPU feature transports (arg_groups/fields/mm.py: unset means cpu on one node).
GPU_MM_TRANSPORTS = ("cuda_ipc", "cuda_vmm")


def release_for(version: str | None) -> Release:
    """The newest release read that is not newer than `version` (the oldest for None or older ones)."""
    wanted = _version_tuple(version)
    older = [r for r in RELEASES if wanted is not None and r.version <= wanted]
    return older[-1] if older else RELEASES[0]


def _version_tuple(version: str | None) -> tuple[int, ...] | None:
    """The release numbers of an engine version (0.5.21rc1 and 0.5.21.post1 are 0.5.21); None when unreadable."""
    try:
        return Version(version).release if version else None
    except InvalidVersion:
        return None


# -- defaults SGLang resolves when a flag is absent --------------------------------------------------


def resolve_mem_fraction_static(req: PlanRequest) -> float:
    """--mem-fraction-static as given, else SGLang's heuristic for this GPU, tp and model."""
    s = req.settings
    if s.mem_fraction_static is not None:
        return s.mem_fraction_static
    rel = release_for(req.engine_version)
    return default_mem_fraction_static(req.gpu_memory_gib, s.tp, multimodal_vision(req, rel), rel)


def multimodal_vision(req: PlanRequest, rel: Release) -> VisionShape | None:
    """The vision tower when SGLang treats the model as multimodal (0.5.21's --language-model-only: not)."""
    if rel.has_language_model_only and req.settings.language_model_only:
        return None
    return req.shape.vision


def default_mem_fraction_static(gpu_memory_gib: float, tp: int, vision: VisionShape | None,
                                release: Release = RELEASES[0]) -> float:
    """`_handle_gpu_memory_settings`: (GPU memory - reserved) / GPU memory to three decimals; then a
    multimodal model gives up a share for its vision encoder."""
    gpu_mem = gpu_memory_gib * 1024  # MiB, as SGLang measures it
    fraction = round((gpu_mem - reserved_mib(gpu_memory_gib, tp, release)) / gpu_mem, 3)
    return fraction * vlm_fraction_factor(vision) if vision is not None else fraction


def reserved_mib(gpu_memory_gib: float, tp: int, release: Release = RELEASES[0]) -> float:
    """SGLang's estimate of the memory outside the static pool (CUDA without PD disaggregation or DP
    attention): 512 MiB + 1.5 MiB per activation token (the chunked prefill size, at least 2048) +
    tp/8 GiB + CUDA graphs (2 MiB per decode batch size, 8 MiB per prefill capture size), at least
    10 GiB above 60 GiB. The planner uses it as the CUDA-graph and activation reserve."""
    gpu_mem = gpu_memory_gib * 1024
    chunked_prefill, decode_max_bs = chunked_prefill_and_decode_bs(gpu_mem, tp, release)
    reserved = 512 + max(chunked_prefill, 2048) * 1.5 + tp / 8 * 1024
    reserved += decode_max_bs * 2 + len(prefill_capture_sizes(chunked_prefill)) * 8
    return max(reserved, 10 * 1024) if gpu_mem > 60 * 1024 else reserved


def reserve_bytes(req: PlanRequest) -> int:
    """--reserve-gib, else SGLang's own reserve for this GPU and tp."""
    if req.reserve_gib is not None:
        return req.reserve_bytes
    return int(reserved_mib(req.gpu_memory_gib, req.settings.tp, release_for(req.engine_version)) * MIB)


def chunked_prefill_and_decode_bs(gpu_mem_mib: float, tp: int, release: Release = RELEASES[0]) -> tuple[int, int]:
    """(chunked_prefill_size, decode CUDA-graph max batch) by GPU memory, as `_handle_gpu_memory_settings`."""
    if gpu_mem_mib < 20 * 1024:
        return 2048, 8
    if gpu_mem_mib < 35 * 1024:
        chunked, small_tp, large_tp = release.mid_gpu
        return chunked, small_tp if tp < 4 else large_tp
    if gpu_mem_mib < 60 * 1024:
        return 4096, 32 if tp < 4 else 160
    if gpu_mem_mib < 160 * 1024:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def prefill_capture_sizes(max_bs: int) -> list[int]:
    """`_generate_prefill_cuda_graph_batch_sizes`: prefill CUDA-graph token counts up to max_bs."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_bs + 1, 512)]
    return [n for n in sizes if n <= max_bs]


def vlm_fraction_factor(vision: VisionShape) -> float:
    """`adjust_mem_fraction_for_vlm`: 0.95 x (1 - 0.1 x (complexity - 1)) clamped to [0.8, 1.05], the
    complexity being layers x hidden^2 against ViT-L/14. SGLang reads `num_hidden_layers`, which a
    Qwen3.5 vision config does not have (it says `depth`), so it takes its default of 24 layers."""
    ratio = 24 * vision.hidden_size**2 / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def resolve_page_size(req: PlanRequest) -> int:
    """Tokens per KV page: --page-size, snapped to what the attention backend accepts; unset, the
    backend's forced size (trtllm_mha 64, fa4 128) or 1. With no --attention-backend SGLang picks one
    itself (on Blackwell Qwen3.5 may get trtllm_mha and 64): the planner then assumes 1."""
    page = req.settings.block_size
    accepted, forced = BACKEND_PAGE_SIZES.get(req.settings.attention_backend or "", ((), 0))
    if forced and page not in accepted:
        return forced
    return page or DEFAULT_PAGE_SIZE


def resolve_mamba_strategy(req: PlanRequest) -> tuple[str, bool]:
    """(mamba radix cache strategy, overlap scheduler on) as `_mamba_radix_cache_resolution` leaves them.
    "auto" becomes "extra_buffer" when the overlap scheduler is on (or pages are longer than one token)
    and the architecture supports it on the triton linear-attention backend; otherwise "no_buffer",
    which also turns the overlap scheduler off."""
    s = req.settings
    strategy = s.mamba_radix_cache_strategy or "auto"
    if strategy != "auto" or not radix_cache(req):
        return strategy, s.overlap_schedule
    wants = s.overlap_schedule or resolve_page_size(req) > 1
    if wants and req.shape.architecture in MAMBA_EXTRA_BUFFER_ARCHS and DEFAULT_LINEAR_ATTN_BACKEND == "triton":
        return "extra_buffer", s.overlap_schedule
    return "no_buffer", False


def radix_cache(req: PlanRequest) -> bool:
    """The radix (prefix) cache: on unless --disable-radix-cache."""
    return req.settings.enable_prefix_caching is not False


def requested_running_requests(req: PlanRequest) -> int | None:
    s = req.settings
    if s.max_running_requests is None and s.speculative_method:
        return DFLASH_DEFAULT_MAX_RUNNING_REQUESTS
    return s.max_running_requests


def draft_tokens(req: PlanRequest) -> int:
    """speculative_num_draft_tokens: DFlash's block size (flag, else the draft config's, else 16)."""
    s = req.settings
    if not s.speculative_method:
        return 0
    if s.draft_block_size:
        return s.draft_block_size
    if s.speculative_method == "dflash":
        return (req.draft.block_size if req.draft and req.draft.block_size else None) or DFLASH_DEFAULT_BLOCK_SIZE
    return s.num_speculative_tokens + 1


def mamba_ratio(strategy: str, radix: bool, overlap: bool) -> int:
    """`_calculate_mamba_ratio`: state slots held per running request."""
    if not radix:
        return 1
    extra = MAMBA_EXTRA_BUFFER_SLOTS[overlap] if strategy in ("extra_buffer", "extra_buffer_lazy") else 0
    if strategy == "extra_buffer_lazy" and overlap:
        extra = 1
    return MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO + extra


# -- what loading leaves on the GPU besides the checkpoint ----------------------------------------------

# layers/rotary_embedding/base.py: on CUDA a RoPE cos/sin cache stays float32, one row per position of
# rotary_dim values (cos and sin halves); get_rope shares one per distinct geometry.
ROPE_CACHE_DTYPE_BYTES = 4
# utils/common.py `reserve_rope_cache_for_long_sequences`, run at the end of each `load_model` (target and
# draft): every RoPE cache grows to the context + speculative steps x draft tokens x 2 + 256 positions,
# aligned to 128 (environ.py SGLANG_SPEC_EXPANSION_SAFETY_FACTOR, SGLANG_ROPE_CACHE_SAFETY_MARGIN,
# SGLANG_ROPE_CACHE_ALIGN); `_ensure_cos_sin_cache_length` rounds the new length up to the next 128 again.
ROPE_SPEC_FACTOR = 2
ROPE_MARGIN = 256
ROPE_ALIGN = 128
# models/qwen3_vl.py Qwen3VLMoeVisionModel: the vision tower's RoPE is built for 8192 positions, on half
# of each head.
VISION_ROPE_POSITIONS = 8192
# configs/qwen3_vl.py Qwen3VLVisionConfig: deepstack_visual_indexes when a vision config has no such key
# (SGLang reloads a Qwen3.5 config with its own classes, so this default applies to them too).
DEFAULT_DEEPSTACK_VISUAL_INDEXES = (8, 16, 24)
# models/dflash.py: the drafts whose `supports_fused_context_kv` is true; dflash_worker_v2.py then stacks
# every layer's K and V projection into one weight (FusedKVMaterializeHelper.flat_kv_weight_t).
FUSED_KV_DRAFT_ARCHS = frozenset({"DFlashDraftModel"})
# PyTorch's caching allocator: an allocation of 10 MiB or more gets a segment of its own rounded up to 2 MiB.
ALLOCATOR_LARGE = 10 * MIB
ALLOCATOR_ROUND = 2 * MIB


def segment_bytes(n: int) -> int:
    """What cudaMemGetInfo sees of a tensor of `n` bytes that gets a segment of its own."""
    return cdiv(n, ALLOCATOR_ROUND) * ALLOCATOR_ROUND if n >= ALLOCATOR_LARGE else n


def rope_reserve(req: PlanRequest) -> int:
    """The positions `reserve_rope_cache_for_long_sequences` grows every RoPE cache to (before its own
    rounding): the context, plus 2 x draft tokens for the one speculative step, plus 256, aligned to 128."""
    steps = 1 if req.settings.speculative_method else 0
    return cdiv(req.max_model_len + steps * draft_tokens(req) * ROPE_SPEC_FACTOR + ROPE_MARGIN, ROPE_ALIGN) * ROPE_ALIGN


def rope_rows(positions: int, reserve: int) -> int:
    """Rows of a cache built for `positions` once `_ensure_cos_sin_cache_length(reserve - 1)` ran."""
    needed = reserve - 1
    return positions if needed < positions else (needed + ROPE_ALIGN) // ROPE_ALIGN * ROPE_ALIGN


def rope_cache_bytes(positions: int, rotary_dim: int, reserve: int) -> int:
    return rope_rows(positions, reserve) * rotary_dim * ROPE_CACHE_DTYPE_BYTES


def deepstack_mergers(vision: VisionShape) -> int:
    """Deepstack mergers SGLang builds: the config's list, or its default three when the key is absent."""
    listed = vision.deepstack_visual_indexes
    return len(DEFAULT_DEEPSTACK_VISUAL_INDEXES if listed is None else listed)


# -- the MoE runner and what it pads ----------------------------------------------------------------

# arg_groups/overrides.py `_qwen3_moe_family_overrides` (0.5.17; 0.5.21: arg_groups/model_overrides/qwen3_moe.py):
# the architectures for which SGLang sets moe_runner_backend "flashinfer_trtllm" when the GPU is sm10x
# (`is_sm100_supported`: compute capability major 10, i.e. B200/GB200 sm100 and B300/GB300 sm103), the
# quantization is unquantized, fp8 or modelopt_fp4 (Release.trtllm_moe_quantizations), --moe-a2a-backend is
# "none" and --moe-runner-backend "auto" (both the defaults). SM12x (RTX PRO 6000, GB10) is not sm100.
TRTLLM_MOE_ARCHS = frozenset({
    "Qwen3MoeForCausalLM", "Qwen3VLMoeForConditionalGeneration", "Qwen3NextForCausalLM",
    "Qwen3_5MoeForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration",
})
TRTLLM_MOE_RUNNERS = ("flashinfer_trtllm", "flashinfer_trtllm_routed")
# layers/moe/fused_moe_triton/layer.py `FusedMoE.__init__` (0.5.17 and 0.5.21): "flashinfer_trtllm kernel
# requires intermediate_size to be a multiple of 128": with either trtllm runner the per-GPU expert
# intermediate size (moe_intermediate_size / moe_tp_size) is rounded up to it, and
# quantization/unquant.py `UnquantizedFusedMoEMethod.create_weights` allocates w13 (2 x that) and w2
# (that) per local expert at the padded size; the checkpoint fills the leading slice (`use_padded_loading`).
TRTLLM_MOE_ALIGN = 128


def _flag(req: PlanRequest, *names: str) -> str | None:
    for name in names:
        value = req.settings.extra.get(name)
        if value is not None and value is not False:
            return str(value)
    return None


def moe_runner(req: PlanRequest, rel: Release = RELEASES[0]) -> str | None:
    """The MoE runner SGLang resolves for the target when it matters to memory: the trtllm runners (named
    by --moe-runner-backend, or picked on sm10x as `_qwen3_moe_family_overrides` does), else the flag's
    value or None (auto on another GPU, or an unknown GPU: triton)."""
    if not req.shape.num_experts:
        return None
    named = _flag(req, "moe-runner-backend")
    if named and named != "auto":
        return named
    sm = parse_sm(req.compute_capability)
    quantization = _flag(req, "quantization") or req.shape.quantization
    if (sm is not None and sm[0] == 10 and req.shape.architecture in TRTLLM_MOE_ARCHS
            and quantization in rel.trtllm_moe_quantizations and (_flag(req, "moe-a2a-backend") or "none") == "none"):
        return "flashinfer_trtllm"
    return None


def expert_parallel(req: PlanRequest) -> int:
    """--ep-size (aliases --ep, --expert-parallel-size); 1 by default."""
    value = _flag(req, "ep-size", "ep", "expert-parallel-size")
    return max(int(value), 1) if value and value.isdigit() else 1


def moe_padding_bytes(req: PlanRequest, rel: Release = RELEASES[0]) -> int:
    """Bytes per GPU the trtllm MoE runner adds to the experts: every MoE layer's local experts x (gate,
    up, down) x hidden x (intermediate per GPU rounded up to 128 - intermediate per GPU). The 35B (512)
    at tp 8 (moe_tp_size = tp / ep = 8): 64 -> 128, the experts' memory doubled (+7.50 GiB per GPU in BF16);
    at tp 1, 2, 4 (512, 256, 128) and the 122B (1024) up to tp 8 nothing is padded."""
    shape = req.shape
    if moe_runner(req, rel) not in TRTLLM_MOE_RUNNERS:
        return 0
    ep = expert_parallel(req)
    per_gpu = shape.moe_intermediate_size // max(req.settings.tp // ep, 1)
    pad = cdiv(per_gpu, TRTLLM_MOE_ALIGN) * TRTLLM_MOE_ALIGN - per_gpu
    return int(shape.num_layers * (shape.num_experts // ep) * 3 * shape.hidden_size * pad
               * req.weight_bytes_per_param())


@dataclass(frozen=True)
class LoadExtras:
    """Bytes per GPU SGLang holds when it sizes its pools besides the checkpoint's tensors."""

    rope: int  # the RoPE caches (text, vision tower, draft), grown to the context
    deepstack: int  # deepstack mergers of a vision config without deepstack_visual_indexes
    fused_kv: int  # DFlash's stacked KV weights, or the draft's pre-growth RoPE segment they are carved from
    untracked: int  # the allocator's partly filled segments and CUDA's own (measured, engine_memory.py)
    moe_padding: int = 0  # the trtllm MoE runner's padded expert weights (`moe_padding_bytes`)

    @property
    def total(self) -> int:
        return self.rope + self.deepstack + self.fused_kv + self.untracked + self.moe_padding


def load_extras(req: PlanRequest, rel: Release = RELEASES[0]) -> LoadExtras:
    """What `_profile_available_bytes` finds taken beyond the weights (the recorded 35B at real shapes:
    tests/fixtures/engines/sglang-0.5.17/realsize-h200, README there):
    - every RoPE cache, float32 and grown to the context after loading (target text, vision tower, draft);
    - for a vision config without `deepstack_visual_indexes`, SGLang's default three deepstack mergers
      (published Qwen3.5 configs list none: only a config without the key, as the recording's, gets them);
    - DFlash's fused KV materialization: the draft's K and V projections stacked into one weight; the
      allocator carves it from the segment the draft's RoPE cache left when it grew, which stays reserved;
    - the allocator's partly filled segments and CUDA's own, measured (SGLANG_LOAD_UNTRACKED_GIB);
    - on sm10x, the experts' padding of the flashinfer_trtllm MoE runner (`moe_padding_bytes`)."""
    shape, tp, reserve = req.shape, req.settings.tp, rope_reserve(req)
    rope = deepstack = fused = 0
    if shape.num_full_attention_layers:
        rope += segment_bytes(rope_cache_bytes(shape.max_position_embeddings, shape.rotary_dim, reserve))
    vision = multimodal_vision(req, rel)
    if vision is not None:
        head_dim = vision.hidden_size // vision.num_heads
        rope += segment_bytes(rope_cache_bytes(VISION_ROPE_POSITIONS, head_dim // 2, reserve))
        missing = deepstack_mergers(vision) - vision.num_deepstack_mergers
        deepstack = missing * vision.merger_params(postshuffle_norm=True) * req.model_dtype_bytes // tp
    draft = req.draft
    if draft is not None and req.settings.speculative_method == "dflash":
        # DFlashAttention: RoPE on the whole head (rotary_dim = head_dim).
        rope += segment_bytes(rope_cache_bytes(draft.max_position_embeddings, draft.head_dim, reserve))
        if draft.architecture in FUSED_KV_DRAFT_ARCHS:
            stacked = (attention_bytes_per_token(draft, tp, req.model_dtype_bytes) * draft.hidden_size
                       * draft.num_layers)
            before = draft.max_position_embeddings * draft.head_dim * ROPE_CACHE_DTYPE_BYTES
            grew = rope_rows(draft.max_position_embeddings, reserve) > draft.max_position_embeddings
            # The stack and its transposed copy both fit in the freed segment: the copy keeps it reserved.
            fused = segment_bytes(before) if grew and 2 * stacked <= before else segment_bytes(stacked)
    return LoadExtras(rope, deepstack, fused, int(SGLANG_LOAD_UNTRACKED_GIB * GIB), moe_padding_bytes(req, rel))


# -- the pool split -----------------------------------------------------------------------------------


def static_pool_rest(total: int, weights: int, frac: float, mm_reservation: int = 0) -> int:
    """Bytes left for the KV and state pools: memory after the weights minus total x (1 - fraction),
    minus what 0.5.21 keeps for multimodal allocations made after sizing."""
    return total - weights - int(total * (1 - frac)) - mm_reservation


def mm_reservation_bytes(req: PlanRequest, rel: Release) -> int:
    """`mm_runtime_reservation_gb`: the VLM embedding cache (and the feature-transport pool with
    --mm-feature-transport cuda_ipc / cuda_vmm) for a multimodal model; 0 before 0.5.21."""
    if multimodal_vision(req, rel) is None:
        return 0
    gpu_transport = req.settings.extra.get("mm-feature-transport") in GPU_MM_TRANSPORTS
    return (rel.mm_reservation_mib + (rel.mm_feature_cache_mib if gpu_transport else 0)) * MIB


@dataclass(frozen=True)
class MambaPool:
    slots: int  # max_mamba_cache_size (K); the pool allocates K + 1
    state_bytes: int  # (K + 1) x per-request state
    verify_bytes: int  # DFlash intermediate state: (running + 1) x draft tokens x per-request state


def mamba_pool(rest: int, per_req: int, *, ratio: int, draft: int, requested: int | None,
               full_memory_ratio: float, max_mamba_cache_size: int | None, radix: bool) -> MambaPool:
    """`_handle_max_mamba_cache`: K from the flag, from --max-running-requests without radix cache, or
    solved from the mamba share of the pool, (K + 1) x s + (K / ratio + 1) x D x s = rest x r / (1 + r)."""
    spec = draft > 0 and requested is not None
    if max_mamba_cache_size is not None:
        slots = max_mamba_cache_size
        verify_requests = min(requested, slots // ratio) if spec and requested is not None else -1
    elif not radix and requested is not None:
        slots = requested
        verify_requests = slots if spec else -1
    else:
        budget = rest * full_memory_ratio / (1 + full_memory_ratio)
        if spec and requested is not None:
            slots = int((budget - per_req * (1 + draft)) // (per_req * (1 + draft / ratio)))
            verify_requests = min(requested, slots // ratio)
        else:
            slots = int((budget - per_req) // per_req)
            verify_requests = -1
    # A pool too small for one slot has none (SGLang then refuses to start); never a negative count.
    slots = max(slots, 0)
    verify_requests = min(verify_requests, slots // ratio) if verify_requests >= 0 else -1
    verify = per_req * (verify_requests + 1) * draft if verify_requests >= 0 else 0
    return MambaPool(slots, (slots + 1) * per_req, verify)


def kv_cell_bytes(req: PlanRequest, release: Release = RELEASES[0]) -> int:
    """KV bytes per token on one rank: the target's full-attention layers, plus for DFlash the draft's
    (`scale_kv_cell_size_per_token_for_dflash`): 0.5.17 scales by (target + draft layers) / target
    layers, rounded up; 0.5.21 adds the draft's own KV heads x head_dim x layers."""
    shape, tp = req.shape, req.settings.tp
    layers = shape.num_full_attention_layers
    cell = attention_bytes_per_token(shape, tp, req.kv_dtype_bytes) * layers
    if req.draft is not None and req.settings.speculative_method == "dflash" and layers and cell:
        if release.exact_draft_cell:
            return cell + attention_bytes_per_token(req.draft, tp, req.kv_dtype_bytes) * req.draft.num_layers
        return (cell * (layers + req.draft.num_layers) + layers - 1) // layers
    if req.draft is not None and req.settings.speculative_method and layers:
        return cell + attention_bytes_per_token(req.draft, tp, req.kv_dtype_bytes) * req.draft.num_layers
    return cell


def max_total_num_tokens(rest: int, cell: int, page: int, cap: int | None) -> tuple[int, int]:
    """(profiled, final) token capacity: rest // cell page-aligned, then min with --max-total-tokens."""
    profiled = max(rest, 0) // cell // page * page if cell else 0
    final = min(profiled, cap) // page * page if cap else profiled
    return profiled, final


def running_requests(tokens: int, context_len: int, requested: int | None, slots: int | None,
                     ratio: int) -> int:
    """`resolve_max_num_reqs`: requested (or estimated from the pool) clamped to tokens / 2 and, for
    hybrids, to state slots / ratio."""
    if requested is not None:
        running = min(requested, tokens // 2)
    else:
        running = min(max(min(int(tokens / context_len * 512), 4096), 2048), tokens // 2)
    return max(min(running, slots // ratio) if slots is not None else running, 0)


def running_limit(req: PlanRequest, sp: Split) -> str:
    """What holds the running requests at `sp.running`: the flag (or DFlash's default), the KV pool
    (tokens / 2) or the hybrid state cache (slots / slots per request)."""
    s = req.settings
    if sp.mamba.slots // sp.ratio <= sp.running and sp.per_request_state and sp.mamba.slots // sp.ratio < (
            sp.requested_running or 1 << 30):
        return (f"the mamba state cache ({sp.mamba.slots:,} slots / {sp.ratio} per request: "
                "max_running_requests is capped to it)")
    if sp.requested_running is not None and sp.running == sp.requested_running:
        if s.max_running_requests is not None:
            return f"--max-running-requests {s.max_running_requests}"
        return f"DFlash's default of {DFLASH_DEFAULT_MAX_RUNNING_REQUESTS} (--max-running-requests unset)"
    if sp.kv_tokens // 2 <= sp.running:
        return f"the KV pool ({sp.kv_tokens:,} tokens / 2)"
    return "SGLang's estimate from the KV pool and the context length"


@dataclass(frozen=True)
class Split:
    mem_fraction_static: float
    strategy: str
    overlap: bool
    ratio: int
    draft_tokens: int
    release: Release
    mm_reservation: int  # 0.5.21: kept out of the pool for multimodal allocations after sizing
    extras: LoadExtras  # what loading leaves on the GPU besides the weights
    rest: int  # static pool after weights, before the state pool
    per_request_state: int
    mamba: MambaPool
    kv_rest: int  # what the KV pool gets
    cell: int
    page: int
    kv_tokens_profiled: int
    kv_tokens: int
    requested_running: int | None
    running: int


def split(req: PlanRequest) -> Split:
    s, shape = req.settings, req.shape
    total = int(req.memory_before_load_gib * GIB)  # SGLang's pre_model_load_memory
    rel = release_for(req.engine_version)
    frac = resolve_mem_fraction_static(req)
    strategy, overlap = resolve_mamba_strategy(req)
    radix = radix_cache(req)
    ratio, d = mamba_ratio(strategy, radix, overlap), draft_tokens(req)
    requested = requested_running_requests(req)
    mm = mm_reservation_bytes(req, rel)
    extras = load_extras(req, rel)
    rest = static_pool_rest(total, req.weights_per_gpu() + req.draft_weights_per_gpu() + extras.total, frac, mm)
    conv, recurrent = mamba_state_bytes(req, 0) if shape.is_hybrid else (0, 0)
    per_req = (conv + recurrent) * shape.num_linear_attention_layers
    pool = MambaPool(0, 0, 0)
    if per_req and rest > 0:
        pool = mamba_pool(rest, per_req, ratio=ratio, draft=d, requested=requested,
                          full_memory_ratio=s.mamba_full_memory_ratio or DEFAULT_MAMBA_FULL_MEMORY_RATIO,
                          max_mamba_cache_size=s.max_mamba_cache_size, radix=radix)
    kv_rest = rest - pool.state_bytes - pool.verify_bytes
    cell, page = kv_cell_bytes(req, rel), resolve_page_size(req)
    profiled, tokens = max_total_num_tokens(kv_rest, cell, page, s.max_total_tokens)
    running = running_requests(tokens, req.max_model_len, requested, pool.slots if per_req else None, ratio)
    return Split(frac, strategy, overlap, ratio, d, rel, mm, extras, rest, per_req, pool, kv_rest, cell, page,
                 profiled, tokens, requested, running)


# -- the plan -------------------------------------------------------------------------------------------


def plan(req: PlanRequest, suggest: bool = True) -> Plan:
    s, shape = req.settings, req.shape
    refuse_tp(shape, s.tp)
    sp = split(req)
    headroom = int(int(req.memory_before_load_gib * GIB) * (1 - sp.mem_fraction_static))
    notes = [*req.notes, f"static pool = {sp.mem_fraction_static:g} x {req.memory_before_load_gib:g} GiB; headroom "
             f"{gib(headroom)} for CUDA graphs and activations; DFlash verify buffers are in the static pool"]
    found = req.engine_memory
    if found is not None:
        notes.append(found.note())
    else:
        notes.append(f"pools sized from the {req.memory_before_load_gib:g} GiB the engine logged free before "
                     f"loading (of {req.gpu_memory_gib:g} GiB)")
    limit = running_limit(req, sp)
    if sp.running > 0:
        notes.append(f"running requests capped at {sp.running} by {limit}")
    if s.mem_fraction_static is None:
        notes.append(f"--mem-fraction-static not set: SGLang's default for {req.gpu_memory_gib:g} GiB at tp "
                     f"{s.tp} is {sp.mem_fraction_static:.4g}")
    if sp.requested_running is not None and s.max_running_requests is None:
        notes.append(f"DFlash sets --max-running-requests to {DFLASH_DEFAULT_MAX_RUNNING_REQUESTS} when unset")
    if shape.is_hybrid and s.mamba_radix_cache_strategy in (None, "auto") and radix_cache(req):
        notes.append(f"mamba radix cache strategy auto resolves to {sp.strategy} ({sp.ratio} state slots "
                     "per running request)")
    if sp.kv_tokens and sp.kv_tokens < req.max_model_len:
        notes.append(f"the KV pool ({sp.kv_tokens:,} tokens) is shorter than the context length "
                     f"({req.max_model_len:,}): the longest request is limited by the pool")
    notes += _release_notes(req, sp)
    if sp.extras.moe_padding:
        per_gpu = req.shape.moe_intermediate_size // max(s.tp // expert_parallel(req), 1)
        named = _flag(req, "moe-runner-backend") not in (None, "auto")
        why = "the profile's --moe-runner-backend" if named else "SGLang's choice on sm10x for this model"
        notes.append(f"MoE runner {moe_runner(req, sp.release)} ({why}): it pads each GPU's expert intermediate size "
                     f"from {per_gpu} to {cdiv(per_gpu, TRTLLM_MOE_ALIGN) * TRTLLM_MOE_ALIGN}, "
                     f"{gib(sp.extras.moe_padding)} more weights per GPU (counted)")
    backend = attention_backend_line(s.extra, req.compute_capability, bool(s.speculative_method))
    if backend:
        notes.append(f"{backend} on sm{req.compute_capability}")
    problems = _check(req, sp, headroom)
    result = Plan(
        engine="sglang", engine_version=req.engine_version, profile=req.profile, model=shape.name,
        draft=req.draft.name if req.draft else None, tp=s.tp, gpu_memory_gib=req.gpu_memory_gib,
        # The target's weights as SGLang holds them (its "Load weight end ... mem usage"): the trtllm MoE
        # runner's padding included.
        max_model_len=req.max_model_len, weights_bytes=req.weights_per_gpu() + sp.extras.moe_padding,
        draft_weights_bytes=req.draft_weights_per_gpu(), reserve_bytes=reserve_bytes(req),
        kv_bytes_per_token=sp.cell, state_bytes_per_sequence=sp.per_request_state,
        kv_pool_bytes=sp.kv_tokens * sp.cell, block_size=sp.page, page_size_bytes=sp.page * sp.cell,
        num_blocks=sp.kv_tokens // sp.page, blocks_per_request=cdiv(req.max_model_len, sp.page),
        max_concurrency=sp.kv_tokens / req.max_model_len, kv_cache_tokens=sp.kv_tokens,
        problems=problems, notes=notes, unknowns=_unknowns(req), warnings=clamp_warnings(req, sp),
        engine_details={
            "accounting_release": sp.release.name,
            "memory_before_load_gib": req.memory_before_load_gib,
            "page_size": sp.page,
            "mm_runtime_reservation_bytes": sp.mm_reservation,
            # Taken with the weights before the pools are sized: RoPE caches, deepstack mergers SGLang adds,
            # DFlash's fused KV weights, the allocator's share (`load_extras`).
            "load_extras_bytes": sp.extras.total,
            "moe_runner": moe_runner(req, sp.release),
            "moe_padding_bytes": sp.extras.moe_padding,
            "mem_fraction_static": sp.mem_fraction_static,
            "headroom_bytes": headroom,
            "static_pool_rest_bytes": max(sp.rest, 0),
            "kv_budget_bytes": max(sp.kv_rest, 0),
            "mamba_radix_cache_strategy": sp.strategy,
            "mamba_ratio": sp.ratio,
            # "Mamba Cache is allocated. max_mamba_cache_size: ..." in SGLang's log.
            "max_mamba_cache_size": sp.mamba.slots,
            "mamba_state_bytes": sp.mamba.state_bytes,
            "kv_tokens_profiled": sp.kv_tokens_profiled,
            "max_total_num_tokens": sp.kv_tokens,
            # The two figures of SGLang's "max_total_num_tokens=..., max_running_requests=..." log line
            # (scheduler start, after CUDA-graph capture); max_total_num_tokens also equals the
            # "#tokens" of both "KV Cache is allocated" lines (target and DFlash draft).
            "max_running_requests": sp.running,
            "running_requests_capped_by": limit,
            "requested_running_requests": sp.requested_running,
            "draft_tokens": sp.draft_tokens,
            "dflash_verify_buffer_bytes": sp.mamba.verify_bytes,
        },
    )
    if problems and suggest:
        result.suggestion = _suggest(req)
    return result


def _release_notes(req: PlanRequest, sp: Split) -> list[str]:
    """What the release SGLang resolves or warns about that the plan's figures depend on."""
    s, rel = req.settings, sp.release
    notes = []
    if req.engine_version != rel.name:
        notes.append(f"SGLang {req.engine_version or '(version not given)'}: planned with the accounting of "
                     f"{rel.name}, the nearest release read")
    if s.attention_backend in BACKEND_PAGE_SIZES and sp.page != s.block_size:
        notes.append(f"--attention-backend {s.attention_backend}: SGLang sets the page size to {sp.page} tokens")
    if sp.mm_reservation:
        notes.append(f"SGLang {rel.name} keeps {sp.mm_reservation / MIB:g} MiB of the KV budget for multimodal "
                     "allocations made after sizing (--language-model-only drops it)")
    for flag, what in rel.deprecated_flags.items():
        if flag in s.extra:
            notes.append(f"--{flag} is deprecated in SGLang {rel.name} ({what}); the profile keeps it")
    return notes


def _unknowns(req: PlanRequest) -> list[str]:
    """Figures the plan cannot know: a speculative draft without a shape, or one whose shape is guessed."""
    draft, method = req.draft, req.settings.speculative_method
    if method == "dflash" and draft is None:
        return ["no draft shape: the draft's weights, KV and verify buffers are not counted (pass --draft-config)"]
    if method and draft is not None and draft.inferred:
        return [f"the draft shape {draft.name!r} is not its checkpoint's published config ({', '.join(draft.inferred)} "
                f"guessed): its weights ({gib(req.draft_weights_per_gpu())} per GPU), KV and verify buffers are "
                "estimates"]
    return []


def refuse_tp(shape: ModelShape, tp: int) -> None:
    """SGLang asserts that tp divides the attention heads (models/qwen3_5.py: `total_num_heads %
    attn_tp_size == 0`) and the linear-attention heads (distributed/utils.py `divide`)."""
    for what, n in tp_divisibility(shape, tp):
        raise UserError(f"--tp {tp}: SGLang refuses it: the model's {n} {what} are not divisible by {tp} "
                        "(tensor parallelism splits heads evenly); choose a --tp that divides them")


def _check(req: PlanRequest, sp: Split, headroom: int) -> list[Problem]:
    s = req.settings
    problems = [Problem("flags", f"--{flag} is not a flag of SGLang {sp.release.name}: it refuses to start", what)
                for flag, what in sp.release.removed_flags.items() if flag in s.extra]
    problems += [Problem("flags", bad.line(), f"drop --{bad.flag} (`profiles new` drops it for this GPU)")
                 for bad in unrunnable(s.extra, req.compute_capability)]
    if sp.rest <= 0:
        # _profile_available_bytes raises this ValueError before any pool exists.
        # SGLang's suggestion, 1 - available / pre-load memory: what loading took, RoPE caches and all.
        weights = req.weights_per_gpu() + req.draft_weights_per_gpu() + sp.extras.total
        minimum = math.ceil(weights / (req.memory_before_load_gib * GIB) * 1000) / 1000
        fix = (f"--mem-fraction-static above {minimum:.3f}" if minimum < 1
               else f"--tp {s.tp * 2} (more GPUs) or a smaller checkpoint" if more_gpus(req)
               else f"a smaller checkpoint (one host holds {req.gpus_per_host} of these GPUs)")
        return [*problems, Problem("weights", f"SGLang: loaded weights ({gib(weights)} per GPU, target + draft with "
                        "what loading adds) leave no "
                        f"GPU memory for the KV cache under --mem-fraction-static={sp.mem_fraction_static:g}",
                        fix)]
    if req.shape.is_hybrid and sp.mamba.slots <= 0:
        problems.append(Problem(
            "mamba state cache", f"SGLang: not enough GPU memory for the hybrid state cache "
            f"(max_mamba_cache_size {sp.mamba.slots}, {sp.per_request_state / MIB:.1f} MiB per request"
            + (f", DFlash verify buffers for {sp.draft_tokens} draft tokens" if sp.draft_tokens else "") + ")",
            "raise --mem-fraction-static" + (", lower --max-running-requests, or more GPUs (--tp)" if more_gpus(req)
                                             else " or lower --max-running-requests")))
    elif req.shape.is_hybrid and sp.running <= 0:
        problems.append(Problem(
            "mamba state cache", f"SGLang: the hybrid state cache is too small to serve any request "
            f"({sp.mamba.slots} slots, {sp.ratio} per request)",
            "raise --mem-fraction-static" + (" or --tp" if more_gpus(req) else "")))
    if s.max_total_tokens and sp.kv_tokens_profiled < s.max_total_tokens and not small_shortfall(req, sp):
        problems.append(Problem(
            "KV pool", f"{sp.kv_tokens_profiled:,} tokens fit, fewer than --max-total-tokens {s.max_total_tokens:,}"
            + _shortfall_limit(req, sp),
            "raise --mem-fraction-static" + (", lower --max-total-tokens, or more GPUs (--tp)" if more_gpus(req)
                                             else " or lower --max-total-tokens")))
    elif sp.kv_tokens <= 0:
        problems.append(Problem("KV pool", "no room for any KV token",
                                "raise --mem-fraction-static" + (" or --tp" if more_gpus(req) else "")))
    if reserve_bytes(req) > headroom:
        problems.append(Problem(
            "CUDA graphs + activations", f"{gib(reserve_bytes(req))} exceed the {gib(headroom)} headroom "
            "outside the static pool", "lower --mem-fraction-static" + (" or add GPUs (--tp)" if more_gpus(req) else "")))
    return problems


# A KV pool short of --max-total-tokens by at most this share, still holding as much of one request as the
# cap did (the full context when the cap held it), is a warning: SGLang starts, logs "max_total_tokens=... is
# larger than the profiled value ...; use the profiled value instead" and serves every request the profile
# promises, a little less of them cached. 10% of a computed H200 profile's pool is 0.6 GiB, beyond the caps'
# 0.5 GiB slack (sizing/engine_memory.py); a larger shortfall is a problem.
SMALL_SHORTFALL = 0.10


def small_shortfall(req: PlanRequest, sp: Split) -> bool:
    """Whether the pool SGLang will clamp --max-total-tokens to is short of it by little (SMALL_SHORTFALL) and
    still holds the longest request the cap held."""
    cap = req.settings.max_total_tokens
    if not cap or sp.kv_tokens_profiled >= cap:
        return False
    return (sp.kv_tokens_profiled >= cap * (1 - SMALL_SHORTFALL)
            and sp.kv_tokens_profiled >= min(cap, req.max_model_len) and sp.running > 0)


def _shortfall_limit(req: PlanRequest, sp: Split) -> str:
    cap = req.settings.max_total_tokens or 0
    held = min(cap, req.max_model_len)
    return (f" ({(1 - sp.kv_tokens_profiled / cap):.1%} short: more than {SMALL_SHORTFALL:.0%}, or the pool no longer "
            f"holds a {held:,}-token request)")


def clamp_warnings(req: PlanRequest, sp: Split) -> list[str]:
    """What SGLang starts with but clamps, with the line it logs."""
    cap = req.settings.max_total_tokens
    if not cap or not small_shortfall(req, sp):
        return []
    return [f"the KV pool holds {sp.kv_tokens_profiled:,} tokens, {cap - sp.kv_tokens_profiled:,} "
            f"({1 - sp.kv_tokens_profiled / cap:.2%}) fewer than --max-total-tokens {cap:,}: SGLang clamps to "
            f"{sp.kv_tokens:,} and logs \"max_total_tokens={cap} is larger than the profiled value "
            f"{sp.kv_tokens_profiled}. Use the profiled value instead.\"; {sp.running} running requests are "
            f"unchanged (free the memory other processes hold to get the full pool)"]


def more_gpus(req: PlanRequest) -> bool:
    """Whether twice the GPUs fit one host of this card (unknown: yes); a DGX Spark holds one."""
    return req.gpus_per_host is None or req.gpus_per_host >= 2 * req.settings.tp


def _suggest(req: PlanRequest) -> str | None:
    """The smallest change that fits: --mem-fraction-static alone, else more GPUs (with the fraction
    nearest the current one that then fits), never more than one host of this card holds."""
    frac = resolve_mem_fraction_static(req)
    candidates = sorted({round(f / 100, 2) for f in range(30, 96)}, key=lambda f: (abs(f - frac), -f))
    tp = req.settings.tp
    while tp <= min(8, req.gpus_per_host or 8):
        bigger = replace(req, gpu_count=max(req.gpu_count, tp)).with_settings(tp=tp)
        for candidate in candidates if not tp_divisibility(req.shape, tp) else ():
            if not plan(bigger.with_settings(mem_fraction_static=candidate), suggest=False).problems:
                flag = f"--mem-fraction-static {candidate:g}"
                if tp == req.settings.tp:
                    return flag
                return f"--tp {tp} ({tp} GPUs of {req.gpu_memory_gib:g} GiB) with {flag}"
        tp *= 2
    return None


# -- caps for a computed profile ------------------------------------------------------------------------

# The KV pool a computed profile keeps at least: one request of the full context length when the card
# has room for it; else, with one running request, at least this many tokens (a prompt and its answer).
MIN_KV_TOKENS = 4096
CAP_FLAGS = ("max-running-requests", "max-mamba-cache-size", "max-total-tokens")


def card_caps(req: PlanRequest) -> Caps:
    """The running-request limit and the KV pool for this card, from the same accounting as `plan`.

    Hybrid models: each running request holds `ratio` state slots plus DFlash's verify buffers (draft
    tokens x the state); the pools are sized explicitly (--max-mamba-cache-size = ratio x requests) so
    that the memory SGLang's own split (mamba share 0.9 / 1.9) would leave to a KV pool far larger than
    the requests can use goes to requests instead. The most requests up to DFlash's 48 whose KV pool
    still holds one request of the full context length; on a card without room for that, one request
    and what KV is left (at least MIN_KV_TOKENS). --max-total-tokens is the KV pool that remains: the
    engine, finding at least the planned free memory, logs exactly these figures. Plain models get
    the KV pool and SGLang's own running-request limit written out. The CUDA-graph batch sizes follow:
    SGLang captures up to the running-request limit."""
    base = req.with_settings(max_total_tokens=None, max_running_requests=None, max_mamba_cache_size=None)
    fraction = resolve_mem_fraction_static(base)
    # The headroom outside the static pool must hold SGLang's own CUDA-graph and activation reserve for
    # this card (what its default fraction leaves); a seed's fraction from a larger card is lowered to it.
    fits = math.floor((1 - reserve_bytes(base) / (base.memory_before_load_gib * GIB)) * 1000) / 1000
    lowered: dict[str, int | float | None] = {}
    if fits < fraction:
        base = base.with_settings(mem_fraction_static=fits)
        lowered = {"mem-fraction-static": fits}
    reasons = {"mem-fraction-static": "the headroom holds SGLang's own CUDA-graph and activation reserve on this card"}
    sp = split(base)
    limit = sp.requested_running or DFLASH_DEFAULT_MAX_RUNNING_REQUESTS
    if not sp.per_request_state:
        running = running_requests(sp.kv_tokens, base.max_model_len, sp.requested_running, None, sp.ratio)
        return Caps({**lowered, "max-running-requests": running, "max-mamba-cache-size": None,
                     "max-total-tokens": sp.kv_tokens}, running, sp.kv_tokens,
                    f"{running} running requests and the {sp.kv_tokens:,}-token KV pool SGLang sizes on this card",
                    reasons)

    def tokens_for(running: int) -> int:
        return _tokens_for(base, sp.ratio, running)

    full = base.max_model_len
    fitting = [n for n in range(limit, 0, -1) if tokens_for(n) >= full]
    if fitting:
        running = fitting[0]
        why = (f"{running} running requests ({sp.ratio} state slots and {sp.draft_tokens} verify buffers each) "
               f"with a KV pool that still holds one request of the full {full:,}-token context"
               + (f"; {running + 1} would not" if running < limit else f" (DFlash's limit is {limit})"))
    else:
        running = 1
        why = (f"1 running request: the card has no room for a request of the full {full:,}-token context "
               "and the state of more requests; the KV pool limits the longest request")
    tokens = max(tokens_for(running), 0) // sp.page * sp.page
    if tokens < min(MIN_KV_TOKENS, full):
        return Caps({}, 0, tokens, f"no room for one request: {tokens:,} KV tokens after one request's state "
                    f"({sp.per_request_state * (sp.ratio + 1 + sp.draft_tokens) / MIB:,.0f} MiB with its verify "
                    "buffers)")
    return Caps({**lowered, "max-running-requests": running, "max-mamba-cache-size": sp.ratio * running,
                 "max-total-tokens": tokens}, running, tokens, why, reasons)


def _tokens_for(base: PlanRequest, ratio: int, running: int) -> int:
    """The KV pool left once `running` requests have their state slots (and verify buffers); -1 when the
    state of that many does not fit."""
    sized = split(base.with_settings(max_running_requests=running, max_mamba_cache_size=ratio * running))
    return sized.kv_tokens_profiled if sized.running >= running else -1


def running_caps(req: PlanRequest, running: int | None) -> dict[str, int | float | None]:
    """The caps of `req` re-planned for exactly `running` requests on the same card (`tune`'s candidates):
    their state slots, their DFlash verify buffers (none with speculation off) and the KV pool that remains;
    None: every cap removed, SGLang sizes its pools itself. The fraction is the request's own."""
    if running is None:
        return dict.fromkeys(CAP_FLAGS)
    base = req.with_settings(max_total_tokens=None, max_running_requests=None, max_mamba_cache_size=None)
    sp = split(base)
    if not sp.per_request_state:
        return {"max-running-requests": running, "max-mamba-cache-size": None, "max-total-tokens": sp.kv_tokens}
    tokens = max(_tokens_for(base, sp.ratio, running), 0) // sp.page * sp.page
    # No pool (the state of that many does not fit): no KV cap; the planner refuses the state cache.
    return {"max-running-requests": running, "max-mamba-cache-size": sp.ratio * running,
            "max-total-tokens": tokens or None}
