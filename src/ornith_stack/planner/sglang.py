"""SGLang memory accounting for the Qwen3.5 hybrid with a DFlash draft (FACTS section 4).

The pool split follows SGLang's KV-cache configurator (`_profile_available_bytes`,
`_handle_max_mamba_cache`, `_resolve_max_num_reqs`, read in sglang's model-runner KV-cache code):
- rest = memory left after the weights (target + draft) - total x (1 - mem_fraction_static);
- mamba state pool = rest x r / (1 + r), r = --mamba-full-memory-ratio (0.9), unless
  --max-mamba-cache-size (or radix cache off with --max-running-requests) fixes the slot count;
- KV tokens = what is left / cell size (full-attention layers x 2 x KV heads/rank x head_dim x dtype,
  plus the DFlash draft's KV per token), then min(..., --max-total-tokens);
- running requests = min(requested, tokens / 2, state slots / S), S = 3 (radix cache, no extra
  buffer), 3 + 2 (extra_buffer with the overlap scheduler) or 3 + 1 (without), 1 (radix cache off).
  DFlash sets --max-running-requests to 48 when it is not given.
- DFlash verify buffers (`intermediate_ssm_state_cache`): per running request x draft tokens x the
  recurrent state of every gated-delta layer (about 0.94 GiB/request for the 35B at block 16).
  From 0.5.17 (sglang `mem_cache/kv_cache_configurator.py`, `_handle_max_mamba_cache`, and the
  H200 recordings in tests/fixtures/engines/sglang-0.5.17) the mamba budget is solved jointly for
  state + intermediate, with the pool's padding slot on both buffers:
  (K + 1) x per_req + (min(requested, K / S) + 1) x D x per_req = budget; so they come out of the
  static pool. Older versions are taken to size them outside it, next to CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

from ornith_stack.planner.model import GIB, Plan, PlanRequest, Problem, cdiv, gib
from ornith_stack.planner.vllm import attention_bytes_per_token, mamba_state_bytes

DEFAULT_MEM_FRACTION_STATIC = 0.85  # SGLang picks one by GPU size; 0.85 is what seed 000 uses on one GPU
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
DFLASH_DEFAULT_MAX_RUNNING_REQUESTS = 48
MAMBA_RATIO = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO
JOINT_VERIFY_BUDGET_SINCE = (0, 5, 17)


@dataclass(frozen=True)
class Split:
    rest: int  # bytes in the static pool after weights
    mamba_slots: int
    mamba_bytes: int
    verify_bytes: int
    verify_in_static_pool: bool
    kv_tokens_profiled: int
    kv_tokens: int
    running: int
    requested_running: int | None


def _version(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in (text or "0").split(".")[:3])
    except ValueError:
        return (0,)


def mamba_ratio(req: PlanRequest) -> int:
    s = req.settings
    if not s.enable_prefix_caching:
        return 1
    if s.mamba_extra_buffer:
        return MAMBA_RATIO + (2 if s.overlap_schedule else 1)
    return MAMBA_RATIO


def draft_tokens(req: PlanRequest) -> int:
    s = req.settings
    return (s.draft_block_size or s.num_speculative_tokens + 1) if s.speculative_method else 0


def cell_bytes(req: PlanRequest) -> int:
    """KV bytes per token on one rank: the target's full-attention layers plus the draft's layers."""
    s, shape = req.settings, req.shape
    cell = attention_bytes_per_token(shape, s.tp, req.kv_dtype_bytes) * shape.num_full_attention_layers
    if req.draft is not None and s.speculative_method:
        cell += attention_bytes_per_token(req.draft, s.tp, req.kv_dtype_bytes) * req.draft.num_layers
    return cell


def split(req: PlanRequest) -> Split:
    s, shape = req.settings, req.shape
    total = int(req.gpu_memory_gib * GIB)
    frac = s.mem_fraction_static or DEFAULT_MEM_FRACTION_STATIC
    rest = total - req.weights_per_gpu() - req.draft_weights_per_gpu() - int(total * (1 - frac))
    conv, recurrent = mamba_state_bytes(req, 0) if shape.is_hybrid else (0, 0)
    per_req = (conv + recurrent) * shape.num_linear_attention_layers
    ratio, d = mamba_ratio(req), draft_tokens(req)
    requested = s.max_running_requests
    if requested is None and s.speculative_method == "dflash":
        requested = DFLASH_DEFAULT_MAX_RUNNING_REQUESTS
    joint = _version(req.engine_version) >= JOINT_VERIFY_BUDGET_SINCE
    slots, verify = 0, 0
    if per_req:
        if s.max_mamba_cache_size is not None:
            slots = s.max_mamba_cache_size
        elif not s.enable_prefix_caching and requested is not None:
            slots = requested
        else:
            budget = max(rest, 0) * (s.mamba_full_memory_ratio or DEFAULT_MAMBA_FULL_MEMORY_RATIO)
            budget /= 1 + (s.mamba_full_memory_ratio or DEFAULT_MAMBA_FULL_MEMORY_RATIO)
            # One padding slot beside the K request slots (and beside the verify buffer's requests).
            if joint and d:
                slots = int((budget - per_req * (1 + d)) // (per_req * (1 + d / ratio)))
            else:
                slots = int((budget - per_req) // per_req)
        capped = min(requested if requested is not None else slots // ratio, slots // ratio)
        # FACTS 4: the verify buffer holds the recurrent state per draft token; the joint solve
        # reserves the whole per-request state per draft token, padding slot included.
        per_token_state = per_req if joint else recurrent * shape.num_linear_attention_layers
        verify = per_token_state * (max(capped, 0) + (1 if joint else 0)) * d
        rest -= (max(slots, 0) + 1) * per_req + (verify if joint else 0)
    cell = cell_bytes(req)
    profiled = max(rest, 0) // cell if cell else 0
    tokens = min(profiled, s.max_total_tokens) if s.max_total_tokens else profiled
    estimated = max(min(int(tokens / req.max_model_len * 512), 4096), 2048)
    running = min(requested if requested is not None else estimated, tokens // 2)
    if per_req:
        running = min(running, slots // ratio)
    return Split(rest, slots, slots * per_req, verify, joint, profiled, tokens, running, requested)


def plan(req: PlanRequest, suggest: bool = True) -> Plan:
    s, shape = req.settings, req.shape
    sp = split(req)
    frac = s.mem_fraction_static or DEFAULT_MEM_FRACTION_STATIC
    headroom = int(int(req.gpu_memory_gib * GIB) * (1 - frac))
    page = s.block_size or 1
    notes = [
        *req.notes,
        f"static pool = {frac:g} x {req.gpu_memory_gib:g} GiB; headroom {gib(headroom)} for "
        + ("CUDA graphs and activations" if sp.verify_in_static_pool
           else "CUDA graphs, activations and DFlash verify buffers"),
    ]
    if s.mem_fraction_static is None:
        notes.append(f"--mem-fraction-static not set: assumed {DEFAULT_MEM_FRACTION_STATIC}")
    if sp.requested_running is not None and s.max_running_requests is None:
        notes.append(f"DFlash sets --max-running-requests to {DFLASH_DEFAULT_MAX_RUNNING_REQUESTS} when unset")
    if s.speculative_method == "dflash" and req.draft is None and not req.notes:
        notes.append("no draft shape: draft weights and draft KV are not counted (pass --draft-config)")
    if sp.kv_tokens and sp.kv_tokens < req.max_model_len:
        notes.append(f"the KV pool ({sp.kv_tokens:,} tokens) is shorter than the context length "
                     f"({req.max_model_len:,}): the longest request is limited by the pool")
    problems = _check(req, sp, headroom)
    result = Plan(
        engine="sglang", engine_version=req.engine_version, profile=req.profile, model=shape.name,
        draft=req.draft.name if req.draft else None, tp=s.tp, gpu_memory_gib=req.gpu_memory_gib,
        max_model_len=req.max_model_len, weights_bytes=req.weights_per_gpu(),
        draft_weights_bytes=req.draft_weights_per_gpu(), reserve_bytes=req.reserve_bytes,
        kv_bytes_per_token=cell_bytes(req),
        state_bytes_per_sequence=sp.mamba_bytes // sp.mamba_slots if sp.mamba_slots else 0,
        kv_pool_bytes=sp.kv_tokens * cell_bytes(req), block_size=page, page_size_bytes=page * cell_bytes(req),
        num_blocks=sp.kv_tokens // page, blocks_per_request=cdiv(req.max_model_len, page),
        max_concurrency=sp.kv_tokens / req.max_model_len, kv_cache_tokens=sp.kv_tokens,
        problems=problems, notes=notes,
        engine_details={
            "mem_fraction_static": frac,
            "headroom_bytes": headroom,
            "kv_budget_bytes": max(sp.rest, 0),
            "mamba_state_slots": sp.mamba_slots,
            "mamba_state_bytes": sp.mamba_bytes,
            "mamba_ratio": mamba_ratio(req),
            "kv_tokens_profiled": sp.kv_tokens_profiled,
            "max_running_requests": sp.running,
            "requested_running_requests": sp.requested_running,
            "draft_tokens": draft_tokens(req),
            "dflash_verify_buffer_bytes": sp.verify_bytes,
            "dflash_verify_in_static_pool": sp.verify_in_static_pool,
        },
    )
    if problems and suggest:
        result.suggestion = _suggest(req)
    return result


def _check(req: PlanRequest, sp: Split, headroom: int) -> list[Problem]:
    s = req.settings
    weights = req.weights_per_gpu() + req.draft_weights_per_gpu()
    if sp.rest + sp.mamba_bytes + (sp.verify_bytes if sp.verify_in_static_pool else 0) <= 0:
        return [Problem("weights", f"{gib(weights)} of weights per GPU leave nothing in the static pool "
                        f"({s.mem_fraction_static or DEFAULT_MEM_FRACTION_STATIC:g} x {req.gpu_memory_gib:g} GiB)",
                        f"--tp {s.tp * 2} (more GPUs) or a smaller checkpoint")]
    problems: list[Problem] = []
    if req.shape.is_hybrid and sp.running <= 0:
        problems.append(Problem(
            "mamba state cache", f"{sp.mamba_slots} state slots cannot serve one request "
            f"(needs {mamba_ratio(req)} per request)", "raise --mem-fraction-static or --tp"))
    if s.max_total_tokens and sp.kv_tokens_profiled < s.max_total_tokens:
        problems.append(Problem(
            "KV pool", f"{sp.kv_tokens_profiled:,} tokens fit, fewer than --max-total-tokens {s.max_total_tokens:,}",
            "raise --mem-fraction-static, lower --max-total-tokens, or more GPUs (--tp)"))
    elif sp.kv_tokens <= 0:
        problems.append(Problem("KV pool", "no room for any KV token", "raise --mem-fraction-static or --tp"))
    outside = 0 if sp.verify_in_static_pool else sp.verify_bytes
    if req.reserve_bytes + outside > headroom:
        what = "CUDA graphs + activations" + ("" if sp.verify_in_static_pool else " + DFlash verify buffers")
        detail = f"{gib(req.reserve_bytes)}" + ("" if sp.verify_in_static_pool else
                                               f" + {gib(outside)} ({sp.running} requests x {draft_tokens(req)} tokens)")
        problems.append(Problem(what, f"{detail} exceed the {gib(headroom)} headroom outside the static pool",
                                _headroom_fix(req, sp, headroom)))
    return problems


def _headroom_fix(req: PlanRequest, sp: Split, headroom: int) -> str:
    if not sp.verify_in_static_pool and sp.running > 1:
        per_request = sp.verify_bytes // max(sp.running, 1)
        fitting = (headroom - req.reserve_bytes) // per_request if per_request else 0
        if fitting >= 1:
            return f"--max-running-requests {fitting}"
    return "lower --mem-fraction-static or add GPUs (--tp)"


def _suggest(req: PlanRequest) -> str | None:
    """The smallest change that fits: first --mem-fraction-static alone, then more GPUs."""
    s = req.settings
    frac = s.mem_fraction_static or DEFAULT_MEM_FRACTION_STATIC
    for step in range(1, 31):
        for candidate in (round(frac + step / 100, 2), round(frac - step / 100, 2)):
            if 0.3 <= candidate <= 0.95 and plan(req.with_settings(mem_fraction_static=candidate),
                                                  suggest=False).fits:
                return f"--mem-fraction-static {candidate:g}"
    tp = s.tp * 2
    while tp <= 8:
        bigger = PlanRequest(**{**req.__dict__, "gpu_count": max(req.gpu_count, tp)}).with_settings(tp=tp)
        if plan(bigger, suggest=False).fits:
            return f"--tp {tp} ({tp} GPUs of {req.gpu_memory_gib:g} GiB)"
        tp *= 2
    return None
