"""This run against a baseline run (`--baseline RESULT.json`), the seed's figures and the roofline."""

from __future__ import annotations

from dataclasses import replace

from ornith_stack.bench import stats
from ornith_stack.bench.codec import from_json
from ornith_stack.bench.result import (
    BaselineFigures,
    BenchResult,
    Comparison,
    Figures,
    RooflineFigures,
    SeedFigures,
    Summary,
    TaskEntry,
)
from ornith_stack.bench.roofline import roofline_for
from ornith_stack.profiles.model import Profile


def figures(result: BenchResult) -> Figures:
    """The headline numbers of one result: decode median, per task decode, pass rate and acceptance,
    total throughput per concurrency."""
    suites = result.suites
    tasks = suites.tasks.tasks if suites.tasks else {}
    decode = suites.decode
    essay = _median(decode.decode_tok_s if decode else None)
    task_decode = _task_decode(tasks)
    return Figures(
        # Seed 000's headline comes from the task runs: all tasks' decode tokens over their decode time;
        # the essay prompts (ignore_eos) are a separate figure, and the headline only without tasks.
        decode_tok_s=task_decode or essay,
        decode_source="tasks" if task_decode else "essays" if essay else None,
        essay_decode_tok_s=essay,
        ttft_s=_median(decode.ttft_s if decode else None),
        acceptance_length={t: _acceptance(v) for t, v in tasks.items()},
        accuracy={t: v.accuracy for t, v in tasks.items()},
        task_decode_tok_s={t: v.task_decode_tok_s or v.decode_tok_s.median for t, v in tasks.items()},
        task_throughput={t: {str(x.concurrency): x.output_tok_s for x in v.throughput} for t, v in tasks.items()},
        decode_acceptance_length=decode.acceptance_length if decode else None,
        concurrency_tok_s={str(level.concurrency): level.output_tok_s
                           for level in (suites.concurrency.levels if suites.concurrency else ())},
    )


def compare(result: BenchResult, profile: Profile | None, baseline: BenchResult | None,
            baseline_name: str = "") -> Comparison:
    ours = figures(result)
    out = Comparison(this_run=ours)
    if baseline is not None:
        out = _against_baseline(out, figures(baseline), baseline_name, baseline.url)
    if profile is not None and profile.expected is not None:
        seed = from_json(SeedFigures, profile.expected.model_dump(mode="json"), "expected")
        out = replace(out, seed=seed, percent_of_seed_decode=_percent(ours.decode_tok_s, seed.decode_tok_s),
                      speedup_vs_seed_baseline=stats.ratio(ours.decode_tok_s, seed.baseline_decode_tok_s),
                      speedup_per_task_vs_seed_baseline={task: stats.ratio(rate, seed.baseline_decode_tok_s)
                                                         for task, rate in ours.task_decode_tok_s.items()})
    if profile is not None:
        roof, why = roofline_for(profile)
        if roof:
            out = replace(out, roofline=RooflineFigures(
                shape=roof.shape, active_params=roof.active_params, bytes_per_token=roof.bytes_per_token,
                bandwidth_gbps=roof.bandwidth_gbps, tok_s=roof.tok_s, percent=roof.percent(ours.decode_tok_s)))
        out = replace(out, roofline_note=why or None)
    return out


def _against_baseline(out: Comparison, base: Figures, name: str, url: str) -> Comparison:
    """Speedups against a baseline run: like with like, task decode against task decode, essays against essays."""
    ours = out.this_run
    same = ours.decode_source == base.decode_source
    return replace(
        out, baseline=BaselineFigures(**vars(base), file=name, url=url),
        speedup_vs_baseline=(stats.ratio(ours.decode_tok_s, base.decode_tok_s) if same
                             else stats.ratio(ours.essay_decode_tok_s, base.essay_decode_tok_s)),
        speedup_per_task_vs_baseline=_ratios(ours.task_decode_tok_s, base.task_decode_tok_s),
        concurrency_speedup_vs_baseline=_ratios(ours.concurrency_tok_s, base.concurrency_tok_s),
        task_throughput_speedup_vs_baseline={task: _ratios(levels, base.task_throughput.get(task, {}))
                                             for task, levels in ours.task_throughput.items()})


def _task_decode(tasks: dict[str, TaskEntry]) -> float | None:
    return stats.ratio(sum(t.decode_tokens for t in tasks.values()), sum(t.decode_seconds for t in tasks.values()))


def _acceptance(task: TaskEntry) -> float | None:
    """Seed 004's figure (per-request mean at concurrency 1) where the requests have it, else the
    task window's counters."""
    return (task.acceptance.per_request_mean if task.acceptance else None) or task.acceptance_length


def _median(summary: Summary | None) -> float | None:
    return summary.median if summary else None


def _ratios(ours: dict[str, float | None], theirs: dict[str, float | None]) -> dict[str, float | None]:
    return {key: stats.ratio(value, theirs.get(key)) for key, value in ours.items() if key in theirs}


def _percent(value: float | None, reference: float | None) -> float | None:
    r = stats.ratio(value, reference)
    return 100.0 * r if r is not None else None
