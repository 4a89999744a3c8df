"""Issue 30: computed profiles sized to the card and checked against it, layouts that use every GPU,
restarts that keep their kernels. The figures are the issue's (each case named there) and SGLang's own
logs under tests/fixtures/engines/sglang-0.5.17/."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from ornith_stack import deployment
from ornith_stack.cli import main
from ornith_stack.doctor import GpuInfo, Options, diagnose
from ornith_stack.doctor import gpu as gpu_probe
from ornith_stack.engines.capabilities import runnable_args, unrunnable
from ornith_stack.errors import UserError
from ornith_stack.generate.profile_files import template_context
from ornith_stack.gpus import describe, lookup
from ornith_stack.planner import plan_request, request_for_profile
from ornith_stack.planner.layout import DEFAULT_RECIPE, compute_layout, layout_lines
from ornith_stack.profiles import load_profile
from ornith_stack.sizing.engine_memory import engine_memory
from ornith_stack.stack import preflight

ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = ROOT / "tests" / "fixtures" / "engines" / "sglang-0.5.17"
BIG = "ornith-1.5-122b-dflash2"
SPARK = "ornith-1.0-35b-bf16"
GIB = 1 << 30


# -- 2. plan on what the engine sees ---------------------------------------------------------------


def test_the_h200_memory_steps_are_the_measured_ones() -> None:
    found = engine_memory(140.40, 1)
    # 140.40 total - 0.60 driver - 0.61 CUDA context - 0.10 torch.distributed (all measured) - 0.50 slack.
    assert found.free_gib == pytest.approx(138.59)
    assert "measured on the H200" in found.note() and "slack 0.5 (kept by the caps" in found.note()
    assert engine_memory(140.40, 2).free_gib == pytest.approx(140.40 - 0.60 - 0.61 - 1.01 - 0.50)
    assert "(estimated)" in engine_memory(140.40, 8).note()  # tp 4 and 8 were not measured
    # The doctor's NVML free memory replaces total - driver, and the caps' slack is not taken off again.
    assert engine_memory(140.40, 1, nvml_free_gib=139.80).free_gib == pytest.approx(139.80 - 0.61 - 0.10)


def test_no_negative_count_on_an_80_gib_card(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan gpu96 --gpu-memory-gib 79.65 --json` printed max_mamba_cache_size -2 and max_running_requests -1."""
    assert main(["plan", "gpu96", "--gpu-memory-gib", "79.65", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    numbers = [v for v in data["engine_details"].values() if isinstance(v, int | float) and not isinstance(v, bool)]
    assert min(numbers) >= 0
    assert data["verdict"] == "does not fit" and all(p["fix"] for p in data["problems"])


@pytest.mark.parametrize(("gpu", "count", "would"), [("l40s", 2, "four of them, tp 4, would"),
                                                       ("l4", 4, "eight of them, tp 8, would"),
                                                       ("a10", 4, "eight of them, tp 8, would")])
def test_cards_that_start_no_request_are_refused_with_the_fix(gpu: str, count: int, would: str) -> None:
    """On the memory SGLang finds, L40S x2, L4 x4 and A10 x4 leave no state slot for one request ("state
    cache is too small to serve any requests"): refused, naming the count that starts."""
    with pytest.raises(UserError) as err:
        compute_layout(DEFAULT_RECIPE, lookup(gpu), count, "x")
    assert "no room for one request" in str(err.value) and would in str(err.value)


# -- 1. caps from the card ------------------------------------------------------------------------------


# The 1x H200 caps of the 35B + DFlash: 32 requests, their 160 state slots, and the KV pool left once the weights
# and what SGLang's load adds (RoPE caches, DFlash's fused KV weights) are taken; below the 292,330 tokens SGLang
# profiled at real shapes (realsize-h200/realsize-computed), so the engine logs exactly these.
H200_CAPS = (32, 160, 285_608)


def test_the_one_h200_profile_plans_what_sglang_will_log(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["profiles", "new", "h200one", "--gpu", "h200", "--count", "1", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    args = load_profile("h200one").serve.args
    assert (args["max-running-requests"], args["max-mamba-cache-size"], args["max-total-tokens"]) == H200_CAPS
    assert main(["plan", "h200one", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["engine_details"]
    # The figures of SGLang's "max_total_num_tokens=..., max_running_requests=..." line.
    running, slots, tokens = H200_CAPS
    assert (d["max_total_num_tokens"], d["max_running_requests"], d["max_mamba_cache_size"]) == (tokens, running, slots)
    assert d["running_requests_capped_by"] == "--max-running-requests 32"
    # 33 requests would leave the KV pool shorter than one full-context request.
    assert d["kv_tokens_profiled"] >= 262_144


def test_with_the_tiny_model_the_caps_are_what_sglang_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The lead's GPU run serves the tiny model with the computed profile: on the memory SGLang logged on the
    H200 (139.09 GB before loading) the tiny model's pools exceed both caps, so SGLang logs exactly them."""
    assert main(["profiles", "new", "h200tiny", "--gpu", "h200", "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    req = request_for_profile(load_profile("h200tiny"), engine_memory_gib=139.09,
                              model_config=str(RECORDINGS / "target-config.json"),
                              draft_config=str(RECORDINGS / "draft-config.json"))
    d = plan_request(req).engine_details
    assert d["kv_tokens_profiled"] > H200_CAPS[2] and d["max_total_num_tokens"] == H200_CAPS[2]
    assert d["max_running_requests"] == 32 and d["max_mamba_cache_size"] == 160


def test_the_vllm_pin_is_per_gpu_and_scaled_to_the_tp() -> None:
    """4x RTX 5090: the Spark's 8 GiB pin at tp 4 is refused; a 4 GiB pin holds 416,284 tokens, more than
    the seed's 412,980; the computed profile pins what each GPU has left, at least that."""
    spark = load_profile("spark")
    req = request_for_profile(spark, gpu_memory_gib=31.84, gpu_count=4).with_settings(tp=4)
    assert plan_request(req).problems  # the seed's 8 GiB per GPU does not fit beside the weights
    assert plan_request(req.with_settings(kv_cache_memory_bytes=4 * GIB)).kv_cache_tokens == 416_284
    layout = compute_layout(SPARK, lookup("rtx-5090"), 4, "x")
    pin = layout.profile.serve.args["kv-cache-memory-bytes"]
    assert layout.tp == 4 and isinstance(pin, int) and pin >= 4 * GIB and not layout.plan.problems
    assert layout.plan.kv_cache_tokens > 416_284 > 412_980
    # The Spark (unified memory) keeps its seed's pin.
    assert compute_layout(SPARK, lookup("gb10"), 1, "x").profile.serve.args["kv-cache-memory-bytes"] == 8 * GIB


# -- 3. flags the card can run -----------------------------------------------------------------------------


@pytest.mark.parametrize(("gpu", "count", "dropped"), [
    ("a100-80gb", 4, {"attention-backend", "enable-flashinfer-allreduce-fusion"}),
    ("l40s", 8, {"attention-backend", "enable-flashinfer-allreduce-fusion"}),
    ("rtx-pro-6000", 4, {"enable-flashinfer-allreduce-fusion"}),  # sm120 runs trtllm_mha, not the fusion
])
def test_the_122b_recipe_drops_what_the_card_cannot_run(gpu: str, count: int, dropped: set[str]) -> None:
    layout = compute_layout(BIG, lookup(gpu), count, "x")
    args = layout.profile.serve.args
    assert not dropped & set(args) and not layout.plan.problems
    lines = [line for line in layout.changes if line.startswith("dropped --")]
    assert {re.match(r"dropped --(\S+)", line).group(1) for line in lines} == dropped  # type: ignore[union-attr]
    assert all("this GPU is sm" in line for line in lines)
    backend = next(line for line in layout_lines(layout) if line.startswith("Attention backend"))
    assert ("trtllm_mha" in backend) == ("attention-backend" not in dropped)


def test_plan_and_doctor_refuse_the_gb300_flags_on_an_a100() -> None:
    gb300x2 = load_profile("gb300x2")
    assert {u.flag for u in unrunnable(dict(gb300x2.serve.args), "8.0")} == {
        "attention-backend", "enable-flashinfer-allreduce-fusion"}
    assert unrunnable(dict(gb300x2.serve.args), "10.3") == []
    a100s = [GpuInfo(i, "NVIDIA A100-SXM4-80GB", 80.0, "8.0", "580.65.06", free_gib=79.3) for i in range(4)]
    report = diagnose(Options(profile="gb300x2"), gpus=a100s)
    flags = [f.message for f in report.problems if f.topic == "plan (flags)"]
    assert len(flags) == 2 and all("this GPU is sm80: the engine refuses to start with it" in m for m in flags)


def test_a_dropped_backend_takes_its_page_size_along() -> None:
    kept, lines = runnable_args({"attention-backend": "trtllm_mha", "page-size": 64, "tp-size": 2}, "8.9")
    assert kept == {"tp-size": 2} and len(lines) == 2


def test_blackwell_with_dflash_gets_triton_and_says_so() -> None:
    layout = compute_layout(DEFAULT_RECIPE, lookup("b200"), 1, "x")
    line = next(x for x in layout_lines(layout) if x.startswith("Attention backend"))
    assert "triton (SGLang 0.5.17 on Blackwell: trtllm_mha is not used with DFlash" in line


# -- 4. layouts for throughput ----------------------------------------------------------------------------


def test_eight_l40s_run_two_replicas_of_tp_4() -> None:
    layout = compute_layout(DEFAULT_RECIPE, lookup("l40s"), 8, "x")
    assert (layout.replicas, layout.tp) == (2, 4) and layout.running == 2 * layout.caps.running
    assert any(c.startswith("tp 2: does not start") for c in layout.considered)
    latency = compute_layout(DEFAULT_RECIPE, lookup("l40s"), 8, "x", "latency")
    assert (latency.replicas, latency.tp) == (1, 8) and latency.running < layout.running


def test_an_unknown_layout_objective_is_one_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "new", "x", "--gpu", "h200", "--layout", "fast"]) == 2
    assert "--layout must be one of throughput, latency" in capsys.readouterr().err


# -- 5. host-aware doctor and auto ---------------------------------------------------------------------------


def test_eight_replicas_on_four_gpus_are_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["profiles", "new", "h8", "--gpu", "h200", "--count", "8", "--out", str(tmp_path)]) == 0
    four = [GpuInfo(i, "NVIDIA H200", 140.4, "9.0", "580.159.04", free_gib=139.8) for i in range(4)]
    report = diagnose(Options(profile="h8"), gpus=four)
    (problem,) = report.problems
    assert problem.topic == "gpu count"
    assert "4 GPU(s) on this host, profile 'h8' runs 8 replicas x tp 1 = 8" in problem.message
    assert "ornith-stack profiles new h200x4 --gpu h200 --count 4" in problem.message


def _h200s(n: int) -> list[GpuInfo]:
    return [GpuInfo(i, "NVIDIA H200", 140.4, "9.0", "580.159.04", free_gib=139.8) for i in range(n)]


def test_auto_on_eight_h200_uses_every_gpu() -> None:
    report = diagnose(Options(profile="auto"), gpus=_h200s(8))
    assert report.ready and report.profile == "h200x8" and report.computed is not None
    assert (report.computed.replicas, report.computed.tp) == (8, 1)
    assert "uses 8 of 8 GPU(s); profile 'gpu96' would use 1" in str(report.profile_reason)


def test_up_saves_and_starts_the_profile_auto_computed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(gpu_probe, "probe_gpus", lambda: _h200s(8))
    profile, reason = preflight.choose_profile("auto", tmp_path)
    assert profile.name == "h200x8" and profile.serve.replicas == 8 and "auto computed" in str(reason)
    saved = Path(os.environ["ORNITH_PROFILE_DIR"]) / "h200x8.yaml"
    assert saved.is_file() and (tmp_path / "compose" / "h200x8.yml").is_file()
    # A second auto finds the saved profile: it uses every GPU, nothing is computed again.
    assert diagnose(Options(profile="auto"), gpus=_h200s(8)).computed is None


ONE_CARD = [GpuInfo(0, "NVIDIA H200", 140.4, "9.0", "580.159.04", free_gib=139.8),
            GpuInfo(0, "NVIDIA B200", 179.06, "10.0", "580.159.04"),
            GpuInfo(0, "NVIDIA RTX PRO 6000 Blackwell Server Edition", 95.59, "12.0", "580.159.04")]


@pytest.mark.parametrize("card", ONE_CARD, ids=lambda g: g.name)
def test_auto_on_one_large_card_computes_the_layout_not_the_seeds_caps(card: GpuInfo) -> None:
    """gpu96 fits every one of these cards, but with seed 000's caps (4 running, 40,960 KV tokens): auto takes the
    layout sized to the card and says what it picked and what gpu96 would have served."""
    report = diagnose(Options(profile="auto"), gpus=[card])
    assert report.ready, [f.line() for f in report.problems]
    layout = report.computed
    assert layout is not None and report.profile == layout.profile.name != "gpu96"
    args = layout.profile.serve.args
    assert (args.get("max-running-requests"), args.get("max-total-tokens")) != (4, 40960)
    assert layout.plan.kv_cache_tokens > 40960
    why = str(report.profile_reason)
    assert f"auto computed {layout.profile.name!r} for 1x {card.name}" in why
    assert f"{layout.running} request(s) at once, {layout.plan.kv_cache_tokens:,} KV tokens" in why
    assert "profile 'gpu96' would serve 4 request(s) at once with 40,960 KV tokens" in why


def test_named_gpu96_stays_seed_000_on_an_h200() -> None:
    report = diagnose(Options(profile="gpu96"), gpus=ONE_CARD[:1])
    assert report.profile == "gpu96" and report.computed is None and report.profile_reason is None
    args = load_profile("gpu96").serve.args
    assert (args["max-running-requests"], args["max-total-tokens"], args["mem-fraction-static"]) == (4, 40960, "0.85")


def test_up_on_one_h200_starts_the_computed_profile_and_then_finds_it_saved(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    monkeypatch.setattr(gpu_probe, "probe_gpus", lambda: ONE_CARD[:1])
    profile, reason = preflight.choose_profile("auto", tmp_path)
    assert profile.name == "h200x1" and "auto computed" in str(reason)
    assert (tmp_path / "compose" / "h200x1.yml").is_file()
    again = diagnose(Options(profile="auto"), gpus=ONE_CARD[:1])
    assert again.computed is None and again.profile == "h200x1"
    assert "auto picked 'h200x1'" in str(again.profile_reason)


def test_auto_on_a_gb10_keeps_seed_003s_model() -> None:
    """The computed recipe is another model (Ornith-1.5 in SGLang): spark, seed 003's Ornith 1.0, is not replaced
    by it for serving fewer requests at once."""
    gb10 = GpuInfo(0, "NVIDIA GB10", 121.69, "12.1", "580.173.02", memory_source=gpu_probe.HOST_MEMORY)
    assert diagnose(Options(profile="auto"), gpus=[gb10]).profile == "spark"


# -- 6. the GPU table and described cards ----------------------------------------------------------------------


def test_profiles_new_describes_a_card_the_table_lacks(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "not-yet" / "profiles"  # profiles new makes it
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(folder))
    assert main(["profiles", "new", "mycard", "--gpu", "NVIDIA Future 96GB", "--memory-gib", "95",
                 "--compute-capability", "9.0", "--out", str(tmp_path / "out")]) == 0
    profile = load_profile("mycard")
    assert profile.hardware.gpu is not None and profile.hardware.gpu.models == ["nvml:Future\\ 96GB"]
    one = [GpuInfo(0, "NVIDIA Future 96GB", 95.0, "9.0", "580.159.04", free_gib=94.4)]
    assert diagnose(Options(profile="mycard"), gpus=one).ready
    assert main(["profiles", "new", "x", "--gpu", "h200", "--memory-gib", "95", "--compute-capability", "9.0"]) == 2
    assert "'h200' is in the GPU table" in capsys.readouterr().err
    assert main(["profiles", "new", "x", "--gpu", "Future", "--memory-gib", "95"]) == 2
    assert "needs both --memory-gib and --compute-capability" in capsys.readouterr().err
    with pytest.raises(UserError, match="MAJOR.MINOR"):
        describe("Future", 95, "nine")


# -- 7. compile caches kept -----------------------------------------------------------------------------------


def test_the_compile_cache_is_named_after_the_engine_build() -> None:
    gpu96 = load_profile("gpu96")
    key = deployment.compile_cache_key("sglang", "0.5.17", gpu96.engine.image)
    assert key.startswith("sglang-0-5-17-") and key != deployment.compile_cache_key("sglang", "0.5.21", gpu96.engine.image)
    assert key != deployment.compile_cache_key("sglang", "0.5.17", gpu96.engine.image + "-other")
    compose = yaml.safe_load((ROOT / "compose" / "gpu96.yml").read_text())
    assert f"compile-{key}" in compose["volumes"]
    engine = compose["services"]["engine"]
    assert f"compile-{key}:{deployment.COMPILE_CACHE_PATH}" in engine["volumes"]
    assert all(engine["environment"][k] == v for k, v in deployment.COMPILE_CACHE_ENV.items())
    values = yaml.safe_load((ROOT / "helm" / "ornith" / "values-gpu96.yaml").read_text())
    assert values["compileCache"] == {"key": key, "env": deployment.COMPILE_CACHE_ENV}
    assert template_context(gpu96, "compose")["compile_cache"] == key


def test_the_h200one_fixture_is_what_profiles_new_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """tests/fixtures/computed/h200one.yaml is the profile the GPU run serves (ORNITH_PROFILE_DIR pointed
    there); regenerate with ORNITH_UPDATE_GOLDEN=1 after a deliberate change."""
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(tmp_path / "profiles"))
    assert main(["profiles", "new", "h200one", "--gpu", "h200", "--count", "1", "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    golden = ROOT / "tests" / "fixtures" / "computed" / "h200one.yaml"
    text = (tmp_path / "profiles" / "h200one.yaml").read_text()
    if os.environ.get("ORNITH_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()
