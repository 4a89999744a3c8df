"""Every impossible planner, profile and launch-args input is one `error:` line and exit status 2.

Plus a property-based test (hypothesis) over `plan`'s numeric options and over model-config shapes:
whatever the numbers, no traceback, and never "fits" for a request no GPU can hold.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ornith_stack.cli import main
from ornith_stack.errors import UserError
from ornith_stack.planner import PlanOptions, build_request, plan_request
from ornith_stack.profiles import load_profile
from ornith_stack.sizing.shapes import CONFIG_DIR, shape_from_config

PROFILES = Path(load_profile.__code__.co_filename).parent
TARGET = json.loads((CONFIG_DIR / "ornith-1.5-35b-a3b.json").read_text())


def one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI; assert exit 2 and exactly one `error:` line without a traceback; return it."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "gpu96", "--gpu-memory-gib", "nan"], "--gpu-memory-gib must be a finite number"),
        (["plan", "gpu96", "--gpu-memory-gib", "inf"], "--gpu-memory-gib must be a finite number"),
        (["plan", "gpu96", "--gpu-memory-gib", "0"], "--gpu-memory-gib must be positive"),
        (["plan", "gpu96", "--gpu-memory-gib", "-1"], "--gpu-memory-gib must be positive"),
        (["plan", "gpu96", "--gpu-count", "0"], "--gpu-count must be at least 1"),
        (["plan", "a100x2", "--gpu-count", "0"], "--gpu-count must be at least 1"),
        (["plan", "gpu96", "--reserve-gib", "nan"], "--reserve-gib must be a finite number"),
        # Found by hypothesis on a clean checkout: the reserve times GIB overflowed int().
        (["plan", "gpu96", "--reserve-gib", "1.67e299"], "--reserve-gib must be in [0, 1024], got 1.67e+299"),
        (["plan", "gpu96", "--reserve-gib", "97"], "--reserve-gib must be in [0, 96], got 97"),
        (["plan", "gpu96", "--gpu-memory-gib", "1e308"], "--gpu-memory-gib must be in [0.000976562, 1024]"),
        (["plan", "gpu96", "--gpu-memory-gib", "1e-308"], "--gpu-memory-gib must be in [0.000976562, 1024]"),
        (["plan", "gpu96", "--tp", "3", "--gpu-count", "4"], "SGLang refuses it: the model's 16 attention heads"),
        (["plan", "gpu96", "--max-model-len", "262145"], "exceeds the model's max_position_embeddings 262,144"),
        (["plan", "spark", "--max-model-len", "300000"], "exceeds the model's max_position_embeddings 262,144"),
        (["plan", "gpu96", "--mem-fraction-static", "nan"], "--mem-fraction-static must be a finite number"),
        (["launch-args", "gpu96", "--port", "0"], "--port must be a TCP port from 1 to 65535, got 0"),
        (["launch-args", "gpu96", "--port", "70000"], "--port must be a TCP port from 1 to 65535, got 70000"),
        (["launch-args", "gpu96", "--port=-5"], "--port must be a TCP port from 1 to 65535, got -5"),
        (["launch-args", "gpu96", "--set", "serve.args.x=[unclosed"], "--set serve.args.x='[unclosed': not a valid YAML"),
        (["launch-args", "gpu96", "--set", "serve.args.tp-size=two"], "serve.args.tp-size: sglang expects an integer"),
        (["launch-args", "gpu96", "--set", "serve.args.mem-fraction-static=lots"],
         "serve.args.mem-fraction-static: sglang expects a number in (0, 1], got 'lots'"),
        (["launch-args", "spark", "--set", "model.repo=o/n", "--set", "serve.args.gpu-memory-utilization=1.5"],
         "serve.args.gpu-memory-utilization: vllm expects a number in (0, 1]"),
        (["profiles", "show", "gpu96", "--set", "hardware.gpu.memory_gib=.inf"],
         "hardware.gpu.memory_gib: Input should be a finite number"),
    ],
)
def test_impossible_input_is_one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert message in one_error_line(capsys, argv)


def test_a_profile_file_with_infinite_memory_or_worded_flags_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(tmp_path))
    text = (PROFILES / "gpu96.yaml").read_text()
    (tmp_path / "inf.yaml").write_text(text.replace("memory_gib: 96", "memory_gib: .inf"))
    (tmp_path / "words.yaml").write_text(text.replace("tp-size: 1", "tp-size: two"))
    assert "memory_gib: Input should be a finite number" in one_error_line(capsys, ["plan", "inf"])
    assert "serve.args.tp-size: sglang expects an integer >= 1, got 'two'" in one_error_line(
        capsys, ["launch-args", "words"])


def test_a_static_fraction_leaving_no_kv_is_refused_with_sglangs_reason(capsys: pytest.CaptureFixture[str]) -> None:
    # SGLang 0.5.17 `_profile_available_bytes`: "Loaded weights leave no GPU memory for the KV cache
    # under --mem-fraction-static=X. Raise --mem-fraction-static above Y".
    assert main(["plan", "gpu96", "--mem-fraction-static", "0.5", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    (problem,) = data["problems"]
    assert "leave no GPU memory for the KV cache under --mem-fraction-static=0.5" in problem["message"]
    # Against the memory SGLang finds before loading (the total less context, collective start and margin):
    # 1 - available / pre-load memory, what loading took being the weights and what SGLang's load adds.
    d = data["engine_details"]
    weights = (data["weights_bytes"] + data["draft_weights_bytes"] + d["load_extras_bytes"]) / (
        d["memory_before_load_gib"] * (1 << 30))
    assert problem["fix"] == f"--mem-fraction-static above {math.ceil(weights * 1000) / 1000:.3f}"
    assert data["fits"] is False


def _config_case(tmp_path: Path, name: str) -> Path:
    def text(**changes: Any) -> Path:
        data = json.loads(json.dumps(TARGET))
        data["text_config"].update(changes)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        return path

    if name == "folder":
        (tmp_path / "folder").mkdir()
        return tmp_path / "folder"
    if name == "binary":
        path = tmp_path / "binary.json"
        path.write_bytes(bytes(range(256)) * 4)
        return path
    if name == "deep":
        path = tmp_path / "deep.json"
        path.write_text("[" * 100_000 + "]" * 100_000)
        return path
    return {
        "zero-heads": lambda: text(num_attention_heads=0),
        "zero-layers": lambda: text(num_hidden_layers=0, layer_types=[]),
        "head-dim-0": lambda: text(head_dim=0),
        "layer-types-string": lambda: text(layer_types="linear_attention"),
        "all-linear": lambda: text(layer_types=["linear_attention"] * 40),
    }[name]()


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("folder", "is a folder without a config.json file"),
        ("binary", "not UTF-8 text"),
        ("deep", "not valid JSON"),
        ("zero-heads", "'num_attention_heads' must be a positive integer, got 0"),
        ("zero-layers", "'num_hidden_layers' must be a positive integer, got 0"),
        ("head-dim-0", "'head_dim' must be a positive integer, got 0"),
        ("layer-types-string", "layer_types must be a list, got str"),
        ("all-linear", "every layer is linear attention"),
    ],
)
@pytest.mark.parametrize("flag", ["--model-config", "--draft-config"])
def test_a_bad_model_config_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, message: str, flag: str
) -> None:
    path = _config_case(tmp_path, case)
    line = one_error_line(capsys, ["plan", "gpu96", flag, str(path)])
    # Deep nesting is refused by the JSON reader itself ("not valid JSON") or by the depth limit.
    assert message in line or (case == "deep" and "nested deeper than" in line), line


# -- properties -----------------------------------------------------------------------------------------
# Hypothesis runs under the settings profile tests/conftest.py selects (derandomized and database-free in CI).

HOSTILE_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=64),
                           st.sampled_from([0.0, -0.0, 1e-308, 5e-324, 1e308, -1.0, 1.0, 0.5]))
HOSTILE_COUNTS = st.one_of(st.integers(-3, 1 << 40), st.sampled_from([0, -1, 1, 1 << 62]))
# Each field with values a user could plausibly type (None: the profile's own) ...
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "gpu_memory_gib": st.sampled_from([None, 24.0, 48.0, 80.0, 96.0, 141.0, 192.0, 288.0]),
    "reserve_gib": st.sampled_from([None, 0.0, 2.0, 8.0]),
    "mem_fraction_static": st.sampled_from([None, 0.7, 0.8, 0.85, 0.9]),
    "gpu_memory_utilization": st.sampled_from([None, 0.8, 0.9]),
    "gpu_count": st.sampled_from([None, 1, 2, 4, 8]),
    "tp": st.sampled_from([None, 1, 2, 4]),
    "max_model_len": st.sampled_from([None, 4096, 32768, 262144]),
    "max_total_tokens": st.sampled_from([None, 40960, 1 << 20]),
    "max_running_requests": st.sampled_from([None, 1, 4, 48]),
    "kv_cache_memory_bytes": st.sampled_from([None, 4 << 30, 8 << 30]),
    "num_speculative_tokens": st.sampled_from([None, 0, 15]),
}
# ... and the hostile values of the one field a request perturbs.
HOSTILE: dict[str, st.SearchStrategy[Any]] = {
    name: HOSTILE_FLOATS if name in ("gpu_memory_gib", "reserve_gib", "mem_fraction_static",
                                     "gpu_memory_utilization") else HOSTILE_COUNTS
    for name in PLAUSIBLE
}


@st.composite
def mostly_valid_options(draw: st.DrawFn) -> dict[str, Any]:
    """A plausible `plan` request for a shipped profile with exactly one field set to a hostile value."""
    values = {name: draw(strategy) for name, strategy in PLAUSIBLE.items()}
    perturbed = draw(st.sampled_from(sorted(HOSTILE)))
    values[perturbed] = draw(HOSTILE[perturbed])
    profile = draw(st.sampled_from(["gpu96", "a100x2", "spark", "gb300x2"]))
    return {"profile": profile, **values}


def memory_parts_per_gpu(plan: Any) -> int:
    """Bytes a fitting plan places on one GPU: weights, draft, reserve, KV pool and the engine's state pools."""
    details = plan.engine_details
    return (plan.weights_bytes + plan.draft_weights_bytes + plan.reserve_bytes + plan.kv_pool_bytes
            + details.get("mamba_state_bytes", 0) + details.get("dflash_verify_buffer_bytes", 0))


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(options=mostly_valid_options())
def test_plan_options_never_crash_and_never_fit_the_impossible(options: dict[str, Any]) -> None:
    try:
        req = build_request(PlanOptions(**options))
        plan = plan_request(req)
    except UserError:
        event("refused before planning")
        return
    event(f"planned: {'fits' if plan.fits else 'does not fit'}")
    gpu = req.gpu_memory_gib
    assert math.isfinite(gpu) and gpu > 0 and req.gpu_count >= req.settings.tp >= 1
    if plan.fits:
        # A fitting plan never places more on a GPU than the GPU has, nor has no token of KV cache.
        assert memory_parts_per_gpu(plan) <= gpu * (1 << 30)
        assert plan.kv_cache_tokens > 0
        assert json.loads(json.dumps(plan.to_json()))["fits"] is True


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(HOSTILE)), data=st.data())
def test_any_hostile_number_is_refused_or_planned_never_a_crash(field: str, data: st.DataObject) -> None:
    # The CLI path: whatever one option holds, the answer is a plan or one `error:` line, never a traceback.
    value = data.draw(HOSTILE[field])
    try:
        plan_request(build_request(PlanOptions(profile="gpu96", **{field: value})))
    except UserError as exc:
        assert "\n" not in str(exc)


SIZES = st.integers(-2, 1 << 14)
LAYER = st.sampled_from(["full_attention", "linear_attention", "sliding_attention", 3, None])


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hidden=SIZES, heads=SIZES, kv_heads=SIZES, head_dim=st.one_of(SIZES, st.none(), st.just("64")),
    layers=st.integers(-1, 64), layer_types=st.one_of(st.none(), st.lists(LAYER, max_size=64), st.text(max_size=5)),
    linear=st.tuples(SIZES, SIZES, SIZES, SIZES), max_pos=SIZES, vocab=SIZES,
    engine=st.sampled_from(["vllm", "sglang"]), gpu=st.floats(0.5, 4096),
)
def test_model_config_shapes_never_crash_and_never_fit_the_impossible(
    hidden: int, heads: int, kv_heads: int, head_dim: Any, layers: int, layer_types: Any,
    linear: tuple[int, int, int, int], max_pos: int, vocab: int, engine: str, gpu: float,
) -> None:
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "hidden_size": hidden,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "num_hidden_layers": layers,
              "max_position_embeddings": max_pos, "vocab_size": vocab, "layer_types": layer_types,
              "linear_num_key_heads": linear[0], "linear_num_value_heads": linear[1],
              "linear_key_head_dim": linear[2], "linear_value_head_dim": linear[3], "mamba_ssm_dtype": "float32"}
    if head_dim is not None:
        config["head_dim"] = head_dim
    try:
        shape = shape_from_config(config, source="hypothesis.json")
        req = build_request(PlanOptions(engine=engine, model_config="ornith-1.5-35b-a3b", gpu_memory_gib=gpu))
        plan = plan_request(replace(req, shape=shape))
    except UserError:
        return
    if plan.fits:
        assert plan.weights_bytes < gpu * (1 << 30) and plan.kv_cache_tokens > 0
