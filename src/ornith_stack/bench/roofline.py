"""The single-stream decode roofline: how fast decode could go if it only had to read the weights.

Seed 003: "Every generated token re-reads roughly 3B active parameters at two bytes each, and decode on
the Spark is bandwidth-bound." So roofline tok/s = memory bandwidth of the profile's GPUs (summed over
tensor-parallel ranks, each reads its shard) / bytes of active parameters per token. KV-cache and
recurrent-state reads are left out: they are small next to the weights at short prompts, which is
where the decode suite measures.

The model's shape (and its parameter arithmetic) comes from the planner's shipped configs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ornith_stack.errors import UserError
from ornith_stack.profiles.model import Profile


@dataclass(frozen=True)
class Roofline:
    shape: str
    active_params: int
    bytes_per_token: float
    bandwidth_gbps: float  # all GPUs of the profile together
    tok_s: float

    def percent(self, decode_tok_s: float | None) -> float | None:
        return 100.0 * decode_tok_s / self.tok_s if decode_tok_s else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def active_params(shape: Any) -> int:
    """Parameters read per generated token: all of the text model except the experts the router does
    not pick and the input embedding table (a lookup reads one row; the output head is read whole).

    `shape` is a planner `ModelShape`: its `text_params` counts every text weight once."""
    h = shape.hidden_size
    moe_layers = shape.num_layers if shape.num_experts else 0
    idle_experts = max(shape.num_experts - shape.num_experts_per_tok, 0)
    idle = moe_layers * idle_experts * 3 * h * shape.moe_intermediate_size
    input_embedding = 0 if shape.tie_word_embeddings else shape.vocab_size * h
    return int(shape.text_params - idle - input_embedding)


def roofline_from_shape(shape: Any, bandwidth_gbps: float, name: str) -> Roofline:
    params = active_params(shape)
    per_token = params * shape.weight_bytes_per_param
    return Roofline(name, params, per_token, bandwidth_gbps, bandwidth_gbps * 1e9 / per_token)


def roofline_for(profile: Profile) -> tuple[Roofline | None, str]:
    """The profile's roofline, or None and the reason it cannot be computed."""
    gpu = profile.hardware.gpu
    if gpu is None:
        return None, f"profile {profile.name!r} has no GPU, so no memory-bandwidth roofline"
    if not profile.model.shape:
        return None, f"profile {profile.name!r} names no model shape (model.shape)"
    try:
        from ornith_stack.sizing.shapes import load_shape
    except ImportError:
        return None, "the planner's model shapes are not available"
    try:
        shape = load_shape(profile.model.shape)
    except UserError as exc:
        return None, str(exc)
    return roofline_from_shape(shape, gpu.memory_bandwidth_gbps * gpu.count, profile.model.shape), ""
