"""The GPU validation run of SGLang 0.5.17: tp 1 (as gpu96) and tp 2 (as a100x2) on H200s.

On the H200 machine `pytest -m gpu tests/gpu/test_sglang_h200.py` (run_sglang_h200.sh `serve tpN`)
STARTS SGLang from `ornith-stack launch-args PROFILE` plus the overrides tests/gpu/sglang_run.py names,
drives and records it under $ORNITH_GPU_WORK/runs/tpN, then checks the recording. Without -m gpu the
same checks run on the committed recordings (tests/fixtures/engines/sglang-0.5.17/tpN).

What must hold (issue 14): the engine becomes healthy after answering 503 while starting; native
/generate returns meta_info.spec_verify_ct; the finish-time counters equal the per-request sums; the
server log prints the memory lines the planner is checked against; /server_info names the version.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_run  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines" / "sglang-0.5.17"
WORK = Path(os.environ.get("ORNITH_GPU_WORK", "/tmp/ornith-gpu"))
# run -> (profile, sglang_run variant); uncapped-tp1 drops --max-total-tokens / --max-running-requests.
RUNS = {"tp1": ("gpu96", ""), "tp2": ("a100x2", ""), "uncapped-tp1": ("gpu96", "uncapped")}


@pytest.fixture(scope="module")
def live_runs() -> dict[str, Path]:
    return {}


def _record_live(run: str) -> Path:
    out = WORK / "runs" / run
    profile, variant = RUNS[run]
    sglang_run.record(profile, out, str(WORK / "models" / "target"), str(WORK / "models" / "draft"), variant=variant)
    return out


def _params() -> list:
    params = [pytest.param(("fixture", r), id=f"fixture-{r}") for r in RUNS]
    params += [pytest.param(("live", r), id=f"live-{r}", marks=pytest.mark.gpu) for r in RUNS]
    return params


@pytest.fixture(params=_params())
def run_dir(request: pytest.FixtureRequest, live_runs: dict[str, Path]) -> Path:
    kind, run = request.param
    if kind == "live":
        if run not in live_runs:
            live_runs[run] = _record_live(run)
        return live_runs[run]
    path = FIXTURES / run
    if not (path / "summary.json").is_file():
        pytest.skip(f"no recorded run at {path}")
    return path


def _sum(metrics: str, name: str) -> float:
    values = [float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", metrics, re.M)]
    assert values, f"{name} not in /metrics"
    return sum(values)


def test_started_from_launch_args_and_became_healthy(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    codes = [line.split("\t")[1] for line in (run_dir / "health.txt").read_text().splitlines()]
    assert codes[-1] == "200" and "503" in codes  # 503 while starting (once the port is open), then 200
    assert "--speculative-algorithm" in summary["command"] and "DFLASH" in summary["command"]
    added = [f for o in summary["overrides"] for f in o.get("flags", [])]
    assert "--attention-backend" in added and all(o["why"] for o in summary["overrides"])


def test_generate_reports_verify_calls_and_counters_agree(run_dir: Path) -> None:
    reqs = json.loads((run_dir / "generate.json").read_text())
    assert all(r["spec_verify_ct"] and 1 <= r["completion_tokens"] / r["spec_verify_ct"] <= 16 for r in reqs)
    idle, after = ((run_dir / f).read_text() for f in ("metrics-idle.txt", "metrics-after.txt"))
    # Both counters move when a request finishes: over the requests they grow by the per-request sums
    # (the idle scrape already counts SGLang's own warm-up request).
    for name, key in (("generation_tokens_total", "completion_tokens"), ("spec_verify_calls_total", "spec_verify_ct")):
        assert _sum(after, f"sglang:{name}") - _sum(idle, f"sglang:{name}") == sum(r[key] for r in reqs)


def test_log_prints_the_memory_lines(run_dir: Path) -> None:
    log = (run_dir / "engine.log").read_text(errors="replace")
    assert re.search(r"Mamba Cache is allocated\. max_mamba_cache_size: \d+", log)
    assert re.search(r"KV Cache is allocated\. dtype: \S+, #tokens: \d+", log)
    assert re.search(r"max_total_num_tokens=\d+, .*max_running_requests=\d+", log)


def test_server_info_names_the_engine(run_dir: Path) -> None:
    info = json.loads((run_dir / "server_info-after.json").read_text())
    assert info["version"] == "0.5.17"
    assert info["speculative_algorithm"] == "DFLASH"


def test_chat_completion_returns_meta_info(run_dir: Path) -> None:
    """Non-streaming chat with return_meta_info (the route the bench's seed 004 method reads): the answer
    carries the request's own verify steps, and the engine's counters move by exactly its figures."""
    path = run_dir / "chat-meta-info.json"
    if not path.is_file():
        pytest.skip("recorded before the chat route was (the tp 2 recording of 2026-11-30)")
    chat = json.loads(path.read_text())
    meta, usage = chat["choices"][0]["meta_info"], chat["usage"]
    assert meta["spec_verify_ct"] >= 1 and meta["completion_tokens"] == usage["completion_tokens"]
    after, after_chat = ((run_dir / f).read_text() for f in ("metrics-after.txt", "metrics-after-chat.txt"))
    for name, value in (
        ("generation_tokens_total", meta["completion_tokens"]),
        ("spec_verify_calls_total", meta["spec_verify_ct"]),
    ):
        assert _sum(after_chat, f"sglang:{name}") - _sum(after, f"sglang:{name}") == value
