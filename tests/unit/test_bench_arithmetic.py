"""The bench's arithmetic: decode rate, spreads, throughput, prompt sizing, roofline, speedups."""

from __future__ import annotations

import pytest

from ornith_stack.bench import stats
from ornith_stack.bench.client import decode_rate
from ornith_stack.bench.compare import compare
from ornith_stack.bench.prompts import TokenScale, sweep_lengths
from ornith_stack.bench.roofline import active_params, roofline_for
from ornith_stack.planner.shapes import load_shape
from ornith_stack.profiles import load_profile


def test_decode_rate_leaves_the_first_token_to_prefill() -> None:
    # Seed 003's client: (completion_tokens - 1) / (t_last - t_first).
    assert decode_rate(640, 2.0) == pytest.approx(319.5)
    assert decode_rate(1, 0.5) is None  # one token has no decode interval
    assert decode_rate(640, 0.0) is None
    assert decode_rate(None, 1.0) is None


def test_summary_reports_median_and_spread_of_existing_values() -> None:
    s = stats.summary([10.0, None, 30.0, 20.0])
    assert (s["n"], s["median"], s["min"], s["max"]) == (3, 20.0, 10.0, 30.0)
    assert s["stdev"] == pytest.approx(10.0)
    assert stats.summary([])["median"] is None


def test_throughput_is_total_tokens_over_wall_time() -> None:
    # Seed 004: "total output tokens divided by end-to-end wall time".
    assert stats.throughput([640, 640, None], start=100.0, end=104.0) == pytest.approx(320.0)
    assert stats.throughput([], 0.0, 1.0) is None


def test_prompt_size_fit_is_linear_in_filler_words() -> None:
    scale = TokenScale([(400, 620), (100, 170)])  # 1.5 tokens a word, 20 tokens of template
    assert scale.per_word == pytest.approx(1.5)
    assert scale.words_for(2048) == int((2048 - 20) / 1.5)


def test_sweep_lengths_are_capped_by_the_servers_window() -> None:
    lengths = [512, 2048, 8192, 32768, 131072, 250000]
    # Seed 003's window: 262,144 tokens; 640 generated; 1% slack for the size fit.
    kept, dropped = sweep_lengths(lengths, 262144, 640)
    assert kept == lengths and dropped == []
    kept, dropped = sweep_lengths(lengths, 4096, 128)
    cap = 4096 - 128 - 40
    assert kept == [512, 2048, cap] and dropped == [8192, 32768, 131072, 250000]
    assert sweep_lengths([512], None, 640) == ([512], [])


def test_active_parameters_of_the_35b_are_about_three_billion() -> None:
    # Seed 003: "roughly 3B active parameters"; FACTS section 2: 256 experts top-8, text 34.66B.
    shape = load_shape("ornith-1.5-35b-a3b")
    assert shape.text_params == pytest.approx(34.66e9, rel=1e-3)
    assert active_params(shape) == pytest.approx(2.95e9, rel=0.01)


def test_spark_roofline_puts_the_seeds_decode_at_about_two_thirds() -> None:
    # Seed 003: 273 GB/s GB10, BF16 (2 bytes), measured 30.3 tok/s "a normal fraction of the roofline".
    roof, why = roofline_for(load_profile("spark"))
    assert why == "" and roof is not None
    assert roof.tok_s == pytest.approx(273e9 / (2.946e9 * 2), rel=0.01)
    assert roof.percent(30.3) == pytest.approx(65.4, abs=0.5)


def test_a_profile_without_gpu_has_no_roofline_and_says_why() -> None:
    roof, why = roofline_for(load_profile("cpu-demo"))
    assert roof is None and "no GPU" in why


def _result(decode: float, tasks: dict[str, float], concurrency: dict[int, float]) -> dict:
    return {"suites": {
        "decode": {"decode_tok_s": {"median": decode}},
        "tasks": {"tasks": {t: {"decode_tok_s": {"median": v}, "accuracy": 0.5, "acceptance_length": 3.0}
                            for t, v in tasks.items()}},
        "concurrency": {"levels": [{"concurrency": c, "output_tok_s": v} for c, v in concurrency.items()]},
    }}


def test_speedups_against_a_baseline_run_and_the_seed() -> None:
    ours = _result(470.2, {"gsm8k": 420.0, "humaneval": 540.0}, {1: 470.0, 8: 1600.0})
    base = _result(202.5, {"gsm8k": 200.0, "humaneval": 200.0}, {1: 200.0, 8: 1000.0})
    out = compare(ours, load_profile("a100x2"), base, "base.json")
    # Seed 000: 470.2 / 202.5 = 2.32x.
    assert out["speedup_vs_baseline"] == pytest.approx(2.32, abs=0.005)
    assert out["speedup_per_task_vs_baseline"] == pytest.approx({"gsm8k": 2.1, "humaneval": 2.7})
    assert out["concurrency_speedup_vs_baseline"] == pytest.approx({"1": 2.35, "8": 1.6})
    assert out["percent_of_seed_decode"] == pytest.approx(100.0)
    assert out["speedup_vs_seed_baseline"] == pytest.approx(2.32, abs=0.005)
    assert out["roofline"]["percent"] == pytest.approx(100 * 470.2 / out["roofline"]["tok_s"])
