"""The bench's arithmetic: decode rate, spreads, throughput, prompt sizing, roofline, speedups."""

from __future__ import annotations

import pytest

from ornith_stack.bench import stats
from ornith_stack.bench.codec import from_json
from ornith_stack.bench.compare import compare
from ornith_stack.bench.prompts import TokenScale, sweep_lengths
from ornith_stack.bench.result import BenchResult, Extra, Sample, TaskSample
from ornith_stack.bench.roofline import active_params, roofline_for
from ornith_stack.bench.serving import serving_metrics
from ornith_stack.profiles import load_profile
from ornith_stack.sizing.shapes import load_shape
from ornith_stack.wire.stream import decode_rate


def test_decode_rate_leaves_the_first_token_to_prefill() -> None:
    # Seed 003's client: (completion_tokens - 1) / (t_last - t_first).
    assert decode_rate(640, 2.0) == pytest.approx(319.5)
    assert decode_rate(1, 0.5) is None  # one token has no decode interval
    assert decode_rate(640, 0.0) is None
    assert decode_rate(None, 1.0) is None


def test_summary_reports_median_and_spread_of_existing_values() -> None:
    s = stats.summary([10.0, None, 30.0, 20.0])
    assert (s.n, s.median, s.min, s.max) == (3, 20.0, 10.0, 30.0)
    assert s.stdev == pytest.approx(10.0)
    assert stats.summary([]).median is None


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
    # Seed 003: "roughly 3B active parameters"; the config: 256 experts top-8, text 34.66B.
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


def _result(decode: float, tasks: dict[str, float], concurrency: dict[int, float]) -> BenchResult:
    """A saved result with only the figures the comparison reads (the others take their defaults)."""
    return from_json(BenchResult, {"suites": {
        "decode": {"decode_tok_s": {"median": decode}},
        "tasks": {"tasks": {t: {"decode_tok_s": {"median": v}, "accuracy": 0.5, "acceptance_length": 3.0}
                            for t, v in tasks.items()}},
        "concurrency": {"levels": [{"concurrency": c, "output_tok_s": v} for c, v in concurrency.items()]},
    }})


def test_speedups_against_a_baseline_run_and_the_seed() -> None:
    ours = _result(470.2, {"gsm8k": 420.0, "humaneval": 540.0}, {1: 470.0, 8: 1600.0})
    base = _result(202.5, {"gsm8k": 200.0, "humaneval": 200.0}, {1: 200.0, 8: 1000.0})
    out = compare(ours, load_profile("a100x2"), base, "base.json")
    # Seed 000: 470.2 / 202.5 = 2.32x.
    assert out.speedup_vs_baseline == pytest.approx(2.32, abs=0.005)
    assert out.speedup_per_task_vs_baseline == pytest.approx({"gsm8k": 2.1, "humaneval": 2.7})
    assert out.concurrency_speedup_vs_baseline == pytest.approx({"1": 2.35, "8": 1.6})
    assert out.percent_of_seed_decode == pytest.approx(100.0)
    assert out.speedup_vs_seed_baseline == pytest.approx(2.32, abs=0.005)
    assert out.roofline is not None and out.roofline.percent == pytest.approx(100 * 470.2 / out.roofline.tok_s)


def test_percentiles_match_numpy_as_the_peers_compute_them() -> None:
    import numpy as np

    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.3, 5.8, 9.7, 9.3, 2.0]
    d = stats.distribution(values)
    for value, q in ((d.median, 50), (d.p90, 90), (d.p99, 99)):
        assert value == pytest.approx(float(np.percentile(values, q)))
    assert d.mean == pytest.approx(float(np.mean(values))) and d.stdev == pytest.approx(float(np.std(values)))


def test_arrivals_are_gamma_distributed_and_span_n_over_rate() -> None:
    import random as rnd

    from ornith_stack.bench.serving import arrival_offsets

    offsets = arrival_offsets(200, 4.0, 1.0, rnd.Random(0))
    assert offsets == sorted(offsets) and offsets[-1] == pytest.approx(200 / 4.0)  # vLLM's rescaling
    # Poisson arrivals: gaps have a coefficient of variation near 1; burstiness 8 makes them regular.
    def cv(offs: list[float]) -> float:
        gaps = [b - a for a, b in zip([0.0, *offs], offs, strict=False)]
        return (stats.summary(gaps).stdev or 0.0) / (sum(gaps) / len(gaps))
    assert 0.8 < cv(offsets) < 1.2
    assert cv(arrival_offsets(200, 4.0, 8.0, rnd.Random(0))) < 0.5
    assert arrival_offsets(3, float("inf"), 1.0, rnd.Random(0)) == [0.0, 0.0, 0.0]


def _sample(ttft: float, e2e: float, tokens: int, itl: list[float], error: str | None = None) -> Sample:
    return Sample(ttft_s=ttft, e2e_s=e2e, completion_tokens=tokens, prompt_tokens=100, itl_s=tuple(itl),
                  tpot_s=(e2e - ttft) / (tokens - 1) if tokens > 1 else None, error=error)


def test_serving_metrics_follow_vllm_bench_serve() -> None:
    samples = [_sample(0.1, 1.1, 11, [0.1] * 10), _sample(0.3, 2.3, 21, [0.2, 0.0] * 5),
               _sample(0.0, 0.0, 0, [], error="HTTP 500: x")]
    m = serving_metrics(samples, duration_s=4.0, slos={"ttft": 200.0, "tpot": 150.0})
    assert (m.completed, m.failed, m.total_output_tokens) == (2, 1, 32)
    assert m.output_tok_s == pytest.approx(8.0) and m.request_throughput == pytest.approx(0.5)
    assert m.tpot_ms.median == pytest.approx(100.0)  # (1.1-0.1)/10 and (2.3-0.3)/20
    assert m.itl_ms.n == 20  # one value per gap between chunks, as vLLM counts
    assert m.goodput == pytest.approx(0.25)  # only the first meets TTFT <= 200 ms
    assert m.errors == {"HTTP 500: x": 1}


def test_per_task_decode_is_total_tokens_over_total_decode_time() -> None:
    from ornith_stack.bench.suites import summarize_task

    rows = [TaskSample(passed=True, completion_tokens=101, decode_s=1.0, decode_tok_s=100.0),
            TaskSample(passed=False, completion_tokens=11, decode_s=1.0, decode_tok_s=10.0),
            TaskSample(passed=None, completion_tokens=11, decode_s=1.0, decode_tok_s=10.0)]
    t = summarize_task(rows)
    assert t.task_decode_tok_s == pytest.approx(120 / 3)  # not the median of rates (10)
    assert (t.checked, t.passed, t.accuracy) == (2, 1, 0.5)  # an unchecked answer is not a failure


def test_acceptance_in_both_definitions() -> None:
    from ornith_stack.bench.acceptance import per_request, summarize_acceptance
    from ornith_stack.engines import SpecCounters

    short = per_request(SpecCounters(0, 0, 0, {0: 0}), SpecCounters(2, 6, 8, {0: 2, 1: 2, 2: 1, 3: 1}))
    long = per_request(SpecCounters(2, 6, 8, {0: 2, 1: 2, 2: 1, 3: 1}), SpecCounters(12, 16, 48, {0: 8, 1: 6, 2: 4, 3: 4}))
    rows = [Sample(extra=Extra(spec=short)), Sample(extra=Extra(spec=long))]
    acc = summarize_acceptance(rows)
    assert acc is not None
    assert acc.per_request_mean == pytest.approx(((1 + 6 / 2) + (1 + 10 / 10)) / 2)  # 3.0
    assert acc.token_weighted == pytest.approx(1 + 16 / 12)
    assert acc.draft_acceptance_rate == pytest.approx(16 / 48)
    assert acc.per_position == pytest.approx({"0": 8 / 12, "1": 6 / 12, "2": 4 / 12, "3": 4 / 12})


def test_seed_methods_set_what_the_seeds_measured() -> None:
    from ornith_stack.bench.methods import apply_method
    from ornith_stack.bench.suites import BenchConfig

    s0 = apply_method(BenchConfig(url="http://x"), "seed000")
    assert (s0.max_tokens, s0.task_max_tokens, s0.sampling, s0.thinking, s0.tasks) == (640, 640, None, False,
                                                                                       ("gsm8k", "humaneval"))
    s4 = apply_method(BenchConfig(url="http://x"), "seed004")
    assert s4.sampling is not None and (s4.sampling.temperature, s4.sampling.top_p, s4.sampling.top_k) == (0.6, 0.95, 20)
    assert (s4.thinking, s4.task_max_tokens, s4.task_limit, s4.prompt_format, s4.task_concurrency) == (
        True, 4096, 128, "dflash", (1, 8, 32))
    assert s4.tasks == ("gsm8k", "math500", "humaneval", "mbpp", "mt-bench")


def test_sglang_verify_steps_per_request_give_completion_over_steps() -> None:
    from ornith_stack.bench.acceptance import summarize_acceptance

    rows = [Sample(completion_tokens=120, extra=Extra(spec_verify_ct=30)),
            Sample(completion_tokens=40, extra=Extra(spec_verify_ct=20))]
    acc = summarize_acceptance(rows)
    assert acc is not None
    assert acc.per_request_mean == pytest.approx((4.0 + 2.0) / 2)  # seed 004's definition
    assert acc.token_weighted == pytest.approx(160 / 50)
    assert acc.draft_acceptance_rate is None  # SGLang counts no drafted tokens
