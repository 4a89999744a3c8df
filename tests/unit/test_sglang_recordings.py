"""The planner and the exporter against what SGLang 0.5.17 itself logged and counted on the H200s.

Recordings: tests/fixtures/engines/sglang-0.5.17/{tp1,tp2,uncapped-tp1} (README there): the project's
tiny Ornith model with a DFlash draft (block 16) started from `ornith-stack launch-args gpu96` (tp 1),
`launch-args a100x2` (tp 2), and gpu96 without --max-total-tokens / --max-running-requests (uncapped-tp1,
driven with the bench's seed 004 method). The planner gets the tiny model's config, the draft's, and
the GPU memory SGLang logged before loading the weights; it must reproduce SGLang's own figures from
engine.log. tp1 and uncapped-tp1 were recorded on 2026-12-01 with the current exporter; tp2's
exporter-metrics files come from the exporter of 2026-11-30 and are not asserted on.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ornith_stack.engines import adapter_for
from ornith_stack.engines.sglang.metrics import ABORT_CALLS
from ornith_stack.exporter.catalogue import CATALOGUE
from ornith_stack.generate import alerts
from ornith_stack.planner import plan_request, request_for_profile
from ornith_stack.profiles import load_profile
from ornith_stack.wire.metrics import parse

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "engines" / "sglang-0.5.17"
RUNS = {"tp1": "gpu96", "tp2": "a100x2"}  # capped by the profiles' --max-total-tokens 40960, 4 requests
UNCAPPED = "uncapped-tp1"  # gpu96's flags without those two caps, --context-length 16384
LIVE_EXPORTER = ("tp1", UNCAPPED)  # recorded with the current exporter
GB = 1 << 30  # SGLang's "GB" in these lines is bytes / 2**30
H200_MIB = 143_771  # nvidia-smi's memory.total of the H200s (machine.txt, machine-h200x1.txt)


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
        load_profile(RUNS.get(run, "gpu96")),
        gpu_memory_gib=H200_MIB / 1024,
        engine_memory_gib=logged(run)["avail_before_load_gib"],  # SGLang sizes from what is free then
        model_config=str(RECORDINGS / "target-config.json"),
        draft_config=str(RECORDINGS / "draft-config.json"),
    )
    if run == UNCAPPED:
        # The context length (16384, over the tiny model's 4096 positions by SGLang's override) enters
        # neither figure: the KV pool is sized from memory and DFlash's 48 requests are asked for.
        req = req.with_settings(max_total_tokens=None, max_running_requests=None)
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
    # The joint solve (K + 1) x state + (4 + 1) x 16 x state = rest x 0.9 / 1.9 gives about 590 slots
    # per GiB of memory here (1,180 at tp 2). The log gives the memory in GB with two decimals, and what
    # SGLang allocates between loading the weights and sizing the pool is counted from the real-size
    # recording (`load_extras`: 55 MB here, most of it the allocator's share measured at real size), so
    # the planner's K is checked to 0.05% (35 slots at tp 1): 69,517 vs 69,528 and 130,005 vs 130,060
    # (69,548 and 130,068 before that share was counted).
    assert plan.engine_details["max_mamba_cache_size"] == pytest.approx(log["max_mamba_cache_size"], rel=5e-4)


def test_planner_predicts_the_uncapped_runs_kv_pool_and_running_requests() -> None:
    """Without --max-total-tokens and --max-running-requests SGLang sizes the KV pool from memory and
    resolves the running requests itself; the planner predicts both (not copies of a flag)."""
    log, plan = logged(UNCAPPED), tiny_plan(UNCAPPED)
    d = plan.engine_details
    assert log["max_total_num_tokens"] == log["kv_tokens"] == 73_192_991  # target and draft pools alike
    # Planned 73,180,100: -0.02% (73,213,372, +0.03%, before SGLang's load extras were counted). The log
    # gives the pre-load memory to two decimals (±5 MiB of ~62 GB of KV budget).
    assert plan.kv_cache_tokens == pytest.approx(log["max_total_num_tokens"], rel=0.01)
    assert plan.kv_cache_tokens == pytest.approx(log["max_total_num_tokens"], rel=5e-4)
    # DFlash asks for 48 when the flag is absent; the clamps (tokens / 2, 69,529 slots / 5) do not bind.
    assert d["requested_running_requests"] == 48
    assert d["max_running_requests"] == log["max_running_requests"] == 48
    assert d["max_mamba_cache_size"] == pytest.approx(log["max_mamba_cache_size"], rel=5e-4)


def _acceptance(metrics: str) -> float:
    exported = parse(metrics)
    return 1 + exported.total("ornith_spec_accepted_tokens_total") / exported.total("ornith_spec_verify_steps_total")


@pytest.mark.parametrize("run", LIVE_EXPORTER)
def test_exporter_acceptance_equals_sglangs_own(run: str) -> None:
    """The live exporter's acceptance (1 + accepted / verify steps) after the native /generate requests,
    against SGLang's own definition over every request so far: completion tokens / verify calls."""
    reqs = json.loads((RECORDINGS / run / "generate.json").read_text())
    own = sum(r["completion_tokens"] for r in reqs) / sum(r["spec_verify_ct"] for r in reqs)
    assert own > 1.2  # the --agree draft gets drafts accepted: the figure is not the trivial 1.0
    idle, after = (parse((RECORDINGS / run / f).read_text()) for f in ("metrics-idle.txt", "metrics-after.txt"))
    generated = after.total("sglang:generation_tokens_total") - idle.total("sglang:generation_tokens_total")
    verify = after.total("sglang:spec_verify_calls_total") - idle.total("sglang:spec_verify_calls_total")
    assert generated / verify == pytest.approx(own, rel=1e-9)
    # The exporter's counters are the engine's since start (its warm-up request included: 8 tokens in 5 steps).
    engine_since_start = after.total("sglang:generation_tokens_total") / after.total("sglang:spec_verify_calls_total")
    assert _acceptance((RECORDINGS / run / "exporter-metrics-after.txt").read_text()) == pytest.approx(
        engine_since_start, rel=1e-9)
    assert engine_since_start == pytest.approx(own, rel=0.01)


def _during(run: str, prefix: str) -> list[str]:
    return [p.read_text() for p in sorted((RECORDINGS / run).glob(f"{prefix}-during-*.txt"))]


def test_current_exporter_reports_decode_every_second_during_generation() -> None:
    """Scraped every second while two 3,000-token generations ran: the exporter's decode counter rises at
    every scrape, while SGLang's finish-time generation counter stands still until a request ends."""
    exporter, engine = _during("tp1", "exporter-metrics"), _during("tp1", "metrics")
    assert len(exporter) == len(engine) >= 5
    decode = [parse(t).total("ornith_decode_tokens_total") for t in exporter]
    assert all(b > a for a, b in zip(decode, decode[1:], strict=False)), decode
    generated = [parse(t).total("sglang:generation_tokens_total") for t in engine]
    assert len(set(generated[:-1])) == 1  # still during the generations; the last scrape saw them end
    running = [parse(t).total("ornith_requests_running") for t in exporter]
    assert max(running) == 2


@pytest.mark.parametrize("run", LIVE_EXPORTER)
def test_exporter_output_is_the_catalogues(run: str) -> None:
    """Every ornith_* family the live exporter wrote is in today's catalogue (the previous exporter's
    ornith_spec_acceptance_length is gone), and the engine's info names SGLang 0.5.17."""
    names = {m.name for m in CATALOGUE}
    wire = {f"{m.name}{suffix}" for m in CATALOGUE for suffix in ("", "_total", "_bucket", "_sum", "_count")}
    for path in sorted((RECORDINGS / run).glob("exporter-metrics-*.txt")):
        families = set(re.findall(r"^(ornith_[a-z0-9_]+)", path.read_text(), re.M))
        assert families and families <= wire, (path.name, sorted(families - wire))
    final = (RECORDINGS / run / "exporter-metrics-final.txt").read_text()
    assert "ornith_spec_acceptance_length" not in names
    assert re.search(r'^ornith_engine_info\{[^}]*engine="sglang",version="0.5.17"', final, re.M)


@pytest.mark.parametrize("run", LIVE_EXPORTER)
def test_chat_return_meta_info_reports_the_requests_own_steps(run: str) -> None:
    """Non-streaming /v1/chat/completions with return_meta_info (what the bench's seed 004 method reads):
    meta_info.spec_verify_ct is the request's own, equal to the engine's counters moving over it."""
    chat = json.loads((RECORDINGS / run / "chat-meta-info.json").read_text())
    meta = chat["choices"][0]["meta_info"]
    before, after = (parse((RECORDINGS / run / f).read_text()) for f in ("metrics-after.txt", "metrics-after-chat.txt"))
    assert after.total("sglang:spec_verify_calls_total") - before.total("sglang:spec_verify_calls_total") == (
        meta["spec_verify_ct"])
    assert meta["completion_tokens"] == chat["usage"]["completion_tokens"] == 200


def test_seed_004_method_ran_with_thinking_and_each_requests_own_steps() -> None:
    """The uncapped run drove the bench's seed 004 method (thinking on, dflash prompt format, sampling
    0.6 / 0.95 / 20, up to 4,096 new tokens): every task's requests carry their own verify steps."""
    bench = json.loads((RECORDINGS / UNCAPPED / "bench" / "bench.json").read_text())
    assert bench["method"] == "seed004" and not bench["interrupted"] and bench["failures"]["count"] == 0
    tasks = bench["suites"]["tasks"]
    assert (tasks["thinking"], tasks["prompt_format"], tasks["max_tokens"]) == (True, "dflash", 4096)
    assert tasks["sampling"] == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert set(tasks["tasks"]) == {"gsm8k", "math500", "humaneval", "mbpp", "mt-bench"}
    for task in tasks["tasks"].values():
        assert [t["concurrency"] for t in task["throughput"]] == [1, 8, 32]
        for sample in task["samples"]:
            extra = sample["extra"]
            # Thinking on: the tiny model never closes its think block, so the reasoning parser keeps it all.
            assert sample["reasoning"] and sample["completion_tokens"] == extra["engine_generation_tokens"]
            assert extra["spec_verify_ct"] == extra["spec"]["steps"] >= 1
            assert extra["acceptance_length"] == pytest.approx(sample["completion_tokens"] / extra["spec_verify_ct"])


CANARY_ABORT = RECORDINGS / "canary-abort"  # issue 33's recording (README there): tests/gpu/abort_run.py


def test_sglangs_abort_counter_appears_at_its_first_abort_and_counts_abort_calls_not_requests() -> None:
    """Why the engine error-ratio SLO reads no failure from SGLang 0.5.17, recorded on the H200: its abort counter
    does not exist before the first abort, and after one `POST /abort_request {"abort_all": true}` that ended four
    streams it reads 1: it counts abort calls, not failed requests (one abort call in an idle hour was a +Inf burn
    and a page, issue 44); eight clients that went away after 0.3 s were not counted (their requests ran on and
    finished)."""
    adapter = adapter_for("sglang")
    before, after, later = (parse((CANARY_ABORT / f).read_text())
                            for f in ("metrics-before.txt", "metrics-after.txt", "engine-metrics-during-canary.txt"))
    assert before.total(ABORT_CALLS) is None
    assert after.total(ABORT_CALLS) == later.total(ABORT_CALLS) == 1
    clients = json.loads((CANARY_ABORT / "clients.json").read_text())
    assert sum(1 for c in clients if c.get("closed_after_s", 99) < 1) == 8 and {"abort_request": 200} in clients
    finished = (after.total(adapter.requests_finished) or 0) - (before.total(adapter.requests_finished) or 0)
    assert finished == 4  # the four ended by abort_all count as finished; the eight dropped ones not yet
    assert adapter.requests_failed == ""
    rule = alerts.bad_share("engine", "5m", [load_profile("gpu96")])
    assert ABORT_CALLS not in rule and "* 0" in rule  # SGLang's requests: no failures, not no data


def test_the_canary_recorded_beside_sglang_writes_every_series_the_dashboard_and_alerts_read() -> None:
    """The exporter with --canary against SGLang 0.5.17 (four runs at a 5 s interval): every canary family of the
    catalogue is there with the target's labels; the tiny random model answers wrongly, so the runs are counted
    `wrong` and `success` (the request completed) is 1 while `correct` is 0."""
    text = (CANARY_ABORT / "exporter-metrics.txt").read_text()
    samples = parse(text)
    canary = [m for m in CATALOGUE if m.name.startswith("ornith_canary_")]
    assert len(canary) == 6
    for metric in canary:
        assert samples.get(metric.name) or samples.get(f"{metric.name}_total"), metric.name
    assert samples.total("ornith_canary_success") == 1 and samples.total("ornith_canary_correct") == 0
    assert samples.by_label("ornith_canary_runs_total", "outcome") == {"correct": 0, "wrong": 4, "failed": 0}
    assert (samples.total("ornith_canary_decode_tokens_per_second") or 0) > 100
    read = set(re.findall(r"ornith_canary_[a-z_]+", alerts_and_dashboards_text()))
    assert {"ornith_canary_success", "ornith_canary_last_run_timestamp_seconds"} <= read
    for name in read:  # what the shipped alerts and dashboards query, the exporter wrote
        assert re.search(rf"^{name}\{{[^}}]*target=", text, re.M), name


def alerts_and_dashboards_text() -> str:
    root = Path(__file__).resolve().parents[2] / "monitoring"
    return "".join(p.read_text() for p in sorted(root.rglob("*")) if p.suffix in (".yml", ".yaml", ".json"))
