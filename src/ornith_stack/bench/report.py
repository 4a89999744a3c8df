"""Outputs of a bench run: JSON with every raw sample, a Markdown report shaped like the seeds'
tables, and PNG plots (TTFT and decode against prompt length; speedup per task)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ornith_stack.bench.codec import to_json
from ornith_stack.bench.result import (
    BenchResult,
    Comparison,
    DecodeSuite,
    Failures,
    Level,
    RunSpread,
    SamplingSettings,
    SeedPoint,
    ServingLevel,
    Summary,
    SweepPoint,
    SweepSuite,
    TaskEntry,
)
from ornith_stack.bench.serving import serving_metrics

TASK_LABELS = {"gsm8k": "GSM8K", "humaneval": "HumanEval", "math500": "MATH-500", "mbpp": "MBPP",
               "mt-bench": "MT-Bench"}


def write_outputs(result: BenchResult, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "bench.json", "markdown": out_dir / "bench.md"}
    markdown = render_markdown(result)
    paths["json"].write_text(json.dumps(to_json(result), indent=2, sort_keys=False) + "\n")
    paths["markdown"].write_text(markdown)
    paths.update(write_plots(result, out_dir))
    return paths


# -- Markdown --------------------------------------------------------------------------------------


def render_markdown(result: BenchResult) -> str:
    lines = [f"# ornith-stack bench: {result.model} at {result.url}", ""]
    lines.append(_header(result))
    if result.interrupted:
        lines += ["", "**Interrupted**: the tables hold the samples gathered before Ctrl-C."]
    if result.aborted:
        lines += ["", f"**Stopped before the suites**: {result.aborted}."]
    lines += _failures(result.failures)
    lines += ["", *main_table(result)]
    lines += _decode_notes(result)
    for section in (_task_table, _acceptance_table, _seed004_table, _sweep_table, _concurrency_table,
                    _serving_tables):
        lines += section(result)
    return "\n".join(lines) + "\n"


def _failures(failures: Failures) -> list[str]:
    if not failures.count:
        return []
    rows = [[str(n), f"`{reason}`"] for reason, n in sorted(failures.reasons.items(), key=lambda kv: -kv[1])]
    return ["", f"**{failures.count} request(s) failed**; the tables are over the requests that finished.", "",
            *_table(["requests", "error"], rows)]


def main_table(result: BenchResult) -> list[str]:
    """| configuration | decode tok/s | speedup | accepted tokens (GSM8K / HumanEval) | GSM8K | HumanEval |"""
    comparison = result.comparison
    ours = comparison.this_run
    tasks = _task_names(result)
    head = ["configuration", "decode tok/s", "speedup",
            f"accepted tokens ({' / '.join(TASK_LABELS.get(t, t) for t in tasks)})",
            *(TASK_LABELS.get(t, t) for t in tasks)]
    rows = []
    seed = comparison.seed
    if seed:
        name = f"seed {seed.source[:3]}"
        if seed.baseline_decode_tok_s:
            rows.append([f"{name}: base model", _num(seed.baseline_decode_tok_s), "1.00x", "—",
                         *(_pct(seed.baseline_accuracy.get(t)) for t in tasks)])
        rows.append([f"{name}: {result.profile or 'profile'}", _num(seed.decode_tok_s),
                     _x(seed.speedup), _acceptance(seed.acceptance_length, tasks),
                     *(_pct(seed.accuracy.get(t)) for t in tasks)])
    base = comparison.baseline
    if base:
        rows.append([f"baseline ({Path(base.file or 'baseline').name})", _num(base.decode_tok_s),
                     "1.00x", _acceptance(base.acceptance_length, tasks),
                     *(_pct(base.accuracy.get(t)) for t in tasks)])
    rows.append(["this run", _num(ours.decode_tok_s), _run_speedup(comparison),
                 _acceptance(ours.acceptance_length, tasks), *(_accuracy(result, t) for t in tasks)])
    return _table(head, rows)


def _header(result: BenchResult) -> str:
    parts = [f"method: {result.method or 'custom'}", f"suites: {', '.join(result.suites_requested)}"]
    if result.profile:
        parts.append(f"profile: {result.profile}")
    if result.engine:
        parts.append(f"engine metrics: {result.engine}")
    parts.append(f"max model length: {result.max_model_len or 'unknown'}")
    parts.append(f"started {result.started_at_iso}")
    return "; ".join(parts) + "."


def _decode_notes(result: BenchResult) -> list[str]:
    decode = result.suites.decode
    comparison = result.comparison
    notes = _essay_notes(decode) if decode else []
    source = comparison.this_run.decode_source
    if source:
        notes.append("This run's decode tok/s: " + ("all task answers' decode tokens over their decode time "
                                                  "(seed 000's method)." if source == "tasks" else
                                                  "the essay prompts' median (no task runs)."))
    if comparison.percent_of_seed_decode is not None and comparison.seed:
        notes.append(f"{_num(comparison.percent_of_seed_decode)}% of the seed's "
                     f"{_num(comparison.seed.decode_tok_s)} tok/s.")
    roof = comparison.roofline
    if roof:
        notes.append(
            f"Roofline: {_num(roof.active_params / 1e9, 2)}B active parameters = "
            f"{_num(roof.bytes_per_token / 1e9, 2)} GB per token over {_num(roof.bandwidth_gbps)} GB/s "
            f"= {_num(roof.tok_s)} tok/s; this run decodes at {_num(roof.percent)}% of it."
        )
    elif comparison.roofline_note:
        notes.append(f"No roofline: {comparison.roofline_note}.")
    return ["", *notes] if notes else []


def _essay_notes(decode: DecodeSuite) -> list[str]:
    rate, ttft = decode.decode_tok_s, decode.ttft_s
    notes = []
    if rate.n:
        notes.append(
            f"Essay prompts (ignore_eos, a separate figure from the task runs): single stream, "
            f"{decode.max_tokens} generated tokens, median of {rate.n} "
            f"(min {_num(rate.min)}, max {_num(rate.max)}, stdev {_num(rate.stdev)}) tok/s; "
            f"TTFT median {_num(ttft.median, 3)} s."
        )
    engine = decode.engine_decode_tok_s.median
    if engine and rate.median and abs(engine / rate.median - 1) > 0.05:
        notes.append(
            f"**Warning**: the engine counted {_num(engine)} tok/s over the same intervals: other clients "
            "were probably using it during the measurement."
        )
    if decode.acceptance_length:
        notes.append(f"Accepted tokens per verification step while decoding: {_num(decode.acceptance_length, 2)}.")
    return notes


def _tasks(result: BenchResult) -> dict[str, TaskEntry]:
    return result.suites.tasks.tasks if result.suites.tasks else {}


def _task_acceptance(task: TaskEntry) -> float | None:
    return (task.acceptance.per_request_mean if task.acceptance else None) or task.acceptance_length


def _task_table(result: BenchResult) -> list[str]:
    suite = result.suites.tasks
    if not suite or not suite.tasks:
        return []
    tasks = suite.tasks
    comparison = result.comparison
    speedups = comparison.speedup_per_task_vs_baseline or comparison.speedup_per_task_vs_seed_baseline or {}
    against = "baseline" if comparison.speedup_per_task_vs_baseline else "seed base model"
    rows = [[TASK_LABELS.get(name, name), str(t.n), _accuracy(result, name), _num(_task_acceptance(t), 2),
             _num(t.task_decode_tok_s or t.decode_tok_s.median), _x(speedups.get(name)), str(t.errors),
             f"`{t.source}`"] for name, t in tasks.items()]
    head = ["task", "problems", "pass rate", "accepted tokens/step", "decode tok/s (total/total)",
            f"speedup vs {against}" if speedups else "speedup", "errors", "problems from"]
    lines = ["", "## Tasks", "", *_table(head, rows), "",
             f"Prompt format: {suite.prompt_format}; thinking "
             f"{'on' if suite.thinking else 'off'}; sampling: {_sampling(suite.sampling)}; "
             f"up to {suite.max_tokens} new tokens."
             + (" Problem order: dflash's server path (file order, the first `concurrency` rows of each level "
                "warm-up)." if suite.order == "server" else "")
             + (" MT-Bench has no checker (first turn only)." if "mt-bench" in tasks else "")]
    return lines + _short_of_request(tasks, suite.requested_samples)


def _short_of_request(tasks: dict[str, TaskEntry], wanted: int | None) -> list[str]:
    """Which tasks ran fewer samples than the method asks, and why: the set holds no more (MT-Bench has 80
    questions in all) or --task-limit cut it. Results without `available` count as whole sets."""
    short = {n: t.n for n, t in tasks.items() if wanted and t.n < wanted}
    if not short:
        return []
    cut = [n for n, k in short.items() if (tasks[n].available or k) > k]
    whole = [n for n in short if n not in cut]
    parts = []
    if whole:
        held = ", ".join(f"{TASK_LABELS.get(n, n)} {short[n]}" for n in whole)
        more = [n for n in whole if n != "mt-bench"]
        parts.append(f"these sets hold fewer and all of them ran: {held}"
                     + (" (MT-Bench has no more questions)" if "mt-bench" in whole else "")
                     + (f" (pass --tasks-dir with the full datasets for {wanted} of "
                        f"{', '.join(TASK_LABELS.get(n, n) for n in more)})" if more else ""))
    if cut:
        parts.append("--task-limit ran fewer: " + ", ".join(
            f"{TASK_LABELS.get(n, n)} {short[n]} of {tasks[n].available}" for n in cut))
    return ["", f"The method asks {wanted} samples per task; {'; '.join(parts)}."]


def _acceptance_table(result: BenchResult) -> list[str]:
    rows = []
    for name, t in _tasks(result).items():
        acc = t.acceptance
        if not acc:
            continue
        positions = " / ".join(f"{100 * v:.0f}%" for v in acc.per_position.values()) or "—"
        rows.append([TASK_LABELS.get(name, name), str(acc.requests), _num(acc.per_request_mean, 2),
                     _num(acc.token_weighted, 2), _pct(acc.draft_acceptance_rate), positions])
    if not rows:
        return []
    head = ["task", "requests", "acceptance (per-request mean)", "acceptance (token-weighted)",
            "draft acceptance rate", "accepted per draft position"]
    return ["", "## Acceptance", "", *_table(head, rows), "",
            "Per-request mean: the mean over requests of completion tokens / verification steps, each request "
            "alone on the engine (seed 004). Token-weighted: all accepted tokens over all steps, plus the bonus "
            "token. Both from the engine's counters around each request."]


def _seed004_table(result: BenchResult) -> list[str]:
    """Seed 004's shape: per task, acceptance and output tok/s at each concurrency (speedup vs baseline)."""
    tasks = _tasks(result)
    levels = sorted({x.concurrency for t in tasks.values() for x in t.throughput})
    if not levels:
        return []
    speedups = result.comparison.task_throughput_speedup_vs_baseline or {}
    rows = []
    for name, t in tasks.items():
        by_level = {x.concurrency: x for x in t.throughput}
        cells = []
        for level in levels:
            x = by_level.get(level)
            speedup = (speedups.get(name) or {}).get(str(level))
            cells.append(_num(x.output_tok_s if x else None) + (f" ({_x(speedup)})" if speedup else ""))
        rows.append([TASK_LABELS.get(name, name), _num(_task_acceptance(t), 2), *cells])
    head = ["task", "acceptance length", *(f"concurrency {c} tok/s" for c in levels)]
    return ["", "## Throughput per task", "", *_table(head, rows), "",
            "Throughput: total output tokens / end-to-end wall time of all the task's problems at that concurrency "
            "(speedup vs the baseline run in brackets)."]


def _sampling(sampling: SamplingSettings | str) -> str:
    if isinstance(sampling, SamplingSettings):
        return f"temperature {sampling.temperature}, top-p {sampling.top_p}, top-k {sampling.top_k}"
    return sampling or "greedy"


def _sweep_table(result: BenchResult) -> list[str]:
    sweep = result.suites.ttft_sweep
    if not sweep:
        return []
    seed = result.comparison.seed.sweep if result.comparison.seed else ()
    rows = []
    for point in sweep.points:
        ref = _nearest(seed, point.prompt_tokens)
        rows.append([_int(point.prompt_tokens), _spread(point.ttft_spread, 3), _spread(point.decode_spread),
                     _int(ref.prompt_tokens) if ref else "—", _num(ref.ttft_s, 2) if ref else "—",
                     _num(ref.decode_tok_s) if ref else "—", point.error or ""])
    head = ["prompt tokens", "TTFT s (median [min–max])", "decode tok/s", "seed prompt tokens", "seed TTFT s",
            "seed decode tok/s", "error"]
    lines = ["", "## TTFT and decode against prompt length", "", *_table(head, rows)]
    if sweep.dropped_lengths:
        dropped = ", ".join(str(n) for n in sweep.dropped_lengths)
        lines += ["", f"Capped by the server's max model length ({sweep.max_model_len}): {dropped} ran at the "
                  "largest prompt that fits."]
    return lines


def _concurrency_table(result: BenchResult) -> list[str]:
    levels = result.suites.concurrency.levels if result.suites.concurrency else ()
    if not levels:
        return []
    speedups = result.comparison.concurrency_speedup_vs_baseline or {}
    rows = [[str(level.concurrency), _spread(level.spread.output_tok_s if level.spread else None),
             _num(level.decode_tok_s.median if level.decode_tok_s else None), _x(speedups.get(str(level.concurrency))),
             str(level.errors)] for level in levels]
    head = ["streams", "output tok/s (median [min–max] of runs)", "decode tok/s per stream (median)", "vs baseline",
            "errors"]
    lines = ["", "## Concurrency (essay prompts, ignore_eos)", "", *_table(head, rows)]
    for level in levels:
        lines += _percentiles(f"{level.concurrency} streams", level)
    return lines


def _serving_tables(result: BenchResult) -> list[str]:
    suite = result.suites.serving
    if not suite:
        return []
    if suite.dataset:
        title = "prompts from a file"
        workload = (f"{suite.num_prompts} prompts from `{suite.dataset}`, {suite.output_len} output tokens "
                    "where a line gives no output_tokens")
    else:
        title = "random workload"
        workload = f"{suite.num_prompts} prompts of {suite.input_len} tokens, {suite.output_len} output tokens each"
    lines = ["", f"## Serving ({title})", "",
             f"{workload}, seed {suite.seed}, burstiness {suite.burstiness}, {suite.repeats} recorded runs "
             "per level after unrecorded warm-ups. Figures: median [min–max] over the runs."]
    rows = []
    for level in suite.levels:
        spread = level.spread or RunSpread()
        goodput = [r.goodput for r in level.runs]
        rows.append([level.load, _spread(spread.request_throughput, 2), _spread(spread.output_tok_s),
                     _spread(spread.ttft_ms_median), _spread(spread.tpot_ms_median, 2),
                     _spread(spread.itl_ms_median, 2), _num(_mid(goodput), 2) if any(goodput) else "—",
                     _spread(spread.client_cpu_s_per_1k_tokens, 3),
                     str(level.errors) + (" (exceeds SGLang's token pool)" if level.exceeds_pool else "")])
    head = ["load", "requests/s", "output tok/s", "median TTFT ms", "median TPOT ms", "median ITL ms", "goodput req/s",
            "client CPU s/1k tok", "failed"]
    lines += ["", *_table(head, rows)]
    for level in suite.levels:
        lines += _percentiles(level.load, level)
    return lines


def _percentiles(title: str, level: Level) -> list[str]:
    """Mean, median, p90 and p99 of each latency over every recorded request of the level."""
    if not level.runs:
        return []
    pooled = serving_metrics([s for s in level.samples if not s.error], sum(r.duration_s for r in level.runs))
    latencies = (("TTFT ms", pooled.ttft_ms), ("TPOT ms", pooled.tpot_ms), ("ITL ms", pooled.itl_ms),
                 ("E2E ms", pooled.e2el_ms))
    rows = [[label, *(_num(q, 2) for q in (d.mean, d.median, d.p90, d.p99)), str(d.n)] for label, d in latencies]
    return ["", f"### {title}: latency percentiles", "", *_table(["metric", "mean", "median", "p90", "p99", "n"], rows)]


def _spread(summary: Summary | None, digits: int = 1) -> str:
    if not summary or summary.median is None:
        return "—"
    if summary.n < 2:
        return _num(summary.median, digits)
    return f"{_num(summary.median, digits)} [{_num(summary.min, digits)}–{_num(summary.max, digits)}]"


def _mid(values: list[float | None]) -> float | None:
    found = sorted(v for v in values if v is not None)
    return found[len(found) // 2] if found else None


def _task_names(result: BenchResult) -> list[str]:
    names = list(_tasks(result))
    seed = result.comparison.seed
    for source in (seed.accuracy, seed.acceptance_length) if seed else ():
        names += [n for n in source if n not in names]
    return names or ["gsm8k", "humaneval"]


def _run_speedup(comparison: Comparison) -> str:
    if comparison.speedup_vs_baseline is not None:
        return _x(comparison.speedup_vs_baseline)
    if comparison.speedup_vs_seed_baseline is not None:
        return f"{_x(comparison.speedup_vs_seed_baseline)} (vs seed base model)"
    return "—"


def _accuracy(result: BenchResult, task: str) -> str:
    entry = _tasks(result).get(task)
    checked = (entry.n if entry.checked is None else entry.checked) if entry else 0
    if not entry or not checked:
        return "—"
    return f"{_pct(entry.accuracy)} ({entry.passed}/{checked})"


def _acceptance(values: Mapping[str, float | None], tasks: list[str]) -> str:
    shown = [_num(values.get(t), 1) for t in tasks]
    return "—" if all(s == "—" for s in shown) else " / ".join(shown)


def _nearest(points: Sequence[SeedPoint], tokens: int | None) -> SeedPoint | None:
    """The seed's sweep point closest to `tokens` (within a factor 1.5), for side-by-side reading."""
    if not tokens or not points:
        return None
    best = min(points, key=lambda p: abs(p.prompt_tokens / tokens - 1))
    return best if 1 / 1.5 <= best.prompt_tokens / tokens <= 1.5 else None


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def _num(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _int(value: float | None) -> str:
    return "—" if value is None else f"{int(value):,}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _x(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


# -- plots -----------------------------------------------------------------------------------------


def write_plots(result: BenchResult, out_dir: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    paths = {}
    suites = result.suites
    if suites.ttft_sweep and any(p.ttft_s for p in suites.ttft_sweep.points):
        paths["sweep_plot"] = _plot_sweep(result, suites.ttft_sweep, out_dir / "ttft-sweep.png")
    if _tasks(result):
        paths["tasks_plot"] = _plot_tasks(result, out_dir / "tasks.png")
    levels = suites.serving.levels if suites.serving else ()
    if any(level.output_tok_s for level in levels):
        paths["serving_plot"] = _plot_serving(levels, out_dir / "serving.png")
    return paths


def _plot_serving(levels: Sequence[ServingLevel], path: Path) -> Path:
    """Output tok/s and median TPOT per load level, with the min–max of the repeated runs as error bars."""
    import matplotlib.pyplot as plt

    labels = [level.load.replace(", ", "\n") for level in levels]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    figures: tuple[tuple[str, Callable[[RunSpread], Summary]], ...] = (
        ("output tok/s", lambda sp: sp.output_tok_s), ("median TPOT (ms)", lambda sp: sp.tpot_ms_median))
    for ax, (ylabel, pick) in zip(axes, figures, strict=True):
        spreads = [pick(level.spread or RunSpread()) for level in levels]
        mids = [float(sp.median or 0.0) for sp in spreads]
        low = [m - float(sp.min or m) for m, sp in zip(mids, spreads, strict=True)]
        high = [float(sp.max or m) - m for m, sp in zip(mids, spreads, strict=True)]
        ax.bar(labels, mids, yerr=[low, high], capsize=4, color="#4c72b0")
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("serving: random workload per load level")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_sweep(result: BenchResult, sweep: SweepSuite, path: Path) -> Path:
    import matplotlib.pyplot as plt

    points = [p for p in sweep.points if p.ttft_s]
    seed = result.comparison.seed.sweep if result.comparison.seed else ()
    fig, (ax_ttft, ax_decode) = plt.subplots(1, 2, figsize=(11, 4.2))
    panels: tuple[tuple[Any, Callable[[SweepPoint | SeedPoint], float | None], str], ...] = (
        (ax_ttft, lambda p: p.ttft_s, "TTFT (s)"), (ax_decode, lambda p: p.decode_tok_s, "decode tok/s"))
    for ax, value, label in panels:
        ax.plot([p.prompt_tokens for p in points], [value(p) for p in points], "o-", label="this run")
        ref = [s for s in seed if value(s)]
        if ref:
            ax.plot([s.prompt_tokens for s in ref], [value(s) for s in ref], "s--", label=f"seed {result.profile}")
        ax.set_xscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    ax_ttft.set_yscale("log")
    fig.suptitle(f"TTFT and decode against prompt length: {result.model}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_tasks(result: BenchResult, path: Path) -> Path:
    """Speedup per task against the baseline run (or the seed's base model); decode tok/s when neither."""
    import matplotlib.pyplot as plt

    comparison = result.comparison
    speedups = comparison.speedup_per_task_vs_baseline or comparison.speedup_per_task_vs_seed_baseline
    if speedups and any(v for v in speedups.values()):
        values, ylabel = speedups, "speedup (x)"
        title = "speedup per task vs " + ("baseline" if comparison.speedup_per_task_vs_baseline else "seed base model")
    else:
        values, ylabel = comparison.this_run.task_decode_tok_s, "decode tok/s"
        title = "decode tok/s per task (no baseline given for a speedup)"
    names = list(values)
    fig, ax = plt.subplots(figsize=(6, 4))
    bars = ax.bar([TASK_LABELS.get(n, n) for n in names], [values[n] or 0 for n in names], color="#4c72b0")
    ax.bar_label(bars, labels=[_num(values[n], 2) for n in names])
    if ylabel.startswith("speedup"):
        ax.axhline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
