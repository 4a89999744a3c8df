"""Write a tiny random DFlash draft (`DFlashDraftModel`, block size 16) for a tiny Ornith checkpoint.

    python3 tests/gpu/make_dflash_draft.py TARGET_DIR OUT_DIR [--layers 2] [--seed 0]

The layout is what vLLM 0.24.0 loads as a DFlash drafter (read in its wheel):
- `architectures: ["DFlashDraftModel"]` -> `vllm/model_executor/models/qwen3_dflash.py`
  (`DFlashQwen3ForCausalLM`), with `model_type: "qwen3"` so transformers builds a `Qwen3Config`
  (`registry.py` maps the name; `transformers_utils/configs/eagle.py` keeps a `DFlash*` arch as is).
- `dflash_config.mask_token_id`: the token the drafter feeds at the 15 masked positions of a block
  (`v1/spec_decode/llm_base_proposer.py` reads it as `parallel_drafting_token_id`).
- `dflash_config.target_layer_ids`: which target layers' outputs feed the drafter; vLLM adds 1 to
  each (`gpu_model_runner._get_eagle3_aux_layers_from_config`, "DFlash's aux layer id semantics"),
  and `fc` takes `len(target_layer_ids) * target_hidden_size` inputs.
- `block_size: 16`, `num_target_layers`: as z-lab's published DFlash configs; vLLM takes the number
  of drafted tokens from `num_speculative_tokens` (15 = block - 1).
- Weights under the checkpoint names `qwen3_dflash.py` loads: `layers.N.*`, `fc`, `hidden_norm`,
  `norm`. No `embed_tokens` and no `lm_head`: like the published drafters, it shares the target's
  (`llm_base_proposer._maybe_share_embeddings` / `_maybe_share_lm_head`).

`--agree` makes greedy drafts partly right, so that the acceptance length moves above 1.0 (a random
draft almost never matches a random target): the draft's final `norm` is zeroed, so its hidden state
is 0, every logit through the shared `lm_head` is 0 and its greedy token is always id 0; and the
TARGET's `lm_head` (rewritten in place) keeps two random rows (AGREE_ROWS, negated) and zeroes the
others, so the target's greedy token is id 0 wherever both rows' logits are negative and one of
AGREE_ROWS elsewhere. Each verify step then accepts the run of id-0 tokens the target would produce:
with transformers on CPU the tiny target alternates between id 0 and the two rows, about 1.5 tokens
per step, varying with the prompt (a single kept row locks into one token: acceptance 1.0 or 16).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

BLOCK_SIZE = 16
AGREE_ROWS = (100, 101)  # the lm_head rows the --agree target keeps, negated (ordinary byte tokens)
MASK_TOKEN_ID_KEY = "ornith_mask_token_id"  # written by ornith_stack.tiny_model


def _text_config(target: Path) -> dict:
    config = json.loads((target / "config.json").read_text())
    return config.get("text_config", config) | {MASK_TOKEN_ID_KEY: config[MASK_TOKEN_ID_KEY]}


def _target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Interior target layers, evenly spread, as z-lab's drafters pick them (first and last 2 kept out)."""
    first, last = 1, max(1, num_target_layers - 2)
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = last - first
    return sorted({round(first + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)})


def draft_config(text: dict, layers: int) -> dict:
    hidden = text["hidden_size"]
    head_dim = text["head_dim"]
    target_layers = _target_layer_ids(text["num_hidden_layers"], layers)
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": BLOCK_SIZE,
        "dflash_config": {"mask_token_id": text[MASK_TOKEN_ID_KEY], "target_layer_ids": target_layers},
        "num_target_layers": text["num_hidden_layers"],
        "target_hidden_size": hidden,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // head_dim,
        "num_key_value_heads": text["num_key_value_heads"],
        "head_dim": head_dim,
        "intermediate_size": 2 * hidden,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": text["rms_norm_eps"],
        "max_position_embeddings": text["max_position_embeddings"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0},
        "vocab_size": text["vocab_size"],
        "tie_word_embeddings": False,
        "bos_token_id": text.get("bos_token_id"),
        "eos_token_id": text.get("eos_token_id"),
        "pad_token_id": text.get("pad_token_id"),
        "torch_dtype": "bfloat16",
        "dtype": "bfloat16",
    }


def draft_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv, inter = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, cfg["intermediate_size"]

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    def ones(n: int) -> torch.Tensor:  # Qwen3 RMSNorm multiplies by w (not 1 + w as Qwen3.5's)
        return torch.ones(n, dtype=torch.bfloat16)

    w: dict[str, torch.Tensor] = {}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        w |= {
            p + "self_attn.q_proj.weight": rand(q, hidden),
            p + "self_attn.k_proj.weight": rand(kv, hidden),
            p + "self_attn.v_proj.weight": rand(kv, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, q),
            p + "self_attn.q_norm.weight": ones(hd),
            p + "self_attn.k_norm.weight": ones(hd),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
            p + "input_layernorm.weight": ones(hidden),
            p + "post_attention_layernorm.weight": ones(hidden),
        }
    n_feat = len(cfg["dflash_config"]["target_layer_ids"])
    w["fc.weight"] = rand(hidden, cfg["target_hidden_size"] * n_feat)
    w["hidden_norm.weight"] = ones(hidden)
    w["norm.weight"] = ones(hidden)
    return w


def agree_target_lm_head(target: Path) -> str:
    """Zero every row of the target's lm_head but AGREE_ROWS, negated (module docstring); returns the shard."""
    from safetensors.torch import load_file

    index = json.loads((target / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["lm_head.weight"]
    tensors = load_file(str(target / shard))
    head = tensors["lm_head.weight"]
    keep = -head[list(AGREE_ROWS)]
    head.zero_()
    head[list(AGREE_ROWS)] = keep
    save_file(tensors, str(target / shard), metadata={"format": "pt"})
    return shard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--agree", action="store_true", help="draft always id 0; target lm_head rewritten in place")
    args = ap.parse_args()
    cfg = draft_config(_text_config(args.target), args.layers)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    weights = draft_weights(cfg, args.seed)
    if args.agree:
        weights["norm.weight"] = torch.zeros_like(weights["norm.weight"])
        print(
            f"--agree: draft norm zeroed; target lm_head keeps rows {AGREE_ROWS} only, negated ({agree_target_lm_head(args.target)})"
        )
    save_file(weights, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    print(
        f"draft: {args.out} target_layer_ids={cfg['dflash_config']['target_layer_ids']} "
        f"mask_token_id={cfg['dflash_config']['mask_token_id']}"
    )


if __name__ == "__main__":
    main()
