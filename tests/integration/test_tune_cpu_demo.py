"""`ornith-stack tune cpu-demo --launch local`: three candidates on a real vLLM on CPU, then a resumed run.

Each candidate is a fresh engine (the tiny Qwen3MoE of the session's `tiny_models`), so the flags are chosen
for two cores: --enforce-eager skips the compile that makes a CPU start take minutes, the load is 16 short
requests per rate, and the candidates vary what the brief asks of vLLM (the running-request limit and the
ngram speculative depth).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ornith_stack.profiles import load_profile

pytestmark = pytest.mark.integration

# Issue 32's target is 300 s on two idle cores; the time is printed against it. The test fails only past
# LIMIT_S, a hang guard: each of the three engines here took 160 s to start with the load average at 10
# (three processes importing vLLM), so a CI machine with other work on it must not turn a slow run red.
TARGET_S = 300
LIMIT_S = float(os.environ.get("ORNITH_TUNE_LIMIT_S", "900"))


def run_tune(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """The command, stopped with SIGTERM when it overruns, so that it stops its engine before the test fails."""
    with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            stdout, stderr = proc.communicate(timeout=120)
            pytest.fail(f"tune ran over {timeout_s:.0f} s:\n{stderr}")
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def test_tune_cpu_demo_picks_the_highest_goodput_and_a_resumed_run_measures_nothing(tiny_models, tmp_path: Path,
                                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vllm")
    profiles, out = tmp_path / "profiles", tmp_path / "out"
    profiles.mkdir()
    env = {**os.environ, "ORNITH_PROFILE_DIR": str(profiles)}
    argv = [sys.executable, "-m", "ornith_stack", "tune", "cpu-demo", "--launch", "local",
            "--set", f"model.repo={tiny_models.qwen3_moe}", "--set", "serve.args.enforce-eager=true",
            "--slo", "ttft_p99:3000 tpot_p99:300", "--workload", "random:64:24", "--rates", "4,inf",
            "--num-prompts", "12", "--warmup", "0", "--try", "max-num-seqs=2", "--try", "spec-tokens=off",
            "--max-candidates", "3", "--budget", "20", "--start-timeout", "600", "--out", str(out)]
    began = time.monotonic()
    first = run_tune(argv, tmp_path, env, LIMIT_S + 120)
    took = time.monotonic() - began
    assert first.returncode in (0, 1), first.stdout + first.stderr
    result = json.loads((out / "tune.json").read_text())
    measured = [r for r in result["records"] if r["status"] == "measured"]
    assert len(measured) == 3, first.stderr
    print(f"tune of three cpu-demo candidates took {took:.0f} s (target {TARGET_S} s)")
    assert took < LIMIT_S, f"tune took {took:.0f} s: {first.stderr}"
    assert first.stderr.count("min of budget left") >= 6  # a line as each candidate starts and ends

    def goodput(record: dict) -> float:
        met = [lv for lv in record["levels"] if lv["meets"]]
        return max(met, key=lambda lv: lv["rate"])["output_tok_s"] if met else 0.0

    best = max(measured, key=goodput)
    assert (out / "tune.md").read_text().count("| ") > 3 and (out / "pareto.png").stat().st_size > 10_000
    if goodput(best) > 0:
        assert result["winner"] == best["key"] and first.returncode == 0
        monkeypatch.setenv("ORNITH_PROFILE_DIR", str(profiles))
        assert dict(load_profile("cpu-demo-tuned").serve.args) == best["args"]
        assert "ornith-stack up cpu-demo-tuned" in first.stdout
    else:
        assert result["winner"] is None and "closest" in first.stderr

    logs = {p: p.stat().st_mtime for p in out.glob("candidates/*/engine.log")}
    second = run_tune(argv, tmp_path, env, 120)
    assert second.returncode == first.returncode, second.stderr
    assert "engines started by this run: 0" in second.stdout
    assert second.stderr.count("measured before") == 3
    assert {p: p.stat().st_mtime for p in out.glob("candidates/*/engine.log")} == logs
    assert json.loads((out / "tune.json").read_text())["winner"] == result["winner"]
