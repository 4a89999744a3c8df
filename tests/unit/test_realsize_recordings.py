"""The Ornith 35B at its real shapes on one H200, as recorded (issue 40).

Recording: tests/fixtures/engines/sglang-0.5.17/realsize-h200/ (README beside it), made by
`tests/gpu/run_sglang_h200.sh realsize PART` (tests/gpu/realsize_run.py): SGLang 0.5.17 with `--load-format dummy`
(random weights of the real shapes) and DFlash's acceptance simulated (SGLANG_SIMULATE_ACC_LEN). These tests
rebuild the committed table from the recorded files alone (health, engine log, the bench's JSON) and hold the
planner to the engine's own sizing lines at real size.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from ornith_stack.planner import plan_request, request_for_profile
from ornith_stack.profiles import from_data
from ornith_stack.sizing.model import PlanRequest

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "fixtures" / "engines" / "sglang-0.5.17" / "realsize-h200"
sys.path.insert(0, str(ROOT / "gpu"))
import realsize_run  # noqa: E402

GIB = 1 << 30


def test_the_committed_table_is_rebuilt_from_the_recorded_runs() -> None:
    assert (RUN / "table.md").read_text() == realsize_run.table(RUN)


def test_the_planner_predicts_the_engines_sizing_at_real_shapes() -> None:
    """The plan recorded beside the run (`plan.json`, the planner of then): running requests and state slots to
    the unit; the KV pool 1.72% above what the engine made (SGLang's load took 0.58 GiB more than the weights it
    counted; see the next test): SGLang clamped to its own figure with a warning, inside the doctor's stated
    slack. Held at 2%: the record of what that profile was planned with."""
    computed = RUN / "realsize-computed"
    planned = json.loads((computed / "plan.json").read_text())["engine_details"]
    logged = realsize_run.recorded(computed / "cold")["sizing"]
    assert set(logged) == {"max_total_num_tokens", "max_running_requests", "max_mamba_cache_size"}
    assert planned["max_running_requests"] == logged["max_running_requests"] == 32
    assert planned["max_mamba_cache_size"] == logged["max_mamba_cache_size"] == 160
    error = (planned["max_total_num_tokens"] - logged["max_total_num_tokens"]) / logged["max_total_num_tokens"]
    assert 0 <= error <= 0.02, error


def recorded_request(cold: Path) -> PlanRequest:
    """The recorded profile planned on the memory SGLang logged before loading, with the shapes the engine was
    given. Its config.json was the tiny checkpoint's with the shape files' structural keys laid over it: the
    vision config had no deepstack_visual_indexes then (the published Qwen3.5 config, which the shipped shape
    now carries, lists none), so SGLang built its default three deepstack mergers."""
    profile = from_data(yaml.safe_load((cold.parent / "profile.yaml").read_text()), cold.parent / "profile.yaml")
    log = (cold / "engine.log").read_text(errors="replace")
    before_load = re.search(r"Load weight begin\. avail mem=([\d.]+) GB", log)
    assert before_load, "no pre-load memory in the log"
    req = request_for_profile(profile, engine_memory_gib=float(before_load.group(1)))
    assert req.shape.vision is not None and req.shape.vision.deepstack_visual_indexes == ()
    return replace(req, shape=replace(req.shape, vision=replace(req.shape.vision, deepstack_visual_indexes=None)))


def test_the_planner_sizes_the_kv_pool_sglang_profiled_at_real_shapes() -> None:
    """From the 139.07 GiB SGLang found before loading, its KV pool: 0.85 x 139.07 less what loading took
    (66.86 GiB: the weights the planner counted, 66.28, plus RoPE caches grown to the context, the three deepstack
    mergers, DFlash's fused KV weights and the segment they pin, the allocator's share), less 161 state slots and
    33 x 16 verify buffers of 61.4 MiB, in 36,864-byte tokens: 292,330. Within 1% (the planner that counted the
    weights alone made 309,245, clamped by --max-total-tokens to 297,361: +1.72%)."""
    cold = RUN / "realsize-computed" / "cold"
    logged = realsize_run.recorded(cold)["sizing"]
    plan = plan_request(recorded_request(cold))
    d = plan.engine_details
    assert (
        (d["max_running_requests"], d["max_mamba_cache_size"])
        == (logged["max_running_requests"], logged["max_mamba_cache_size"])
        == (32, 160)
    )
    assert (d["mamba_state_bytes"], d["dflash_verify_buffer_bytes"]) == (161 * 64_389_120, 33 * 16 * 64_389_120)
    assert plan.kv_bytes_per_token == 36_864
    # Below the profile's --max-total-tokens 297,361, as SGLang's own figure was: the pool is the profiled one.
    assert plan.kv_cache_tokens == d["max_total_num_tokens"] == d["kv_tokens_profiled"] < 297_361
    assert plan.kv_cache_tokens == pytest.approx(logged["max_total_num_tokens"], rel=0.01)
    assert plan.kv_cache_tokens == pytest.approx(logged["max_total_num_tokens"], rel=0.002)  # 292,497: +0.06%
    # What loading took besides the weights: 0.57 GiB of the 0.58 SGLang's own figures imply.
    assert d["load_extras_bytes"] / GIB == pytest.approx(0.575, abs=0.005)


def test_the_computed_profile_serves_more_as_streams_rise_without_errors() -> None:
    serving = realsize_run.recorded(RUN / "realsize-computed" / "warm")["serving"]
    rates = [serving[level]["output_tok_s"] for level in ("1", "8", "32")]
    assert rates == sorted(rates) and all(serving[level]["errors"] == 0 for level in serving), serving


def test_dflash_at_seed_000s_acceptance_beats_no_speculation_at_one_stream() -> None:
    seed = RUN / "realsize-seed000"
    base = realsize_run.recorded(seed / "base")["decode_tok_s"]
    for name in ("dflash-6.1", "dflash-7.7"):
        if (seed / name).is_dir():
            figures = realsize_run.recorded(seed / name)
            assert figures["decode_tok_s"] > base, (name, figures["decode_tok_s"], base)
            assert figures["acceptance"] == pytest.approx(float(name.split("-")[1]), rel=0.05)
