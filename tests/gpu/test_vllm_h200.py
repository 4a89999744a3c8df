"""What the GPU validation run of vLLM 0.24.0 must show, checked on the recorded fixtures and, on the
H200 machine, on the live run's results (tests/gpu/run_vllm_h200.sh writes them under
$ORNITH_GPU_WORK/runs, default /tmp/ornith-gpu/runs; `pytest -m gpu tests/gpu` there).

The expectations are issue 3's "done when": a chat request with enable_thinking false gets
usage.completion_tokens back, and the engine's /metrics count generated tokens and speculative drafts;
plus the sizing lines the planner is checked against (vLLM's "GPU KV cache size" and "Maximum concurrency") agree with what the same
engine exports in vllm:cache_config_info.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines" / "vllm-0.24.0"
LIVE = Path(os.environ.get("ORNITH_GPU_WORK", "/tmp/ornith-gpu")) / "runs"
MODES = ("dflash", "ngram")


def _runs() -> list:
    params = [pytest.param(FIXTURES / m, id=f"fixture-{m}") for m in MODES]
    params += [pytest.param(LIVE / m, id=f"live-{m}", marks=pytest.mark.gpu) for m in MODES]
    return params


def _run_dir(path: Path) -> Path:
    if not (path / "metrics.txt").is_file():
        pytest.skip(f"no recorded run at {path}")
    return path


def _sample(metrics: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include `labels`."""
    total, found = 0.0, False
    for line in metrics.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total, found = total + float(m.group(2)), True
    assert found, f"{name} not in /metrics"
    return total


def _cache_info(metrics: str) -> dict[str, str]:
    line = next(line for line in metrics.splitlines() if line.startswith("vllm:cache_config_info{"))
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


@pytest.mark.parametrize("run", _runs())
def test_chat_completion_reports_usage(run: Path) -> None:
    chat = json.loads((_run_dir(run) / "chat-completion.json").read_text())
    assert chat["usage"]["completion_tokens"] > 0
    assert chat["choices"][0]["message"]["role"] == "assistant"


@pytest.mark.parametrize("run", _runs())
def test_metrics_count_generation_and_drafts(run: Path) -> None:
    metrics = (_run_dir(run) / "metrics.txt").read_text()
    assert _sample(metrics, "vllm:generation_tokens_total") > 0
    drafts = _sample(metrics, "vllm:spec_decode_num_drafts_total")
    draft_tokens = _sample(metrics, "vllm:spec_decode_num_draft_tokens_total")
    assert drafts > 0
    # Every draft proposes num_speculative_tokens tokens at most (15 for DFlash block 16, 4 for ngram).
    per_draft = draft_tokens / drafts
    assert 1 <= per_draft <= (15 if run.name == "dflash" else 4)


@pytest.mark.parametrize("run", _runs())
def test_sizing_log_lines_match_exported_cache_config(run: Path) -> None:
    log = (_run_dir(run) / "engine.log").read_text()
    info = _cache_info((run / "metrics.txt").read_text())
    block = re.search(r"Setting attention block size to (\d+) tokens", log)
    tokens = re.search(r"GPU KV cache size: ([\d,]+) tokens", log)
    concurrency = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", log)
    assert block and tokens and concurrency, "a sizing line is missing from the engine log"
    assert int(block.group(1)) == int(info["block_size"])
    assert int(tokens.group(1).replace(",", "")) == int(info["kv_cache_size_tokens"])
    assert float(concurrency.group(2)) == pytest.approx(float(info["kv_cache_max_concurrency"]), abs=0.005)
    # vLLM logs GPU KV cache size = int(concurrency x max_model_len) (v1/core/kv_cache_utils.py).
    max_len = int(concurrency.group(1).replace(",", ""))
    assert int(float(info["kv_cache_max_concurrency"]) * max_len) == int(info["kv_cache_size_tokens"])
