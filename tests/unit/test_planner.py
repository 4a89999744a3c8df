"""The planner's numbers, each checked against where it comes from.

Sources: seed 003 (shared/seeds/003_*.txt: vLLM 0.24 on one DGX Spark), seed 000 (SGLang 0.5.17 on
2x A100 80 GB and one >= 96 GB GPU; "a single 80 GB card is not enough"), the model shapes and the
engines' accounting read in the vLLM 0.24.0 wheel and SGLang's memory code. "Derived" figures follow
vLLM's own formulas with one input changed; the arithmetic is written out next to each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ornith_stack.cli import main
from ornith_stack.engines.base import ServeSettings
from ornith_stack.errors import UserError
from ornith_stack.planner import GIB, PlanRequest, load_shape, plan_profile, plan_request, request_for_profile
from ornith_stack.profiles import load_profile
from ornith_stack.sizing.common import mamba_state_bytes
from ornith_stack.sizing.shapes import shape_from_config

EIGHT_GIB = 8589934592


def spark(**settings: object):
    return plan_profile(load_profile("spark"), setting_overrides=settings)


# -- seed 003: the figures vLLM 0.24 logged on the Spark -----------------------------------------------


def test_spark_matches_the_seed_log() -> None:
    plan = spark()
    # Seed 003: "Setting attention block size to 1056 tokens", "GPU KV cache size: 412,980 tokens",
    # "Maximum concurrency for 262,144 tokens per request: 1.58x".
    assert plan.block_size == 1056
    assert plan.kv_cache_tokens == 412_980
    assert round(plan.max_concurrency, 2) == 1.58
    assert plan.fits


def test_spark_intermediate_figures_match_facts_section_3() -> None:
    plan = spark()
    # vLLM: gated-delta state 49,152 + 2,097,152 = 2,146,304 B; page = 1056 x 2048 = 2,162,688 B;
    # 1 attention + 3 gated-delta groups of 10 layers; 397 blocks for 8 GiB; 249 + 3 = 252 per request.
    assert plan.engine_details["mamba_page_bytes"] == 2_146_304
    assert plan.page_size_bytes == 2_162_688
    assert plan.engine_details["kv_cache_groups"] == {"full_attention": 1, "gated_delta": 3}
    assert plan.num_blocks == 397
    assert plan.blocks_per_request == 252
    # vLLM: full attention 2 x 2 KV heads x 256 x 2 B = 2048 B per token per layer, 10 layers.
    assert plan.kv_bytes_per_token == 20_480
    # SGLang: per-request state 61.4 MiB (30 layers x 2,146,304 B).
    assert plan.state_bytes_per_sequence == 30 * 2_146_304


def test_spark_json_has_the_stable_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "spark", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # The acceptance line: block_size 1056, kv_cache_tokens 412980, max_concurrency 1.58.
    assert {k: data[k] for k in ("block_size", "kv_cache_tokens", "max_concurrency", "fits")} == {
        "block_size": 1056, "kv_cache_tokens": 412980, "max_concurrency": 1.58, "fits": True}
    assert {"num_blocks", "blocks_per_request"} <= data.keys()


def test_general_form_reproduces_the_spark_profile(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--engine", "vllm", "--model-config", "ornith-1.0-35b", "--gpu-memory-gib", "114",
            "--kv-cache-memory-bytes", str(EIGHT_GIB), "--max-model-len", "262144",
            "--no-enable-prefix-caching", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["block_size"], data["num_blocks"], data["kv_cache_tokens"]) == (1056, 397, 412980)


def test_four_gib_pin_cannot_hold_one_full_length_request() -> None:
    plan = spark(kv_cache_memory_bytes=4 * GIB)
    assert not plan.fits
    (problem,) = plan.problems
    # Seed 003: "5.xx GiB KV cache is needed, which is larger than the available KV cache memory
    # (4.0 GiB)". Here: 10 layers x 2,162,688 B x 252 pages = 5,449,973,760 B = 5.08 GiB.
    assert plan.engine_details["memory_for_one_request_bytes"] == 5_449_973_760
    assert "5.08 GiB" in problem.message and "4.00 GiB" in problem.message
    # The fix the seed recommends: a bigger pin.
    assert "--kv-cache-memory-bytes 5449973760" in problem.fix


# -- flags move the numbers as vLLM would (its formulas with one input changed) -------------------------


def test_prefix_caching_costs_one_page_per_gated_delta_group() -> None:
    plan = spark(enable_prefix_caching=True)
    # "align" mode: 2 pages per gated-delta group -> 249 + 3 x 2 = 255; 397 / 255 = 1.557.
    assert plan.engine_details["mamba_cache_mode"] == "align"
    assert plan.blocks_per_request == 255
    assert round(plan.max_concurrency, 2) == 1.56
    assert plan.kv_cache_tokens == int(397 / 255 * 262144)


def test_fp8_kv_halves_attention_bytes() -> None:
    plan = spark(kv_cache_dtype="fp8")
    # 1024 B per token per layer: block = 16 x ceil(2,146,304 / 16,384) = 2096, page = 2,146,304 B,
    # 8 GiB // page // 10 = 400 blocks, ceil(262144 / 2096) + 3 = 129 per request.
    assert plan.kv_bytes_per_token == 10_240
    assert (plan.block_size, plan.num_blocks, plan.blocks_per_request) == (2096, 400, 129)
    assert plan.kv_cache_tokens > 1.9 * 412_980


def test_tensor_parallel_two_halves_every_per_rank_figure() -> None:
    plan = plan_profile(load_profile("spark"), gpu_count=2, setting_overrides={"tp": 2})
    # 1 KV head per rank (1024 B), state (3 x 4096 x 2) + (16 x 128 x 128 x 4) = 1,073,152 B:
    # block stays 1056, page halves to 1,081,344 B, so 8 GiB holds 794 blocks.
    assert plan.block_size == 1056
    assert plan.num_blocks == 794
    assert round(plan.max_concurrency, 2) == 3.15
    assert plan.weights_bytes == spark().weights_bytes // 2


def test_speculative_tokens_grow_the_state_and_the_request() -> None:
    plan = spark(num_speculative_tokens=15, speculative_method="ngram")
    # Conv state gains 15 rows: (3 + 15) x 8192 x 2 = 294,912 B -> state 2,392,064 B,
    # block = 16 x ceil(2,392,064 / 32,768) = 1168; per request 225 + 3 x (1 + 15) = 273.
    assert plan.engine_details["mamba_page_bytes"] == 2_392_064
    assert (plan.block_size, plan.num_blocks, plan.blocks_per_request) == (1168, 359, 273)


def test_a_dflash_draft_in_vllm_adds_its_own_layer_group() -> None:
    plan = plan_profile(load_profile("spark"), draft_config="qwen3.5-35b-a3b-dflash",
                        setting_overrides={"speculative_method": "dflash", "num_speculative_tokens": 15,
                                           "max_model_len": 65536})
    # kv_cache_utils grouping: 10 full, 30 gated-delta and 8 draft layers (a KV layout of its own) ->
    # group size 8 (the smallest count; 30 >= 1.5 x 8): 2 + 4 + 1 groups.
    assert plan.engine_details["kv_cache_groups"] == {"full_attention": 2, "gated_delta": 4, "draft_attention": 1}
    # Per request: 2 x ceil(65536/1168) + 4 x (1 + 15) + ceil(65536/1168) pages.
    assert plan.blocks_per_request == 2 * 57 + 4 * 16 + 57


# -- SGLang: seed 000's verdicts ----------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["a100x2", "gpu96"])
def test_seed_000_setups_fit(profile: str) -> None:
    plan = plan_profile(load_profile(profile))
    # No problem; the verdict is unknown because the draft's shape is inferred, not read (its config).
    assert not plan.problems and plan.verdict == "unknown", [p.line() for p in plan.problems]
    assert "qwen3.5-35b-a3b-dflash" in plan.unknowns[0] and "guessed" in plan.unknowns[0]
    # --max-total-tokens 40960 caps the pool; --max-running-requests 4 is not clamped further.
    assert plan.kv_cache_tokens == 40_960
    assert plan.engine_details["max_running_requests"] == 4


def test_sglang_state_and_verify_buffers_match_facts_section_4() -> None:
    plan = plan_profile(load_profile("gpu96"))
    d = plan.engine_details
    # SGLang: per-request state 61.4 MiB at TP1 (30 gated-delta layers: conv 3 x 8192 bf16 + recurrent
    # 32 x 128 x 128 fp32).
    assert plan.state_bytes_per_sequence == 64_389_120
    # SGLang 0.5.17 `_handle_max_mamba_cache`: the verify buffers hold the whole per-request state per
    # draft token for the running requests plus the pool's padding slot, inside the static pool.
    assert d["dflash_verify_buffer_bytes"] == 64_389_120 * (4 + 1) * 16
    # `auto` resolves to extra_buffer for Qwen3.5 with the overlap scheduler: 3 + 2 slots per request.
    assert (d["mamba_radix_cache_strategy"], d["mamba_ratio"]) == ("extra_buffer", 5)
    # The state slots K solve (K + 1) s + (K / 5 + 1) 16 s = rest x 0.9 / 1.9.
    s, rest = 64_389_120, d["static_pool_rest_bytes"]
    assert d["max_mamba_cache_size"] == int((rest * 0.9 / 1.9 - s * 17) // (s * (1 + 16 / 5)))
    assert d["mamba_state_bytes"] == (d["max_mamba_cache_size"] + 1) * s
    # SGLang: KV cell 20,480 B/token at TP1, scaled by (10 + 8 draft layers) / 10 for DFlash.
    assert plan.kv_bytes_per_token == 20_480 * 18 // 10


def test_one_80_gib_card_does_not_fit_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    # Seed 000: "A single 80 GB card is not enough for the bf16 weights: at ~73 GB they leave too
    # little for the state cache and graphs"; its fix is the two-GPU setup.
    assert main(["plan", "gpu96", "--gpu-memory-gib", "80", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] is False
    components = {p["component"] for p in data["problems"]}
    # Planned on the 78.19 GiB the engine finds (CUDA context, collective start and margin taken off): the
    # weights (66.28 GiB, target + draft) and what SGLang's load adds (0.40 GiB of RoPE caches, DFlash's fused
    # KV weights, the allocator's share) exceed the static pool's 0.85 x 78.19 = 66.46 GiB, so SGLang stops
    # before sizing any pool ("Loaded weights leave no GPU memory for the KV cache").
    assert components == {"weights"}
    assert all(p["fix"] for p in data["problems"])
    assert data["suggestion"].startswith("--tp 2")


def test_dflash_default_of_48_running_requests_is_clamped_by_the_state_slots() -> None:
    # Without --max-running-requests DFlash asks for 48; SGLang clamps it to state slots / 5.
    req = request_for_profile(load_profile("gpu96"), gpu_memory_gib=141)
    plan = plan_request(req.with_settings(max_running_requests=None))
    d = plan.engine_details
    assert d["requested_running_requests"] == 48
    assert d["max_running_requests"] == d["max_mamba_cache_size"] // 5 < 48
    assert any("DFlash sets --max-running-requests to 48" in n for n in plan.notes)


def test_gb300x2_counts_its_draft_and_calls_the_guessed_shape_unknown(tmp_path: Path) -> None:
    plan = plan_profile(load_profile("gb300x2"))
    # trtllm_mha pages are 64 tokens (SGLang forces them); the DFlash 2 draft's weights and KV count.
    assert (plan.block_size, plan.engine_details["page_size"]) == (64, 64)
    assert plan.kv_cache_tokens % 64 == 0 and plan.draft == "ornith-1.5-122b-dflash2"
    assert plan.draft_weights_bytes > 0.5 * GIB and plan.engine_details["dflash_verify_buffer_bytes"] > 0
    # 0.5.21 adds the draft's own KV: 12 target layers x 1 KV head x 256 x 2 x 2 B + 5 x 4 x 128 x 2 x 2 B.
    assert plan.kv_bytes_per_token == 12 * 1024 + 5 * 2048
    # No problem found, but the draft's shape is DFlash 2's published form, not this checkpoint's own.
    assert not plan.problems and plan.verdict == "unknown" and not plan.fits
    assert "guessed" in plan.unknowns[0] and plan.to_json()["verdict"] == "unknown"
    assert any("--enable-flashinfer-allreduce-fusion is deprecated in SGLang 0.5.21" in n for n in plan.notes)
    # The same numbers read from a checkpoint's own config give a verdict.
    read = json.loads(Path(load_shape("ornith-1.5-122b-dflash2").source).read_text())
    del read["_ornith_inferred"]
    (tmp_path / "config.json").write_text(json.dumps(read))
    known = plan_profile(load_profile("gb300x2"), draft_config=str(tmp_path))
    assert known.verdict == "fits" and known.kv_cache_tokens == plan.kv_cache_tokens
    # The 122B is about 250 GB of BF16 and does not fit one GPU.
    single = plan_profile(load_profile("gb300x2"), setting_overrides={"tp": 1})
    assert single.verdict == "does not fit"
    assert single.problems[0].component == "weights"


# -- shapes: the published configs --------------------------------------------------------------------


def test_shipped_shapes_match_the_published_parameter_counts() -> None:
    # Published: 35,951,822,704 and 125,086,497,008 parameters; seed 003: 333 visual.* tensors.
    big, small = load_shape("ornith-1.5-122b"), load_shape("ornith-1.5-35b-a3b")
    assert small.total_params == 35_951_822_704
    assert big.total_params == 125_086_497_008
    assert small.vision.tensor_count == 333
    assert (small.num_full_attention_layers, small.num_linear_attention_layers) == (10, 30)
    # vLLM skips the MTP weights and logs about 65.5 GiB loaded (seed 003: 65.40 GiB checkpoint).
    assert round(small.loaded_weight_bytes() / GIB, 1) == 65.4


def test_flat_text_config_and_defaults() -> None:
    composite = json.loads(Path(load_shape("ornith-1.5-35b-a3b").source).read_text())
    flat = dict(composite["text_config"])
    del flat["mamba_ssm_dtype"]
    shape = shape_from_config(flat, source="flat.json")
    assert shape.vision is None and (shape.num_full_attention_layers, shape.num_linear_attention_layers) == (10, 30)
    req = PlanRequest(engine="vllm", engine_version=None, shape=shape, settings=ServeSettings(),
                      gpu_memory_gib=100, gpu_count=1)
    # No mamba_ssm_dtype: the recurrent state takes the model dtype (bf16), half of the fp32 state
    # 2,097,152 B; the conv state (3 x 8192 x 2 = 49,152 B) is unchanged.
    assert mamba_state_bytes(req, 0) == (49_152, 1_048_576)


def test_missing_config_key_names_the_file_and_key(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"text_config": {"hidden_size": 8}}))
    with pytest.raises(UserError, match=r"config.json: text_config: required key 'num_attention_heads'"):
        load_shape(str(path))


# -- impossible flags --------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "message"), [
    (["plan", "spark", "--gpu-memory-gib", "-1"], "--gpu-memory-gib must be positive"),
    (["plan", "a100x2", "--mem-fraction-static", "1.5"], "--mem-fraction-static must be in (0, 1]"),
    (["plan", "spark", "--kv-cache-memory-bytes", "-5"], "--kv-cache-memory-bytes must be positive"),
    (["plan", "spark", "--tp", "0"], "--tp must be at least 1"),
    (["plan", "spark", "--gpu-count", "1", "--tp", "2"], "--tp 2 needs 2 GPUs"),
    (["plan", "cpu-demo"], "runs without a GPU"),
    (["plan", "--engine", "vllm", "--model-config", "no-such-shape", "--gpu-memory-gib", "80"],
     "neither a file nor a shipped shape"),
])
def test_impossible_input_is_one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                            message: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
