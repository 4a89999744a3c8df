"""Arithmetic both engines' accountings share: per-token attention KV and per-sequence gated-delta state.

vLLM (`gated_delta_net_state_shape`) and SGLang (`Qwen3_5` mamba2 cache params) size these alike.
"""

from __future__ import annotations

from ornith_stack.sizing.model import PlanRequest
from ornith_stack.sizing.shapes import ModelShape, dtype_bytes


def attention_bytes_per_token(shape: ModelShape, tp: int, kv_bytes: int) -> int:
    """2 (K and V) x KV heads on this rank x head_dim x dtype; vLLM replicates KV heads when tp > heads."""
    return 2 * max(1, shape.num_key_value_heads // tp) * shape.head_dim * kv_bytes


def mamba_state_bytes(req: PlanRequest, num_spec: int) -> tuple[int, int]:
    """(conv, recurrent) state bytes of one gated-delta layer for one sequence on one rank."""
    shape, tp = req.shape, req.settings.tp
    conv = (shape.linear_conv_kernel_dim - 1 + num_spec) * (shape.linear_conv_dim // tp) * req.model_dtype_bytes
    ssm_dtype = req.settings.mamba_ssm_cache_dtype
    if ssm_dtype in (None, "auto"):
        ssm_dtype = shape.mamba_ssm_dtype or req.model_dtype
    recurrent = (shape.linear_num_value_heads // tp) * shape.linear_value_head_dim * shape.linear_key_head_dim
    return conv, recurrent * dtype_bytes(ssm_dtype, "mamba_ssm_dtype")


def tp_divisibility(shape: ModelShape, tp: int) -> list[tuple[str, int]]:
    """(what, count) of every head count that tensor parallelism `tp` does not divide evenly."""
    checks = [("attention heads", shape.num_attention_heads)]
    if shape.is_hybrid:
        checks += [
            ("linear-attention key heads", shape.linear_num_key_heads),
            ("linear-attention value heads", shape.linear_num_value_heads),
        ]
    return [(what, n) for what, n in checks if n % tp]
