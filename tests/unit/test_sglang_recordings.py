"""The planner and the exporter against what SGLang 0.5.17 itself logged and counted on the H200s.

Recordings: tests/fixtures/engines/sglang-0.5.17/{tp1,tp2} (README there): the project's tiny Ornith
model with a DFlash draft (block 16) started from `ornith-stack launch-args gpu96` (tp 1) and
`launch-args a100x2` (tp 2). The planner gets the tiny model's config, the draft's, and the GPU memory
SGLang logged before loading the weights; it must reproduce SGLang's own figures from engine.log.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ornith_stack.engines.exposition import parse
from ornith_stack.planner import plan_request, request_for_profile
from ornith_stack.profiles import load_profile

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "engines" / "sglang-0.5.17"
RUNS = {"tp1": "gpu96", "tp2": "a100x2"}
GB = 1 << 30  # SGLang's "GB" in these lines is bytes / 2**30


def logged(run: str) -> dict[str, float]:
    """SGLang's own memory figures from rank 0's lines of the server log."""
    log = (RECORDINGS / run / "engine.log").read_text(errors="replace")

    def first(pattern: str) -> re.Match[str]:
        m = re.search(pattern, log)
        assert m, pattern
        return m

    mamba = first(
        r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+), conv_state size: ([\d.]+)GB, "
        r"ssm_state size: ([\d.]+)GB intermediate_ssm_state_cache size: ([\d.]+)GB"
    )
    sizes = first(r"max_total_num_tokens=(\d+), .*max_running_requests=(\d+)")
    return {
        "avail_before_load_gib": float(first(r"Load weight begin\. avail mem=([\d.]+) GB").group(1)),
        "max_mamba_cache_size": int(mamba.group(1)),
        "mamba_state_gib": float(mamba.group(2)) + float(mamba.group(3)),
        "intermediate_ssm_gib": float(mamba.group(4)),
        "kv_tokens": int(first(r"KV Cache is allocated\. dtype: \S+, #tokens: (\d+)").group(1)),
        "max_total_num_tokens": int(sizes.group(1)),
        "max_running_requests": int(sizes.group(2)),
    }


def tiny_plan(run: str):  # type: ignore[no-untyped-def]
    req = request_for_profile(
        load_profile(RUNS[run]),
        gpu_memory_gib=logged(run)["avail_before_load_gib"],
        model_config=str(RECORDINGS / "target-config.json"),
        draft_config=str(RECORDINGS / "draft-config.json"),
    )
    return plan_request(req)


@pytest.mark.parametrize("run", RUNS)
def test_planner_reproduces_the_logged_pool_and_request_figures(run: str) -> None:
    log, plan = logged(run), tiny_plan(run)
    d = plan.engine_details
    # --max-total-tokens 40960 caps both the target's and the draft's KV pool; 4 requests as asked.
    assert plan.kv_cache_tokens == log["max_total_num_tokens"] == log["kv_tokens"]
    assert d["max_running_requests"] == log["max_running_requests"]
    # No strategy flag: SGLang resolved extra_buffer with the overlap scheduler (server_args in the log).
    assert "mamba_radix_cache_strategy='extra_buffer'" in (RECORDINGS / run / "engine.log").read_text()
    assert (d["mamba_radix_cache_strategy"], d["mamba_ratio"]) == ("extra_buffer", 5)


@pytest.mark.parametrize("run", RUNS)
def test_planner_state_bytes_match_the_logged_mamba_pool(run: str) -> None:
    log, plan = logged(run), tiny_plan(run)
    slots = log["max_mamba_cache_size"] + 1  # the pool's padding slot
    # conv + ssm state of the 3 gated-delta layers per slot: 205,824 B at tp 1, half at tp 2. The log
    # prints two decimals of GB, so the product is checked to its rounding.
    assert plan.state_bytes_per_sequence == (205_824 if run == "tp1" else 102_912)
    assert slots * plan.state_bytes_per_sequence / GB == pytest.approx(log["mamba_state_gib"], abs=0.011)
    # The verify reservation: state x 16 draft tokens x (4 requests + padding slot), inside the pool;
    # the log's intermediate_ssm_state_cache (ssm part of it, 0.01 GB) is what it allocates of that.
    assert plan.engine_details["dflash_verify_buffer_bytes"] == plan.state_bytes_per_sequence * 16 * 5
    d = plan.engine_details
    assert d["mamba_state_bytes"] == (d["max_mamba_cache_size"] + 1) * plan.state_bytes_per_sequence


@pytest.mark.parametrize("run", RUNS)
def test_planner_state_slots_match_the_logged_max_mamba_cache_size(run: str) -> None:
    log, plan = logged(run), tiny_plan(run)
    # The joint solve (K + 1) x state + (4 + 1) x 16 x state = rest x 0.9 / 1.9 gives about 500 slots
    # per GiB of memory here. The log gives the memory in GB with two decimals and does not itemise
    # the ~40 MB SGLang allocates between loading the weights and sizing the pool, so the planner's K
    # is checked to 0.05% (35 slots at tp 1): it was 69,548 vs 69,528 and 130,068 vs 130,060.
    assert plan.engine_details["max_mamba_cache_size"] == pytest.approx(log["max_mamba_cache_size"], rel=5e-4)


@pytest.mark.parametrize("run", RUNS)
def test_exporter_acceptance_equals_sglangs_own(run: str) -> None:
    """The live exporter's acceptance length after the native /generate requests, against SGLang's own
    definition over those requests: completion tokens / verify calls (meta_info.spec_verify_ct)."""
    reqs = json.loads((RECORDINGS / run / "generate.json").read_text())
    own = sum(r["completion_tokens"] for r in reqs) / sum(r["spec_verify_ct"] for r in reqs)
    assert own > 1.2  # the --agree draft gets drafts accepted: the figure is not the trivial 1.0
    exported = parse((RECORDINGS / run / "exporter-metrics-after.txt").read_text())
    assert exported.total("ornith_spec_acceptance_length") == pytest.approx(own, rel=0.01)
    # The same from the engine's counters over the requests (after - idle scrape).
    idle, after = (parse((RECORDINGS / run / f).read_text()) for f in ("metrics-idle.txt", "metrics-after.txt"))
    generated = after.total("sglang:generation_tokens_total") - idle.total("sglang:generation_tokens_total")
    verify = after.total("sglang:spec_verify_calls_total") - idle.total("sglang:spec_verify_calls_total")
    assert generated / verify == pytest.approx(own, rel=1e-9)
