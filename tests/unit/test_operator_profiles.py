"""Issue 41: profiles an operator would ship. Slack the doctor does not eat, `fits` null when unknown, the
doctor's fix naming the profile's own recipe. The figures are the issue's: a computed 1x H200 profile
(--max-total-tokens 297,361 then, 285,608 since the planner counts what SGLang's load adds to the weights) failed
the doctor with 620 MiB in use on NVML and passed with 600."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ornith_stack.cli import main
from ornith_stack.doctor import GpuInfo, Options, diagnose
from ornith_stack.doctor.report import Report
from ornith_stack.gpus import lookup
from ornith_stack.planner.layout import DEFAULT_RECIPE, compute_layout, layout_lines, recipe_of
from ornith_stack.profiles import load_profile
from ornith_stack.sizing.engine_memory import SLACK_GIB, idle_recording
from ornith_stack.tune.candidates import Axis, axes_for, build, parse_tries, planner_verdict
from ornith_stack.tune.search import outline

BIG = "ornith-1.5-122b-dflash2"
MIB = 1 / 1024  # GiB


def _cards(key: str, count: int, used_mib: float, driver: str = "580.159.04") -> list[GpuInfo]:
    """`count` GPUs of the table's `key`, NVML showing `used_mib` in use on each (as the tests simulate NVML)."""
    gpu = lookup(key)
    name = f"NVIDIA {gpu.nvml[0].replace('.*', '')}"
    free = round(gpu.memory_gib - used_mib * MIB, 4)
    return [GpuInfo(i, name, gpu.memory_gib, gpu.compute_capability, driver, free_gib=free) for i in range(count)]


def _computed(name: str, gpu: str, count: int, tmp_path: Path, *extra: str) -> str:
    assert main(["profiles", "new", name, "--gpu", gpu, "--count", str(count), "--out", str(tmp_path), *extra]) == 0
    return name


def _levels(report: Report, topic: str) -> list[str]:
    return [f.level for f in report.findings if f.topic == topic]


# -- 1. slack that belongs to someone ---------------------------------------------------------------------------


def test_the_idle_h200_is_recorded_as_nvml_showed_it() -> None:
    found = idle_recording("NVIDIA H200", "580.159.04")
    assert found is not None and found.total_mib == 143_771 and found.free_gib == 139.80
    assert found.reserved_gib == pytest.approx(0.60)  # 140.40 total - 139.80 free with no process
    assert found.smi_used_mib == 0  # nvidia-smi's "0MiB / 143771MiB": the driver's share is not counted there
    assert idle_recording("NVIDIA H100 80GB HBM3") is None


def test_620_mib_in_use_on_the_h200_is_ready_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41: 600 MiB used: ready; 620 MiB used: "FAIL plan (KV pool): 297,114 tokens fit, fewer than
    --max-total-tokens 297,361". The caps keep a 0.5 GiB slack that the doctor, planning on NVML, does not take."""
    _computed("h200one", "h200", 1, tmp_path)
    capsys.readouterr()
    assert load_profile("h200one").serve.args["max-total-tokens"] == 285_608  # the caps did not move
    for used in (600, 620):
        report = diagnose(Options(profile="h200one"), gpus=_cards("h200", 1, used))
        assert report.ready and not report.problems, (used, report.problems)
        assert report.plan is not None and report.plan.engine_details["max_total_num_tokens"] == 285_608
    busy = diagnose(Options(profile="h200one"), gpus=_cards("h200", 1, 620))
    (memory,) = [f for f in busy.findings if f.topic == "gpu memory"]
    assert memory.level == "warn" and "620 MiB in use" in memory.message and "within the 512 MiB slack" in memory.message
    assert "gpu memory" not in {f.topic for f in diagnose(Options(profile="h200one"),
                                                          gpus=_cards("h200", 1, 600)).findings}


def test_a_small_shortfall_says_what_sglang_clamps_to_a_large_one_fails(tmp_path: Path) -> None:
    _computed("h200one", "h200", 1, tmp_path)
    # 1.4 GiB in use: 0.8 GiB beyond an idle H200, past the slack: SGLang starts and clamps the pool.
    small = diagnose(Options(profile="h200one"), gpus=_cards("h200", 1, 1400))
    assert small.ready and _levels(small, "plan (clamped)") == ["warn"]
    (clamp,) = [f.message for f in small.findings if f.topic == "plan (clamped)"]
    assert "fewer than --max-total-tokens 285,608: SGLang clamps to" in clamp
    assert 'logs "max_total_tokens=285608 is larger than the profiled value' in clamp
    assert "32 running requests are unchanged" in clamp
    assert small.plan is not None and 262_144 <= small.plan.kv_cache_tokens < 285_608
    # 3 GiB in use: the pool no longer holds one request of the full 262,144-token context: a problem.
    large = diagnose(Options(profile="h200one"), gpus=_cards("h200", 1, 3000))
    assert not large.ready
    (problem,) = [f.message for f in large.findings if f.topic == "plan (KV pool)"]
    assert "fewer than --max-total-tokens 285,608" in problem and "more than 10%" in problem


@pytest.mark.parametrize(("gpu", "count"), [("a100-80gb", 2), ("rtx-pro-6000", 1), ("gb300", 1), ("h200", 1)])
def test_no_refusal_for_the_card_a_profile_was_computed_for(gpu: str, count: int, tmp_path: Path) -> None:
    """The same 10 MiB flip on A100-80, RTX PRO 6000 and GB300: at idle, and with less than the slack in use
    beyond it, the doctor finds the caps."""
    name = _computed(f"{gpu}x{count}", gpu, count, tmp_path)
    for used in (600, 620, 600 + SLACK_GIB * 1024 - 10):
        report = diagnose(Options(profile=name), gpus=_cards(gpu, count, used))
        assert report.ready and not report.problems, (gpu, used, report.problems)
        assert report.plan is not None and not report.plan.warnings


# -- 4. fits is null when the verdict is unknown; the fix names the profile's own recipe -------------------------


def test_plan_json_fits_is_null_when_the_verdict_is_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    """`plan --json` said "fits": false with "verdict": "unknown" and no problem (every DFlash profile)."""
    assert main(["plan", "gpu96", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["verdict"], data["fits"], data["problems"]) == ("unknown", None, [])
    assert main(["plan", "spark", "--json"]) == 0  # seed 003's shapes are all read: it fits
    data = json.loads(capsys.readouterr().out)
    assert (data["verdict"], data["fits"]) == ("fits", True)
    assert main(["plan", "gpu96", "--gpu-memory-gib", "79.65", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert (data["verdict"], data["fits"]) == ("does not fit", False)


def test_the_doctor_offers_the_profiles_own_recipe(tmp_path: Path) -> None:
    """2x H200 with a 4-GPU 122B profile suggested the 35B recipe."""
    name = _computed("big4", "h200", 4, tmp_path, "--model", BIG)
    assert recipe_of(load_profile(name)) == BIG and recipe_of(load_profile("gb300x2")) == BIG
    assert recipe_of(load_profile("a100x2")) == DEFAULT_RECIPE
    report = diagnose(Options(profile=name), gpus=_cards("h200", 2, 600))
    (count,) = [f.message for f in report.findings if f.topic == "gpu count"]
    assert "Ornith-1.5-122B" in count and "35B" not in count and not count.endswith("; ")


# -- 2. a context length -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("recipe", "gpu", "count", "at_64k", "full"), [
    # The issue: 1x RTX PRO 6000 2 running; at 65,536 tokens 8 then, 7 since the planner counts what SGLang's
    # load adds to the weights (RoPE caches, DFlash's fused KV weights: realsize-h200).
    (DEFAULT_RECIPE, "rtx-pro-6000", 1, 7, 2),
    (DEFAULT_RECIPE, "h100-nvl", 1, 6, 1),  # 1x H100 NVL 1; at 65,536 tokens 6
    (BIG, "l40s", 8, 7, 1),  # the 122B on 8x L40S 1; at 65,536 tokens 7
])
def test_the_context_trades_against_running_requests(recipe: str, gpu: str, count: int, at_64k: int,
                                                     full: int) -> None:
    short = compute_layout(recipe, lookup(gpu), count, "x", context_length=65_536)
    assert short.caps.running == at_64k and short.profile.serve.args["context-length"] == 65_536
    assert short.plan.max_model_len == 65_536 and not short.plan.problems
    window = compute_layout(recipe, lookup(gpu), count, "x", context_length=262_144)
    assert window.caps.running == full and "context-length" not in window.profile.serve.args  # the engine's default
    assert dict(short.trade)[262_144] == full and dict(short.trade)[65_536] == at_64k


def test_the_serving_default_keeps_eight_running_requests_or_the_most() -> None:
    pro = compute_layout(DEFAULT_RECIPE, lookup("rtx-pro-6000"), 1, "x")
    assert (pro.context, pro.caps.running) == (32_768, 8)
    assert "the full window is an explicit choice: --context-length 262144" in pro.context_chosen
    h200 = compute_layout(DEFAULT_RECIPE, lookup("h200"), 1, "x")  # the full window already runs 32
    assert (h200.context, h200.caps.running) == (262_144, 32) and "context-length" not in h200.profile.serve.args
    nvl = compute_layout(DEFAULT_RECIPE, lookup("h100-nvl"), 1, "x")  # no context runs 8: the most
    assert nvl.context == 32_768 and nvl.caps.running == max(n for _, n in nvl.trade) == 7


def test_profiles_new_says_the_trade_and_warns_loudly_below_four(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "new", "pro", "--gpu", "rtx-pro-6000", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "8 running requests per replica at 32,768 tokens" in out
    assert "full window 262,144: 2; 131,072: 6; 65,536: 7; 32,768: 8" in out
    assert load_profile("pro").serve.args["context-length"] == 32_768
    assert main(["profiles", "new", "nvl", "--gpu", "h100-nvl", "--context-length", "262144",
                 "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "warning: 1 running request(s) per replica at 262,144 tokens, fewer than 4" in captured.err
    assert "--context-length 131072 runs 4" in captured.err
    assert "--context-length 262144" in (Path(os.environ["ORNITH_PROFILE_DIR"]) / "nvl.yaml").read_text()
    assert main(["plan", "pro"]) == 0
    assert "full window 262,144: 2; 131,072: 6; 65,536: 7; 32,768: 8 (this profile: 32,768)" in \
        " ".join(capsys.readouterr().out.split())
    assert main(["plan", "pro", "--json"]) == 0
    trade = json.loads(capsys.readouterr().out)["context_trade"]
    assert {t["context_length"]: t["running_requests"] for t in trade}[32_768] == 8


@pytest.mark.parametrize("bad", ["0", "-1", "100", "262145", "99999999999999999999"])
def test_a_context_length_outside_the_window_is_one_error(bad: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "new", "bad", "--gpu", "h200", "--context-length", bad, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "--context-length must be from 4,096" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == [] and not (Path(os.environ["ORNITH_PROFILE_DIR"]) / "bad.yaml").exists()


# -- 3. a tuner whose axes move ------------------------------------------------------------------------------------


def _parser_flags(release: str) -> set[str]:
    """The flags SGLang `release`'s own parser defines, read as test_engine_flags.py reads them."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_engine_flags import NOT_IN_PARSER, SGLANG, sglang_parser

    return set(sglang_parser(SGLANG[release])) | {flag for kind, flag in NOT_IN_PARSER if kind == "sglang"}


def test_the_h200_candidates_move_the_running_requests_without_duplicates(tmp_path: Path) -> None:
    """Issue 41: --max-mamba-cache-size stayed pinned, every candidate ran at 32 on the H200 and 11 of 20 were
    duplicates; the speculation-off candidates kept 31.7 GiB of verify buffers that no longer exist."""
    _computed("h200one", "h200", 1, tmp_path)
    profile = load_profile("h200one")
    listed = outline(profile, axes_for(profile))
    assert len({c.key for c in listed}) == len(listed)
    verdicts = {c.name: planner_verdict(c) for c in listed}
    assert verdicts["seed"].running == 32 and verdicts["seed"].kv_tokens == 285_608
    assert len({v.running for v in verdicts.values()}) >= 3  # 8, 18 (SGLang's own), 32
    eight = next(c for c in listed if c.name == "max-running-requests=8").profile.serve.args
    assert (eight["max-running-requests"], eight["max-mamba-cache-size"]) == (8, 40)
    assert verdicts["max-running-requests=8"].running == 8
    assert (verdicts["max-running-requests=8"].kv_tokens or 0) > 285_608  # the state of 24 requests became KV
    # The engine-defaults baseline drops every cap, the state slots included.
    defaults = next(c for c in listed if c.name == "engine defaults").profile.serve.args
    assert not {"max-running-requests", "max-mamba-cache-size", "max-total-tokens"} & set(defaults)
    # Speculation off: the same 32 requests, the verify buffers' memory re-planned into the KV pool.
    off = next(c for c in listed if c.name == "spec-block=0")
    assert off.profile.draft is None and off.profile.serve.args["max-mamba-cache-size"] == 160
    assert verdicts["spec-block=0"].running == 32 and (verdicts["spec-block=0"].kv_tokens or 0) > 7 * 285_608
    # 128 running requests do not fit beside their state on one H200: refused by the planner, not started.
    assert not verdicts["max-running-requests=128"].fits


@pytest.mark.parametrize(("profile_name", "release"), [("h200one", "0.5.17"), ("gb300x2", "0.5.21")])
def test_no_candidate_writes_a_flag_its_release_lacks(profile_name: str, release: str, tmp_path: Path) -> None:
    _computed("h200one", "h200", 1, tmp_path)
    profile = load_profile(profile_name)
    parser = _parser_flags(release)
    for candidate in outline(profile, axes_for(profile)):
        assert set(candidate.profile.serve.args) <= parser, (candidate.name, set(candidate.profile.serve.args) - parser)
    # The old spelling: "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, ..." on 0.5.21.
    assert "cuda-graph-max-bs" not in _parser_flags("0.5.21") and "cuda-graph-max-bs-decode" in parser
    old = Axis("cuda-graph-max-bs", "cuda-graph-max-bs", (32,), cap=True)
    refused = planner_verdict(build(load_profile("gb300x2"), (old,), {"cuda-graph-max-bs": 32}))
    assert not refused.fits and "--cuda-graph-max-bs is not a flag of SGLang 0.5.21" in refused.why
    assert planner_verdict(build(load_profile("gpu96"), (old,), {"cuda-graph-max-bs": 32})).fits


def test_gb300x2_tunes_the_depth_it_speculates_with(capsys: pytest.CaptureFixture[str]) -> None:
    """`tune gb300x2 --try spec-block=8` said "does not speculate": it speculates with --speculative-num-draft-tokens."""
    profile = load_profile("gb300x2")
    (axis,) = axes_for(profile, parse_tries(["spec-block=8"]))
    assert axis.flag == "speculative-num-draft-tokens" and axis.current(profile) == 16
    eight = build(profile, (axis,), {"spec-block": 8}).profile.serve.args
    assert eight["speculative-num-draft-tokens"] == 8 and "speculative-dflash-block-size" not in eight
    assert main(["tune", "gb300x2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "spec-block on --speculative-num-draft-tokens" in out and "nothing started" in out
    assert "spec-block=8: --speculative-num-draft-tokens 8" in out


def test_tune_dry_run_lists_and_starts_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _computed("h200one", "h200", 1, tmp_path)
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    before = set(tmp_path.rglob("*"))
    assert main(["tune", "h200one", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "seed: the profile's flags\n  plan: unknown: 32 running requests, 285,608 KV tokens" in out
    assert "max-running-requests=8: --max-total-tokens" in out and "--max-mamba-cache-size 40" in out
    assert "refused by the planner" in out  # 128 requests
    assert set(tmp_path.rglob("*")) == before  # no tune-results/, nothing written
    assert main(["tune", "h200one"]) == 2
    assert "--slo is required" in capsys.readouterr().err


# -- 6. card-specific: GeForce multi-GPU ---------------------------------------------------------------------------


def test_eight_rtx_4090_get_the_nccl_setting_and_the_doctor_checks_it(tmp_path: Path) -> None:
    layout = compute_layout(DEFAULT_RECIPE, lookup("rtx-4090"), 8, "x")
    assert layout.tp == 8 and layout.profile.serve.env["NCCL_P2P_DISABLE"] == "1"
    assert any(line.startswith("NCCL_P2P_DISABLE=1 in serve.env") for line in layout_lines(layout))
    assert "NCCL_P2P_DISABLE" not in compute_layout(DEFAULT_RECIPE, lookup("h200"), 8, "x").profile.serve.env
    _computed("g8", "rtx-4090", 8, tmp_path)
    geforce = [GpuInfo(i, "NVIDIA GeForce RTX 4090", 23.99, "8.9", "580.95.05", free_gib=23.4, brand="geforce")
               for i in range(8)]
    (ok,) = [f for f in diagnose(Options(profile="g8"), gpus=geforce).findings if f.topic == "nccl"]
    assert ok.level == "ok"
    path = Path(os.environ["ORNITH_PROFILE_DIR"]) / "g8.yaml"
    path.write_text(path.read_text().replace("NCCL_P2P_DISABLE: '1'", "OTHER: '1'"))
    (warn,) = [f for f in diagnose(Options(profile="g8"), gpus=geforce).findings if f.topic == "nccl"]
    assert warn.level == "warn" and "serve.env.NCCL_P2P_DISABLE: '1'" in warn.message
