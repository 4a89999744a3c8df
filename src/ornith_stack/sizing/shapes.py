"""Model shapes: a Hub `config.json` read into the numbers the planner needs.

Accepts the composite Qwen3.5 form (`text_config` + `vision_config`, what Ornith publishes), a flat
text config (`Qwen3_5MoeTextConfig`, a Qwen3-style dense or MoE model) and a DFlash draft config
(`DFlashDraftModel`, or DFlash 2's `DFlash2DraftModel` with sliding-window layers: a small dense Qwen3
stack whose embeddings and head come from the target). Fields the config leaves out take the engines'
defaults: no `mamba_ssm_dtype` means the model dtype, no `layer_types` means every layer is full
attention, no `head_dim` means hidden / heads. A shipped config that could not be read from its
published checkpoint names its guessed keys in `_ornith_inferred`: the plan's verdict is then unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ornith_stack.errors import UserError
from ornith_stack.reading import read_json_object

CONFIG_DIR = Path(str(resources.files(__package__))) / "configs"

DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}
LINEAR_ATTENTION = "linear_attention"
# DFlash 2 drafts: windowed attention; SGLang's draft KV pool still holds every token for each layer.
SLIDING_ATTENTION = "sliding_attention"
# Larger than any real model dimension or count (vocabularies reach ~10^6, context ~10^7).
MAX_CONFIG_INT = 1 << 40
FULL_ATTENTION = "full_attention"


def dtype_bytes(name: str, where: str) -> int:
    try:
        return DTYPE_BYTES[str(name).lower().removeprefix("torch.")]
    except KeyError:
        known = ", ".join(sorted(DTYPE_BYTES))
        raise UserError(f"{where}: unknown dtype {name!r}; known: {known}") from None


@dataclass(frozen=True)
class VisionShape:
    depth: int
    hidden_size: int
    intermediate_size: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    num_position_embeddings: int
    num_heads: int = 16
    # Blocks whose output a deepstack merger feeds to the language model (Qwen3-VL: 8, 16, 24; Qwen3.5
    # publishes none, `[]`); None: the config has no such key (each engine then takes its own default).
    deepstack_visual_indexes: tuple[int, ...] | None = None

    @property
    def num_deepstack_mergers(self) -> int:
        """Deepstack mergers the config lists (none when it lists none or has no key)."""
        return len(self.deepstack_visual_indexes or ())

    @property
    def tensor_count(self) -> int:
        """`visual.*` tensors a complete checkpoint stores: 12 per block (norm1/norm2, qkv, proj,
        fc1, fc2, each weight + bias), patch embed weight + bias, position embedding, merger norm +
        fc1 + fc2 (weight + bias), the same 6 for each deepstack merger. 27 blocks -> 333, the count
        seed 003 reports for Ornith 1.0."""
        return 12 * self.depth + 3 + 6 * (1 + self.num_deepstack_mergers)

    def merger_params(self, postshuffle_norm: bool = False) -> int:
        """One patch merger: its norm (over the block width, or over the merged width for a deepstack
        merger's post-shuffle norm), fc1 (merged -> merged) and fc2 (merged -> out), with biases."""
        merged = self.hidden_size * self.spatial_merge_size**2
        norm = 2 * (merged if postshuffle_norm else self.hidden_size)
        return norm + (merged * merged + merged) + (merged * self.out_hidden_size + self.out_hidden_size)

    @property
    def params(self) -> int:
        h, m = self.hidden_size, self.intermediate_size
        patch = self.in_channels * self.temporal_patch_size * self.patch_size**2 * h + h
        block = 4 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * m + m) + (m * h + h)
        deepstack = self.num_deepstack_mergers * self.merger_params(postshuffle_norm=True)
        return patch + self.num_position_embeddings * h + self.depth * block + self.merger_params() + deepstack


@dataclass(frozen=True)
class ModelShape:
    """One language model (target or draft) as the engines see it."""

    name: str
    source: str  # file the shape was read from
    architecture: str
    dtype: str
    hidden_size: int
    vocab_size: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    # Gated-delta (linear attention) layers; zero when the model has none.
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 4
    mamba_ssm_dtype: str | None = None
    # Feed-forward: MoE when num_experts > 0, dense otherwise.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    intermediate_size: int = 0
    attn_output_gate: bool = False
    tie_word_embeddings: bool = False
    mtp_num_hidden_layers: int = 0
    vision: VisionShape | None = None
    # RoPE on this share of head_dim (`partial_rotary_factor`, top level or in rope_parameters); 1: all of it.
    partial_rotary_factor: float = 1.0
    # DFlash drafts: the target's embeddings and head are shared, and an fc reads target layers.
    is_dflash_draft: bool = False
    dflash_target_layers: int = 0
    mask_token_id: int | None = None
    block_size: int | None = None
    quantization: str | None = None
    inferred: tuple[str, ...] = ()  # config keys guessed, not read from the published checkpoint

    # -- layer counts -----------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def num_full_attention_layers(self) -> int:
        return sum(t != LINEAR_ATTENTION for t in self.layer_types)

    @property
    def num_linear_attention_layers(self) -> int:
        return sum(t == LINEAR_ATTENTION for t in self.layer_types)

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head RoPE rotates (the engines' `int(head_dim * partial_rotary_factor)`)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def is_hybrid(self) -> bool:
        return self.num_linear_attention_layers > 0

    @property
    def linear_conv_dim(self) -> int:
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + (
            self.linear_num_value_heads * self.linear_value_head_dim
        )

    # -- parameters (the 122B's total comes out at its published 125,086,497,008 exactly) ----------
    def _ffn_params(self) -> int:
        h = self.hidden_size
        if self.num_experts:
            experts = self.num_experts * 3 * h * self.moe_intermediate_size
            router = self.num_experts * h
            shared = 3 * h * self.shared_expert_intermediate_size + h if self.shared_expert_intermediate_size else 0
            return experts + router + shared
        return 3 * h * self.intermediate_size

    def _full_attention_params(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q = h * self.num_attention_heads * d * (2 if self.attn_output_gate else 1)
        kv = 2 * h * self.num_key_value_heads * d
        o = self.num_attention_heads * d * h
        return q + kv + o + 2 * d  # q_norm, k_norm

    def _linear_attention_params(self) -> int:
        h = self.hidden_size
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        value_dim = self.linear_num_value_heads * self.linear_value_head_dim
        qkvz = h * (2 * key_dim + 2 * value_dim)
        ba = h * 2 * self.linear_num_value_heads
        conv = self.linear_conv_dim * self.linear_conv_kernel_dim
        return qkvz + ba + conv + 2 * self.linear_num_value_heads + self.linear_value_head_dim + value_dim * h

    def _layer_params(self, layer_type: str) -> int:
        mixer = self._linear_attention_params() if layer_type == LINEAR_ATTENTION else self._full_attention_params()
        return mixer + self._ffn_params() + 2 * self.hidden_size

    @property
    def text_params(self) -> int:
        """Language-model parameters without MTP and vision (what a text-only load reads)."""
        h = self.hidden_size
        layers = sum(self._layer_params(t) for t in self.layer_types)
        if self.is_dflash_draft:
            # Embeddings and lm_head come from the target; fc maps the target's hidden states.
            return layers + self.dflash_target_layers * h * h + 2 * h
        embeddings = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return embeddings + layers + h

    @property
    def mtp_params(self) -> int:
        h = self.hidden_size
        per_layer = self._layer_params(FULL_ATTENTION) + 2 * h * h + 3 * h
        return self.mtp_num_hidden_layers * per_layer

    @property
    def vision_params(self) -> int:
        return self.vision.params if self.vision else 0

    @property
    def total_params(self) -> int:
        return self.text_params + self.mtp_params + self.vision_params

    @property
    def weight_bytes_per_param(self) -> float:
        # An FP8 checkpoint stores its linear weights in one byte (plus small scales).
        if self.quantization and "fp8" in self.quantization:
            return 1.0
        return float(dtype_bytes(self.dtype, self.source))

    def loaded_weight_bytes(self) -> int:
        """Bytes an engine loads: text + vision; both vLLM and SGLang skip `mtp.*` when not using it."""
        return int((self.text_params + self.vision_params) * self.weight_bytes_per_param)

    def checkpoint_bytes(self) -> int:
        return int(self.total_params * self.weight_bytes_per_param)


# -- reading ---------------------------------------------------------------------------------------


def shipped_shapes() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def resolve_config_path(path_or_name: str | Path) -> Path:
    """A path to a config.json (or a checkpoint folder holding one), or a shipped shape's name."""
    try:
        path = Path(path_or_name).expanduser()
    except RuntimeError:  # `~nosuchuser`: no such home directory
        raise UserError(f"model config {str(path_or_name)!r}: no home directory for that ~user") from None
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise UserError(f"model config {str(path_or_name)!r} is a folder without a config.json file")
        path = path / "config.json"
    if path.is_file():
        return path
    shipped = CONFIG_DIR / f"{path_or_name}.json"
    if shipped.is_file():
        return shipped
    raise UserError(
        f"model config {str(path_or_name)!r} is neither a file nor a shipped shape; "
        f"shipped: {', '.join(shipped_shapes())}"
    )


def load_shape(path_or_name: str | Path) -> ModelShape:
    path = resolve_config_path(path_or_name)
    return shape_from_config(read_json_object(path), source=str(path), name=Path(path).stem)


def shape_from_config(data: dict[str, Any], source: str = "config.json", name: str = "model") -> ModelShape:
    """Build a shape from a parsed config; a missing or impossible value is a UserError naming the key."""
    nested = data.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else data
    where = f"{source}: text_config" if text is not data else source
    get = _Getter(text, where)
    hidden = get.int("hidden_size", minimum=1)
    heads = get.int("num_attention_heads", minimum=1)
    layers = get.int("num_hidden_layers", minimum=1)
    layer_types = _layer_types(text.get("layer_types"), layers, where)
    hybrid = LINEAR_ATTENTION in layer_types
    dtype = str(
        text.get("dtype") or text.get("torch_dtype") or data.get("dtype") or data.get("torch_dtype") or "bfloat16"
    )
    dtype_bytes(dtype, f"{where}: dtype")
    dflash = data.get("dflash_config") if isinstance(data.get("dflash_config"), dict) else None
    target_layers = (dflash or {}).get("target_layer_ids") or []
    if not isinstance(target_layers, list):
        raise UserError(f"{source}: dflash_config.target_layer_ids must be a list, got {target_layers!r}")
    quant = data.get("quantization_config") or text.get("quantization_config")
    model_type = text.get("model_type")
    linear = {key: get.int(key, minimum=1) if hybrid else 0 for key in (
        "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")}
    return ModelShape(
        name=name,
        source=source,
        architecture=_architecture(data.get("architectures"), source),
        dtype=dtype,
        hidden_size=hidden,
        vocab_size=get.int("vocab_size", minimum=1),
        layer_types=layer_types,
        num_attention_heads=heads,
        num_key_value_heads=get.int("num_key_value_heads", default=heads, minimum=1),
        head_dim=get.int("head_dim", default=_default_head_dim(hidden, heads, where), minimum=1),
        max_position_embeddings=get.int("max_position_embeddings", minimum=1),
        **linear,
        linear_conv_kernel_dim=get.int("linear_conv_kernel_dim", default=4, minimum=1),
        mamba_ssm_dtype=_optional_dtype(text.get("mamba_ssm_dtype"), f"{where}: mamba_ssm_dtype"),
        num_experts=get.int("num_experts", default=0),
        num_experts_per_tok=get.int("num_experts_per_tok", default=0),
        moe_intermediate_size=get.int("moe_intermediate_size", default=0),
        shared_expert_intermediate_size=get.int("shared_expert_intermediate_size", default=0),
        intermediate_size=get.int("intermediate_size", default=0),
        attn_output_gate=bool(text.get("attn_output_gate", str(model_type or "").startswith("qwen3_5"))),
        tie_word_embeddings=bool(data.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        mtp_num_hidden_layers=get.int("mtp_num_hidden_layers", default=0),
        vision=_vision(data.get("vision_config"), f"{source}: vision_config"),
        partial_rotary_factor=_partial_rotary_factor(text, where),
        is_dflash_draft=dflash is not None,
        dflash_target_layers=len(target_layers),
        mask_token_id=(dflash or {}).get("mask_token_id", data.get("ornith_mask_token_id")),
        block_size=_block_size(data, dflash, source),
        quantization=str(quant.get("quant_method")) if isinstance(quant, dict) else None,
        inferred=tuple(str(k) for k in data.get("_ornith_inferred") or ()),
    )


def _block_size(data: dict[str, Any], dflash: dict[str, Any] | None, source: str) -> int | None:
    """DFlash's block: `dflash_config.block_size` when the key is there, else the top-level key (as
    SGLang's `parse_dflash_draft_config` reads it, 0.5.17 and 0.5.21)."""
    if dflash is not None and "block_size" in dflash:
        return _Getter(dflash, f"{source}: dflash_config").int("block_size", default=None, minimum=1)
    return _Getter(data, source).int("block_size", default=None, minimum=1)


def _default_head_dim(hidden: int, heads: int, where: str) -> int:
    if hidden < heads:
        raise UserError(f"{where}: no head_dim and hidden_size {hidden} < num_attention_heads {heads}")
    return hidden // heads


def _layer_types(value: Any, layers: int, where: str) -> tuple[str, ...]:
    """`layer_types`: a list of "full_attention" / "linear_attention", one per layer, at least one full
    attention layer (both engines size their KV cache from those); absent, every layer is full attention."""
    if value is None:
        return (FULL_ATTENTION,) * layers
    if not isinstance(value, list):
        raise UserError(f"{where}: layer_types must be a list, got {type(value).__name__}")
    known = (FULL_ATTENTION, SLIDING_ATTENTION, LINEAR_ATTENTION)
    unknown = sorted({repr(t) for t in value if t not in known})
    if unknown:
        raise UserError(f"{where}: layer_types holds {', '.join(unknown[:3])}; known: {', '.join(known)}")
    if len(value) != layers:
        raise UserError(f"{where}: layer_types has {len(value)} entries but num_hidden_layers is {layers}")
    if all(t == LINEAR_ATTENTION for t in value):
        raise UserError(f"{where}: every layer is linear attention; the planner models models with at least "
                        "one full-attention layer")
    return tuple(value)


def _architecture(value: Any, source: str) -> str:
    if value is None:
        return "unknown"
    if not isinstance(value, list) or not value or not isinstance(value[0], str):
        raise UserError(f"{source}: architectures must be a list of class names, got {value!r}")
    return value[0]


def _optional_dtype(value: Any, where: str) -> str | None:
    if value is None:
        return None
    dtype_bytes(str(value), where)
    return str(value)


def _partial_rotary_factor(text: dict[str, Any], where: str) -> float:
    """`partial_rotary_factor` at the top of the text config, else in rope_parameters (rope_scaling before
    transformers 5), else 1."""
    value = text.get("partial_rotary_factor")
    for key in ("rope_parameters", "rope_scaling"):
        rope = text.get(key)
        if value is None and isinstance(rope, dict):
            value = rope.get("partial_rotary_factor")
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise UserError(f"{where}: partial_rotary_factor must be a number in (0, 1], got {value!r}")
    return float(value)


def _deepstack(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise UserError(f"{where}: deepstack_visual_indexes must be a list of block indexes, got {value!r}")
    return tuple(value)


def _vision(data: Any, where: str) -> VisionShape | None:
    if not isinstance(data, dict):
        return None
    get = _Getter(data, where)
    hidden = get.int("hidden_size")
    return VisionShape(
        depth=get.int("depth"),
        hidden_size=hidden,
        intermediate_size=get.int("intermediate_size"),
        in_channels=get.int("in_channels", default=3),
        patch_size=get.int("patch_size", default=16),
        temporal_patch_size=get.int("temporal_patch_size", default=2),
        spatial_merge_size=get.int("spatial_merge_size", default=2),
        out_hidden_size=get.int("out_hidden_size", default=hidden),
        num_position_embeddings=get.int("num_position_embeddings", default=0),
        num_heads=get.int("num_heads", default=16, minimum=1),
        deepstack_visual_indexes=_deepstack(data.get("deepstack_visual_indexes"), where),
    )


class _Getter:
    """Typed reads from one config mapping; errors name the file and the key."""

    _MISSING = object()

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def int(self, key: str, default: Any = _MISSING, minimum: int = 0) -> Any:
        value = self.data.get(key)
        if value is None:
            if default is self._MISSING:
                raise UserError(f"{self.where}: required key {key!r} is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            what = "a positive integer" if minimum == 1 else "a non-negative integer"
            raise UserError(f"{self.where}: key {key!r} must be {what}, got {value!r}")
        if value > MAX_CONFIG_INT:
            raise UserError(f"{self.where}: key {key!r} is implausibly large ({value})")
        return value
