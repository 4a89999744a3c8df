"""The rehearsal as markdown: started or where it stopped, the engine's sizing beside the plan, the load levels
beside the roofline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ornith_stack.rehearse.run import Rehearsal, sizing_rows


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown(result: Rehearsal) -> str:
    q = result.question
    acceptance = f"simulated acceptance {q['acceptance']:g}" if q["acceptance"] is not None else \
        "the draft's own acceptance (no simulation)"
    lines: list[str | None] = [f"# Rehearsal of {q['profile']}: {q['engine']}, shapes of {Path(q['model_config']).name}", "",
             f"- weights: {result.notes[0]}" if result.notes else None,
             f"- speculation: {acceptance}" if q["draft_config"] or q["acceptance"] is not None else
             "- speculation: as the profile sets it",
             f"- model config: `{q['model_config']}`" + (f", draft config: `{q['draft_config']}`"
                                                          if q["draft_config"] else "")]
    outcome = result.outcome
    if result.started:
        lines.append(f"- started: healthy after {result.healthy_s:.1f} s; phases: "
                     f"{', '.join(outcome.reached) if outcome else '-'}")
    else:
        stopped = outcome.stopped_at if outcome else "start"
        cause = f" ({outcome.cause})" if outcome and outcome.cause else ""
        lines.append(f"- did NOT start: stopped before {stopped}{cause}; reached: "
                     f"{', '.join(outcome.reached) if outcome and outcome.reached else 'nothing'}")
        if outcome and outcome.line:
            lines.append(f"- the engine's line: `{outcome.line}`")
    lines += ["", "## Sizing: the engine's own figures beside `plan`", ""]
    rows = sizing_rows(result)
    if rows:
        lines += ["| figure | engine logged | plan | plan error |", "|---|---:|---:|---:|"]
        for row in rows:
            error = f"{row['plan_error_pct']:+.2f}%" if row["plan_error_pct"] is not None else "-"
            lines.append(f"| {row['figure']} | {_num(row['engine'], 2)} | {_num(row['plan'], 2)} | {error} |")
    else:
        lines.append("The engine logged no sizing figures.")
    if result.plan_note:
        lines += ["", f"Plan: {result.plan_note}"]
    elif result.plan is not None and result.plan.problems:
        # The planner's verdict on this host, beside where the engine itself stopped: they should agree.
        lines += ["", f"Plan on this host: {result.plan.verdict}:", "",
                  *[f"- {problem.line()}" for problem in result.plan.problems]]
    if result.logged.lines:
        lines += ["", "The engine's lines:", "", "```", *result.logged.lines, "```"]
    lines += ["", "## Load: output tok/s, TTFT and TPOT", ""]
    if result.levels:
        roof = result.roofline
        lines += ["| streams | output tok/s | TTFT median ms | TTFT p99 ms | TPOT median ms | TPOT p99 ms | "
                  "one stream's decode tok/s | of the roofline | failed |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for level in result.levels:
            share = roof.percent(level["stream_decode_tok_s"]) if roof else None
            lines.append(f"| {level['concurrency']} | {_num(level['output_tok_s'], 1)} | "
                         f"{_num(level['ttft_median_ms'], 1)} | {_num(level['ttft_p99_ms'], 1)} | "
                         f"{_num(level['tpot_median_ms'], 2)} | {_num(level['tpot_p99_ms'], 2)} | "
                         f"{_num(level['stream_decode_tok_s'], 1)} | "
                         f"{'-' if share is None else f'{share:.1f}%'} | {level['failed']} |")
        lines.append("")
        lines.append(f"{q['input_tokens']} prompt tokens and {q['output_tokens']} output tokens per request "
                     "(`ornith-stack bench --suite serving`, no pacing).")
    else:
        lines.append(result.bench_error or "Not loaded: the engine did not start.")
    if result.roofline:
        r = result.roofline
        lines += ["", f"Roofline (one stream, weights read once per token): {r.tok_s:,.1f} tok/s = "
                  f"{r.bandwidth_gbps:,.0f} GB/s / {r.bytes_per_token / 1e9:.2f} GB of active weights per token."]
    else:
        lines += ["", f"Roofline: {result.roofline_note}"]
    for note in result.notes[1:]:
        lines.append(f"\nNote: {note}")
    return "\n".join(line for line in lines if line is not None) + "\n"
