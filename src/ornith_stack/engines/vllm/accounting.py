"""vLLM 0.24 KV-cache accounting for hybrid (gated-delta + full attention) and plain models.

Mirrors, function by function (read in the vLLM 0.24.0 wheel):
- `platforms/interface.py` `_align_hybrid_block_size`: attention block size = kernel alignment (16)
  x ceil(mamba page / (alignment x attention bytes per token per layer)); the mamba page is padded
  up to the attention page.
- `layers/mamba/mamba_utils.py` `gated_delta_net_state_shape`: conv state (kernel - 1 + num_spec,
  conv_dim / tp) in the model dtype, recurrent state (value_heads / tp, v_dim, k_dim) in
  `mamba_ssm_cache_dtype` (Qwen3.5: the config's `mamba_ssm_dtype`, models/config.py).
- `models/config.py` `MambaModelConfig`: prefix caching on -> mamba cache mode "align" (Qwen3.5 does
  not declare SupportsMambaPrefixCaching), off -> "none".
- `v1/kv_cache_interface.py` `MambaSpec.max_memory_usage_bytes`: 1 page (none) or 2 (align) plus
  num_speculative_blocks per request; attention: ceil(max_model_len / block) pages.
- `v1/core/kv_cache_utils.py` `_get_kv_cache_groups_uniform_page_size` (group size = smallest layer
  count of a type, or the largest when it is < 1.5x the smallest), `get_num_blocks`
  (pool // page // group_size), `get_max_concurrency_for_kv_cache_config`, `get_kv_cache_capacity`
  (tokens = int(concurrency x max_model_len)) and `_check_enough_kv_cache_memory`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ornith_stack.sizing.common import attention_bytes_per_token, mamba_state_bytes, tp_divisibility
from ornith_stack.sizing.model import GIB, Caps, Plan, PlanRequest, Problem, cdiv, gib
from ornith_stack.sizing.shapes import ModelShape

KERNEL_BLOCK_ALIGNMENT = 16  # CacheConfig.DEFAULT_BLOCK_SIZE; FLASH_ATTN/FlashInfer kernels take multiples of 16
# vLLM 0.24.0 defaults for flags a profile leaves out (tests/unit/test_engine_defaults.py reads them
# in vLLM's sources): config/cache.py CacheConfig.gpu_memory_utilization.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
# A computed pin is a multiple of this (readable in GiB, and well inside the margin).
PIN_STEP = 64 << 20
# Speculative methods whose draft model brings attention layers of its own into the KV cache.
DRAFT_MODEL_METHODS = {"dflash", "eagle", "eagle3", "draft_model"}


@dataclass(frozen=True)
class LayerType:
    """Layers sharing one KV-cache spec; vLLM groups them by count."""

    name: str
    layers: int
    tokens_per_page: int | None  # attention: the block size; None for per-sequence state
    state_pages: int = 0  # gated-delta: pages per request whatever its length

    def pages(self, length: int) -> int:
        """Pages one request of `length` tokens needs in one group of this type."""
        return cdiv(length, self.tokens_per_page) if self.tokens_per_page else self.state_pages


def prefix_caching(req: PlanRequest) -> bool:
    """--enable-prefix-caching as vLLM 0.24 resolves it: absent the flag, on unless the model is a
    hybrid (config/model.py `is_prefix_caching_supported`: "Hybrid models do not support prefix
    caching since the feature is still experimental")."""
    if req.settings.enable_prefix_caching is not None:
        return req.settings.enable_prefix_caching
    return not req.shape.is_hybrid


def attention_block_size(mamba_page: int, attn_per_token: int, user_block: int | None) -> int:
    alignment = max(KERNEL_BLOCK_ALIGNMENT, user_block or 0)
    block = user_block or KERNEL_BLOCK_ALIGNMENT
    if mamba_page:
        needed = alignment * cdiv(mamba_page, alignment * attn_per_token)
        block = max(block, needed)
    return block


def group_size(layer_types: list[LayerType]) -> int:
    counts = [t.layers for t in layer_types]
    smallest, largest = min(counts), max(counts)
    return largest if largest < smallest * 1.5 else smallest


def blocks_per_request(layer_types: list[LayerType], size: int, length: int) -> int:
    return sum(cdiv(t.layers, size) * t.pages(length) for t in layer_types)


def plan(req: PlanRequest) -> Plan:
    s, shape = req.settings, req.shape
    tp, max_len, num_spec = s.tp, req.max_model_len, s.num_speculative_tokens
    problems: list[Problem] = []
    notes: list[str] = list(req.notes)
    problems += _divisibility(shape, tp)
    attn_per_token = attention_bytes_per_token(shape, tp, req.kv_dtype_bytes)
    conv, recurrent = mamba_state_bytes(req, num_spec) if shape.is_hybrid else (0, 0)
    mamba_page = conv + recurrent
    block = attention_block_size(mamba_page, attn_per_token, s.block_size)
    page = block * attn_per_token
    mode = "align" if prefix_caching(req) else "none"
    types = [LayerType("full_attention", shape.num_full_attention_layers, block)]
    if shape.is_hybrid:
        # MambaSpec.max_memory_usage_bytes: 1 page ("none") or 2 ("align") + num_speculative_blocks.
        types.append(
            LayerType("gated_delta", shape.num_linear_attention_layers, None, (2 if mode == "align" else 1) + num_spec)
        )
    draft_type, draft_note = _draft_layers(req, attn_per_token, block)
    if draft_type and _same_attention_spec(shape, req.draft, tp):
        # Equal FullAttentionSpecs are one layer type: the draft's layers join the target's group.
        types[0] = LayerType("full_attention", types[0].layers + draft_type.layers, block)
    elif draft_type:
        types.append(draft_type)
    if draft_note:
        notes.append(draft_note)
    size = group_size(types)
    bpr = blocks_per_request(types, size, max_len)

    weights, draft_weights, reserve = req.weights_per_gpu(), req.draft_weights_per_gpu(), req.reserve_bytes
    budget = int(req.gpu_memory_gib * GIB)
    utilization = s.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
    if s.kv_cache_memory_bytes is not None:
        pool = s.kv_cache_memory_bytes
        notes.append(f"KV pool pinned by --kv-cache-memory-bytes ({gib(pool)}); vLLM skips its free-memory profiling")
    else:
        pool = int(budget * utilization) - weights - draft_weights - reserve
        notes.append(f"KV pool = {utilization:g} x {req.gpu_memory_gib:g} GiB - weights - draft - reserve")
    num_blocks = max(pool, 0) // page // size
    concurrency = num_blocks / bpr
    tokens = int(concurrency * max_len)
    needed = size * page * bpr  # _max_memory_usage_bytes_from_groups: one request at max_model_len

    problems += _check(req, pool, needed, weights + draft_weights + reserve, budget, types, page, size, utilization)
    if shape.mtp_num_hidden_layers and s.speculative_method != "mtp":
        notes.append("MTP weights are not loaded (vLLM skips mtp.* unless the method is mtp)")
    return Plan(
        engine="vllm",
        engine_version=req.engine_version,
        profile=req.profile,
        model=shape.name,
        draft=req.draft.name if req.draft else None,
        tp=tp,
        gpu_memory_gib=req.gpu_memory_gib,
        max_model_len=max_len,
        weights_bytes=weights,
        draft_weights_bytes=draft_weights,
        reserve_bytes=reserve,
        kv_bytes_per_token=attn_per_token * shape.num_full_attention_layers,
        state_bytes_per_sequence=mamba_page * shape.num_linear_attention_layers,
        kv_pool_bytes=pool,
        block_size=block,
        page_size_bytes=page,
        num_blocks=num_blocks,
        blocks_per_request=bpr,
        max_concurrency=concurrency,
        kv_cache_tokens=tokens,
        problems=problems,
        notes=notes,
        engine_details={
            "mamba_cache_mode": mode,
            "mamba_page_bytes": mamba_page,
            "mamba_page_padding_pct": round(100 * (page - mamba_page) / mamba_page, 2) if mamba_page else 0.0,
            "group_size": size,
            "kv_cache_groups": {t.name: cdiv(t.layers, size) for t in types},
            "pages_per_request": {t.name: t.pages(max_len) for t in types},
            "memory_for_one_request_bytes": needed,
            "gpu_memory_utilization": utilization,
        },
    )


def _same_attention_spec(target: ModelShape, draft: ModelShape | None, tp: int) -> bool:
    return draft is not None and (max(1, draft.num_key_value_heads // tp), draft.head_dim) == (
        max(1, target.num_key_value_heads // tp),
        target.head_dim,
    )


def _draft_layers(req: PlanRequest, attn_per_token: int, block: int) -> tuple[LayerType | None, str | None]:
    """A draft model's attention layers (vLLM's DFlash draft uses plain decoder attention) join the KV
    cache; with a KV layout other than the target's they are a layer type of their own, their block
    scaled so that the page sizes agree (`unify_kv_cache_spec_page_size`)."""
    s, draft = req.settings, req.draft
    if draft is None or s.speculative_method not in DRAFT_MODEL_METHODS:
        return None, None
    per_token = attention_bytes_per_token(draft, s.tp, req.kv_dtype_bytes)
    page = block * per_token
    target_page = block * attn_per_token
    if target_page % page:
        return None, (
            f"draft KV layout ({per_token} B/token/layer) does not divide the target's page: "
            "vLLM's page unification for it is not modelled; draft KV left out"
        )
    draft_block = block * (target_page // page)  # unify_kv_cache_spec_page_size scales the block
    return LayerType("draft_attention", draft.num_full_attention_layers, draft_block), None


def _divisibility(shape: ModelShape, tp: int) -> list[Problem]:
    return [
        Problem("tensor parallelism", f"--tp {tp} does not divide the {what} ({n})", "choose a --tp that divides it")
        for what, n in tp_divisibility(shape, tp)
    ]


def _check(
    req: PlanRequest,
    pool: int,
    needed: int,
    fixed: int,
    budget: int,
    types: list[LayerType],
    page: int,
    size: int,
    utilization: float,
) -> list[Problem]:
    s = req.settings
    problems: list[Problem] = []
    max_len = req.max_model_len
    if pool <= 0:
        problems.append(
            Problem(
                "KV cache",
                f"no memory left for the KV cache: weights {gib(req.weights_per_gpu())} + draft "
                f"{gib(req.draft_weights_per_gpu())} + reserve {gib(req.reserve_bytes)} exceed "
                f"{utilization:g} x {req.gpu_memory_gib:g} GiB",
                _more_gpus_fix(req),
            )
        )
        return problems
    if needed > pool:
        longest = _longest_fitting(types, page, size, pool, max_len)
        fix = (
            f"--kv-cache-memory-bytes {needed} or more"
            if s.kv_cache_memory_bytes is not None
            else f"raise --gpu-memory-utilization above {utilization:g} or {_more_gpus_fix(req)}"
        )
        problems.append(
            Problem(
                "KV cache",
                f"to serve one request at max-model-len {max_len:,}, {gib(needed)} of KV cache is "
                f"needed, more than the {gib(pool)} available (longest that fits: {longest:,})",
                fix,
            )
        )
    if s.kv_cache_memory_bytes is not None:
        # A pinned pool skips vLLM's profiling: it must fit in what the engine finds free.
        budget = int(req.memory_before_load_gib * GIB)
    if fixed + pool > budget:
        problems.append(
            Problem(
                "GPU memory",
                f"weights + draft + reserve {gib(fixed)} and KV pool {gib(pool)} exceed the "
                f"{budget / GIB:.2f} GiB per GPU"
                + (" the engine finds free" if s.kv_cache_memory_bytes is not None else ""),
                f"--kv-cache-memory-bytes {max(budget - fixed, 0)} or less, or {_more_gpus_fix(req)}"
                if s.kv_cache_memory_bytes is not None
                else _more_gpus_fix(req),
            )
        )
    return problems


def _longest_fitting(types: list[LayerType], page: int, size: int, pool: int, max_len: int) -> int:
    """`_estimate_max_model_len_from_groups`: binary search for the longest max_model_len that fits."""
    lo, hi, best = 1, max_len, 0
    while lo <= hi:
        mid = (lo + hi) // 2
        if size * page * blocks_per_request(types, size, mid) <= pool:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _more_gpus_fix(req: PlanRequest) -> str:
    return f"--tp {req.settings.tp * 2} (more GPUs) or a smaller checkpoint (FP8 needs sm90+)"


def card_caps(req: PlanRequest) -> Caps:
    """--kv-cache-memory-bytes for this card: the pin is per GPU, so it is sized at the plan's tp from
    what each GPU has left after its share of the weights, the draft and the reserve (whole GiB, below
    the free memory the engine finds, margin included). A unified-memory part (GB10) keeps the seed's pin:
    the rest of its memory is the host's. No room for one request of the full context: running 0."""
    s = req.settings
    if s.kv_cache_memory_bytes is None or req.unified_memory:
        found = plan(req)
        return Caps({}, int(found.max_concurrency) if not found.problems else 0, found.kv_cache_tokens,
                     "the seed's pin (unified memory: the rest is the host's)" if req.unified_memory
                     else "vLLM sizes its pool from --gpu-memory-utilization")
    room = int(req.memory_before_load_gib * GIB) - req.weights_per_gpu() - req.draft_weights_per_gpu() - req.reserve_bytes
    pin = max(room // PIN_STEP, 0) * PIN_STEP
    found = plan(req.with_settings(kv_cache_memory_bytes=pin or 1))
    if not pin or found.problems:
        return Caps({}, 0, found.kv_cache_tokens,
                    f"no room for one request of {req.max_model_len:,} tokens: {gib(max(room, 0))} per GPU left "
                    f"for the KV pin, {gib(found.engine_details['memory_for_one_request_bytes'])} needed")
    return Caps({"kv-cache-memory-bytes": pin}, max(int(found.max_concurrency), 1), found.kv_cache_tokens,
                f"a {pin / GIB:g} GiB KV pin per GPU at tp {s.tp}: {found.kv_cache_tokens:,} tokens, "
                f"{found.max_concurrency:.2f}x concurrency at {req.max_model_len:,}")
