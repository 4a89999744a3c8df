"""Outputs of a bench run: JSON with every raw sample, a Markdown report shaped like the seeds'
tables, and PNG plots (TTFT and decode against prompt length; speedup per task)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ornith_stack.bench.serving import serving_metrics

TASK_LABELS = {"gsm8k": "GSM8K", "humaneval": "HumanEval", "math500": "MATH-500", "mbpp": "MBPP",
               "mt-bench": "MT-Bench"}
LATENCIES = (("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms"), ("itl_ms", "ITL ms"), ("e2el_ms", "E2E ms"))


def write_outputs(result: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "bench.json", "markdown": out_dir / "bench.md"}
    markdown = render_markdown(result)
    paths["json"].write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    paths["markdown"].write_text(markdown)
    paths.update(write_plots(result, out_dir))
    return paths


# -- Markdown --------------------------------------------------------------------------------------


def render_markdown(result: dict[str, Any]) -> str:
    lines = [f"# ornith-stack bench: {result.get('model')} at {result.get('url')}", ""]
    lines.append(_header(result))
    if result.get("interrupted"):
        lines += ["", "**Interrupted**: the tables hold the samples gathered before Ctrl-C."]
    if result.get("aborted"):
        lines += ["", f"**Stopped before the suites**: {result['aborted']}."]
    lines += _failures(result)
    lines += ["", *main_table(result)]
    lines += _decode_notes(result)
    for section in (_task_table, _acceptance_table, _seed004_table, _sweep_table, _concurrency_table,
                    _serving_tables):
        lines += section(result)
    return "\n".join(lines) + "\n"


def _failures(result: dict[str, Any]) -> list[str]:
    failures = result.get("failures") or {}
    if not failures.get("count"):
        return []
    rows = [[str(n), f"`{reason}`"] for reason, n in sorted(failures["reasons"].items(), key=lambda kv: -kv[1])]
    return ["", f"**{failures['count']} request(s) failed**; the tables are over the requests that finished.", "",
            *_table(["requests", "error"], rows)]


def main_table(result: dict[str, Any]) -> list[str]:
    """| configuration | decode tok/s | speedup | accepted tokens (GSM8K / HumanEval) | GSM8K | HumanEval |"""
    comparison = result.get("comparison", {})
    ours = comparison.get("this_run", {})
    tasks = _task_names(result, comparison)
    head = ["configuration", "decode tok/s", "speedup",
            f"accepted tokens ({' / '.join(TASK_LABELS.get(t, t) for t in tasks)})",
            *(TASK_LABELS.get(t, t) for t in tasks)]
    rows = []
    seed = comparison.get("seed")
    if seed:
        name = f"seed {seed.get('source', '')[:3]}"
        if seed.get("baseline_decode_tok_s"):
            rows.append([f"{name}: base model", _num(seed["baseline_decode_tok_s"]), "1.00x", "—",
                         *(_pct(seed.get("baseline_accuracy", {}).get(t)) for t in tasks)])
        rows.append([f"{name}: {result.get('profile') or 'profile'}", _num(seed.get("decode_tok_s")),
                     _x(seed.get("speedup")), _acceptance(seed.get("acceptance_length", {}), tasks),
                     *(_pct(seed.get("accuracy", {}).get(t)) for t in tasks)])
    base = comparison.get("baseline")
    if base:
        rows.append([f"baseline ({Path(base.get('file') or 'baseline').name})", _num(base.get("decode_tok_s")),
                     "1.00x", _acceptance(base.get("acceptance_length", {}), tasks),
                     *(_pct(base.get("accuracy", {}).get(t)) for t in tasks)])
    rows.append(["this run", _num(ours.get("decode_tok_s")), _run_speedup(comparison),
                 _acceptance(ours.get("acceptance_length", {}), tasks),
                 *(_accuracy(result, t) for t in tasks)])
    return _table(head, rows)


def _header(result: dict[str, Any]) -> str:
    parts = [f"method: {result.get('method') or 'custom'}", f"suites: {', '.join(result.get('suites_requested', []))}"]
    if result.get("profile"):
        parts.append(f"profile: {result['profile']}")
    if result.get("engine"):
        parts.append(f"engine metrics: {result['engine']}")
    parts.append(f"max model length: {result.get('max_model_len') or 'unknown'}")
    parts.append(f"started {result.get('started_at_iso', '')}")
    return "; ".join(parts) + "."


def _decode_notes(result: dict[str, Any]) -> list[str]:
    decode = result.get("suites", {}).get("decode")
    comparison = result.get("comparison", {})
    notes = []
    if decode:
        rate, ttft = decode.get("decode_tok_s", {}), decode.get("ttft_s", {})
        if rate.get("n"):
            notes.append(
                f"Essay prompts (ignore_eos, a separate figure from the task runs): single stream, "
                f"{decode.get('max_tokens')} generated tokens, median of {rate['n']} "
                f"(min {_num(rate['min'])}, max {_num(rate['max'])}, stdev {_num(rate['stdev'])}) tok/s; "
                f"TTFT median {_num(ttft.get('median'), 3)} s."
            )
        engine = (decode.get("engine_decode_tok_s") or {}).get("median")
        if engine and rate.get("median") and abs(engine / rate["median"] - 1) > 0.05:
            notes.append(
                f"**Warning**: the engine counted {_num(engine)} tok/s over the same intervals: other clients "
                "were probably using it during the measurement."
            )
        if decode.get("acceptance_length"):
            notes.append(f"Accepted tokens per verification step while decoding: {_num(decode['acceptance_length'], 2)}.")
    source = comparison.get("this_run", {}).get("decode_source")
    if source:
        notes.append("This run's decode tok/s: " + ("all task answers' decode tokens over their decode time "
                                                  "(seed 000's method)." if source == "tasks" else
                                                  "the essay prompts' median (no task runs)."))
    if comparison.get("percent_of_seed_decode") is not None:
        notes.append(f"{_num(comparison['percent_of_seed_decode'])}% of the seed's "
                     f"{_num(comparison['seed']['decode_tok_s'])} tok/s.")
    roof = comparison.get("roofline")
    if roof:
        notes.append(
            f"Roofline: {_num(roof['active_params'] / 1e9, 2)}B active parameters = "
            f"{_num(roof['bytes_per_token'] / 1e9, 2)} GB per token over {_num(roof['bandwidth_gbps'])} GB/s "
            f"= {_num(roof['tok_s'])} tok/s; this run decodes at {_num(roof.get('percent'))}% of it."
        )
    elif comparison.get("roofline_note"):
        notes.append(f"No roofline: {comparison['roofline_note']}.")
    return ["", *notes] if notes else []


def _task_table(result: dict[str, Any]) -> list[str]:
    suite = result.get("suites", {}).get("tasks", {})
    tasks = suite.get("tasks", {})
    if not tasks:
        return []
    comparison = result.get("comparison", {})
    speedups = comparison.get("speedup_per_task_vs_baseline") or comparison.get("speedup_per_task_vs_seed_baseline") or {}
    against = "baseline" if comparison.get("speedup_per_task_vs_baseline") else "seed base model"
    rows = [[TASK_LABELS.get(name, name), str(t.get("n", 0)), _accuracy(result, name),
             _num((t.get("acceptance") or {}).get("per_request_mean") or t.get("acceptance_length"), 2),
             _num(t.get("task_decode_tok_s") or (t.get("decode_tok_s") or {}).get("median")),
             _x(speedups.get(name)), str(t.get("errors", 0)), f"`{t.get('source')}`"] for name, t in tasks.items()]
    head = ["task", "problems", "pass rate", "accepted tokens/step", "decode tok/s (total/total)",
            f"speedup vs {against}" if speedups else "speedup", "errors", "problems from"]
    lines = ["", "## Tasks", "", *_table(head, rows), "",
             f"Prompt format: {suite.get('prompt_format', 'seed000')}; thinking "
             f"{'on' if suite.get('thinking') else 'off'}; sampling: {_sampling(suite.get('sampling'))}; "
             f"up to {suite.get('max_tokens')} new tokens."
             + (" Problem order: dflash's server path (file order, the first `concurrency` rows of each level "
                "warm-up)." if suite.get("order") == "server" else "")
             + (" MT-Bench has no checker (first turn only)." if "mt-bench" in tasks else "")]
    return lines + _short_of_request(tasks, suite.get("requested_samples"))


def _short_of_request(tasks: dict[str, Any], wanted: int | None) -> list[str]:
    """Which tasks ran fewer samples than the method asks, and why: the set holds no more (MT-Bench has 80
    questions in all) or --task-limit cut it. Results without `available` count as whole sets."""
    short = {n: t.get("n", 0) for n, t in tasks.items() if wanted and t.get("n", 0) < wanted}
    if not short:
        return []
    cut = [n for n, k in short.items() if (tasks[n].get("available") or k) > k]
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
            f"{TASK_LABELS.get(n, n)} {short[n]} of {tasks[n]['available']}" for n in cut))
    return ["", f"The method asks {wanted} samples per task; {'; '.join(parts)}."]


def _acceptance_table(result: dict[str, Any]) -> list[str]:
    tasks = result.get("suites", {}).get("tasks", {}).get("tasks", {})
    rows = []
    for name, t in tasks.items():
        acc = t.get("acceptance")
        if not acc:
            continue
        positions = " / ".join(f"{100 * v:.0f}%" for v in acc.get("per_position", {}).values()) or "—"
        rows.append([TASK_LABELS.get(name, name), str(acc["requests"]), _num(acc["per_request_mean"], 2),
                     _num(acc["token_weighted"], 2), _pct(acc.get("draft_acceptance_rate")), positions])
    if not rows:
        return []
    head = ["task", "requests", "acceptance (per-request mean)", "acceptance (token-weighted)",
            "draft acceptance rate", "accepted per draft position"]
    return ["", "## Acceptance", "", *_table(head, rows), "",
            "Per-request mean: the mean over requests of completion tokens / verification steps, each request "
            "alone on the engine (seed 004). Token-weighted: all accepted tokens over all steps, plus the bonus "
            "token. Both from the engine's counters around each request."]


def _seed004_table(result: dict[str, Any]) -> list[str]:
    """Seed 004's shape: per task, acceptance and output tok/s at each concurrency (speedup vs baseline)."""
    tasks = result.get("suites", {}).get("tasks", {}).get("tasks", {})
    levels = sorted({x["concurrency"] for t in tasks.values() for x in t.get("throughput") or []})
    if not levels:
        return []
    speedups = result.get("comparison", {}).get("task_throughput_speedup_vs_baseline") or {}
    rows = []
    for name, t in tasks.items():
        by_level = {x["concurrency"]: x for x in t.get("throughput") or []}
        cells = []
        for level in levels:
            x = by_level.get(level) or {}
            speedup = (speedups.get(name) or {}).get(str(level))
            cells.append(_num(x.get("output_tok_s")) + (f" ({_x(speedup)})" if speedup else ""))
        rows.append([TASK_LABELS.get(name, name),
                     _num((t.get("acceptance") or {}).get("per_request_mean") or t.get("acceptance_length"), 2), *cells])
    head = ["task", "acceptance length", *(f"concurrency {c} tok/s" for c in levels)]
    return ["", "## Throughput per task", "", *_table(head, rows), "",
            "Throughput: total output tokens / end-to-end wall time of all the task's problems at that concurrency "
            "(speedup vs the baseline run in brackets)."]


def _sampling(sampling: Any) -> str:
    if isinstance(sampling, dict):
        return f"temperature {sampling.get('temperature')}, top-p {sampling.get('top_p')}, top-k {sampling.get('top_k')}"
    return str(sampling or "greedy")


def _sweep_table(result: dict[str, Any]) -> list[str]:
    sweep = result.get("suites", {}).get("ttft_sweep")
    if not sweep:
        return []
    seed = (result.get("comparison", {}).get("seed") or {}).get("sweep") or []
    rows = []
    for point in sweep.get("points", []):
        ref = _nearest(seed, point.get("prompt_tokens"))
        rows.append([_int(point.get("prompt_tokens")), _spread(point.get("ttft_spread"), 3),
                     _spread(point.get("decode_spread")),
                     _int(ref.get("prompt_tokens")) if ref else "—", _num(ref.get("ttft_s"), 2) if ref else "—",
                     _num(ref.get("decode_tok_s")) if ref else "—", point.get("error") or ""])
    head = ["prompt tokens", "TTFT s (median [min–max])", "decode tok/s", "seed prompt tokens", "seed TTFT s",
            "seed decode tok/s", "error"]
    lines = ["", "## TTFT and decode against prompt length", "", *_table(head, rows)]
    if sweep.get("dropped_lengths"):
        dropped = ", ".join(str(n) for n in sweep["dropped_lengths"])
        window = sweep.get("max_model_len")
        lines += ["", f"Capped by the server's max model length ({window}): {dropped} ran at the largest prompt that fits."]
    return lines


def _concurrency_table(result: dict[str, Any]) -> list[str]:
    levels = result.get("suites", {}).get("concurrency", {}).get("levels", [])
    if not levels:
        return []
    speedups = result.get("comparison", {}).get("concurrency_speedup_vs_baseline") or {}
    rows = [[str(level["concurrency"]), _spread(level.get("spread", {}).get("output_tok_s")),
             _num((level.get("decode_tok_s") or {}).get("median")), _x(speedups.get(str(level["concurrency"]))),
             str(level.get("errors", 0))] for level in levels]
    head = ["streams", "output tok/s (median [min–max] of runs)", "decode tok/s per stream (median)", "vs baseline",
            "errors"]
    lines = ["", "## Concurrency (essay prompts, ignore_eos)", "", *_table(head, rows)]
    for level in levels:
        lines += _percentiles(f"{level['concurrency']} streams", level)
    return lines


def _serving_tables(result: dict[str, Any]) -> list[str]:
    suite = result.get("suites", {}).get("serving")
    if not suite:
        return []
    if suite.get("dataset"):
        title = "prompts from a file"
        workload = (f"{suite['num_prompts']} prompts from `{suite['dataset']}`, {suite['output_len']} output tokens "
                    "where a line gives no output_tokens")
    else:
        title = "random workload"
        workload = f"{suite['num_prompts']} prompts of {suite['input_len']} tokens, {suite['output_len']} output tokens each"
    lines = ["", f"## Serving ({title})", "",
             f"{workload}, seed {suite['seed']}, burstiness {suite['burstiness']}, {suite['repeats']} recorded runs "
             "per level after unrecorded warm-ups. Figures: median [min–max] over the runs."]
    rows = []
    for level in suite.get("levels", []):
        spread = level.get("spread", {})
        goodput = [r.get("goodput") for r in level.get("runs", [])]
        rows.append([level["load"], _spread(spread.get("request_throughput"), 2), _spread(spread.get("output_tok_s")),
                     _spread(spread.get("ttft_ms_median")), _spread(spread.get("tpot_ms_median"), 2),
                     _spread(spread.get("itl_ms_median"), 2), _num(_mid(goodput), 2) if any(goodput) else "—",
                     str(level.get("errors", 0)) + (" (exceeds SGLang's token pool)" if level.get("exceeds_pool") else "")])
    head = ["load", "requests/s", "output tok/s", "median TTFT ms", "median TPOT ms", "median ITL ms", "goodput req/s",
            "failed"]
    lines += ["", *_table(head, rows)]
    for level in suite.get("levels", []):
        lines += _percentiles(level["load"], level)
    return lines


def _percentiles(title: str, level: dict[str, Any]) -> list[str]:
    """Mean, median, p90 and p99 of each latency over every recorded request of the level."""
    runs = level.get("runs") or []
    if not runs:
        return []
    samples = [s for s in level.get("samples", []) if not s.get("error")]
    pooled = serving_metrics(samples, sum(r["duration_s"] for r in runs))
    rows = [[label, *(_num(pooled[key].get(q), 2) for q in ("mean", "median", "p90", "p99")), str(pooled[key]["n"])]
            for key, label in LATENCIES]
    return ["", f"### {title}: latency percentiles", "", *_table(["metric", "mean", "median", "p90", "p99", "n"], rows)]


def _spread(summary: dict[str, Any] | None, digits: int = 1) -> str:
    if not summary or summary.get("median") is None:
        return "—"
    if summary.get("n", 0) < 2:
        return _num(summary["median"], digits)
    return f"{_num(summary['median'], digits)} [{_num(summary['min'], digits)}–{_num(summary['max'], digits)}]"


def _mid(values: list[Any]) -> float | None:
    found = sorted(v for v in values if v is not None)
    return found[len(found) // 2] if found else None


def _task_names(result: dict[str, Any], comparison: dict[str, Any]) -> list[str]:
    names = list(result.get("suites", {}).get("tasks", {}).get("tasks", {}))
    seed = comparison.get("seed") or {}
    for source in (seed.get("accuracy", {}), seed.get("acceptance_length", {})):
        names += [n for n in source if n not in names]
    return names or ["gsm8k", "humaneval"]


def _run_speedup(comparison: dict[str, Any]) -> str:
    if comparison.get("speedup_vs_baseline") is not None:
        return _x(comparison["speedup_vs_baseline"])
    if comparison.get("speedup_vs_seed_baseline") is not None:
        return f"{_x(comparison['speedup_vs_seed_baseline'])} (vs seed base model)"
    return "—"


def _accuracy(result: dict[str, Any], task: str) -> str:
    entry = result.get("suites", {}).get("tasks", {}).get("tasks", {}).get(task)
    checked = entry.get("checked", entry.get("n")) if entry else 0
    if not entry or not checked:
        return "—"
    return f"{_pct(entry.get('accuracy'))} ({entry['passed']}/{checked})"


def _acceptance(values: dict[str, Any], tasks: list[str]) -> str:
    shown = [_num(values.get(t), 1) for t in tasks]
    return "—" if all(s == "—" for s in shown) else " / ".join(shown)


def _nearest(points: list[dict[str, Any]], tokens: int | None) -> dict[str, Any] | None:
    """The seed's sweep point closest to `tokens` (within a factor 1.5), for side-by-side reading."""
    if not tokens or not points:
        return None
    best = min(points, key=lambda p: abs(p["prompt_tokens"] / tokens - 1))
    return best if 1 / 1.5 <= best["prompt_tokens"] / tokens <= 1.5 else None


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


def _num(value: Any, digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _int(value: Any) -> str:
    return "—" if value is None else f"{int(value):,}"


def _pct(value: Any) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _x(value: Any) -> str:
    return "—" if value is None else f"{value:.2f}x"


# -- plots -----------------------------------------------------------------------------------------


def write_plots(result: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    paths = {}
    sweep = result.get("suites", {}).get("ttft_sweep")
    if sweep and any(p.get("ttft_s") for p in sweep.get("points", [])):
        paths["sweep_plot"] = _plot_sweep(result, sweep, out_dir / "ttft-sweep.png")
    if result.get("suites", {}).get("tasks", {}).get("tasks"):
        paths["tasks_plot"] = _plot_tasks(result, out_dir / "tasks.png")
    levels = result.get("suites", {}).get("serving", {}).get("levels") or []
    if any(level.get("output_tok_s") for level in levels):
        paths["serving_plot"] = _plot_serving(levels, out_dir / "serving.png")
    return paths


def _plot_serving(levels: list[dict[str, Any]], path: Path) -> Path:
    """Output tok/s and median TPOT per load level, with the min–max of the repeated runs as error bars."""
    import matplotlib.pyplot as plt

    labels = [level["load"].replace(", ", "\n") for level in levels]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, ylabel in ((axes[0], "output_tok_s", "output tok/s"), (axes[1], "tpot_ms_median", "median TPOT (ms)")):
        spreads = [level.get("spread", {}).get(key) or {} for level in levels]
        mids = [float(sp.get("median") or 0.0) for sp in spreads]
        low = [m - float(sp.get("min") or m) for m, sp in zip(mids, spreads, strict=True)]
        high = [float(sp.get("max") or m) - m for m, sp in zip(mids, spreads, strict=True)]
        ax.bar(labels, mids, yerr=[low, high], capsize=4, color="#4c72b0")
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("serving: random workload per load level")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_sweep(result: dict[str, Any], sweep: dict[str, Any], path: Path) -> Path:
    import matplotlib.pyplot as plt

    points = [p for p in sweep["points"] if p.get("ttft_s")]
    seed = (result.get("comparison", {}).get("seed") or {}).get("sweep") or []
    fig, (ax_ttft, ax_decode) = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((ax_ttft, "ttft_s", "TTFT (s)"), (ax_decode, "decode_tok_s", "decode tok/s")):
        ax.plot([p["prompt_tokens"] for p in points], [p.get(key) for p in points], "o-", label="this run")
        ref = [s for s in seed if s.get(key)]
        if ref:
            ax.plot([s["prompt_tokens"] for s in ref], [s[key] for s in ref], "s--", label=f"seed {result.get('profile')}")
        ax.set_xscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend()
    ax_ttft.set_yscale("log")
    fig.suptitle(f"TTFT and decode against prompt length: {result.get('model')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_tasks(result: dict[str, Any], path: Path) -> Path:
    """Speedup per task against the baseline run (or the seed's base model); decode tok/s when neither."""
    import matplotlib.pyplot as plt

    comparison = result.get("comparison", {})
    speedups = comparison.get("speedup_per_task_vs_baseline") or comparison.get("speedup_per_task_vs_seed_baseline")
    if speedups and any(v for v in speedups.values()):
        values, ylabel = speedups, "speedup (x)"
        title = "speedup per task vs " + ("baseline" if comparison.get("speedup_per_task_vs_baseline") else "seed base model")
    else:
        values, ylabel = comparison.get("this_run", {}).get("task_decode_tok_s", {}), "decode tok/s"
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
