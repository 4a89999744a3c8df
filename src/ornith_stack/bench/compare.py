"""This run against a baseline run (`--baseline RESULT.json`), the seed's figures and the roofline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ornith_stack.bench import stats
from ornith_stack.bench.roofline import roofline_for
from ornith_stack.errors import UserError
from ornith_stack.profiles.model import Profile
from ornith_stack.reading import read_json_object


def load_result(path: Path) -> dict[str, Any]:
    """A previous bench result (the JSON this command writes); anything else is a one-line error."""
    try:
        data = read_json_object(path)
    except UserError as exc:
        raise UserError(f"--baseline: {exc}") from None
    if not isinstance(data.get("suites"), dict):
        raise UserError(f"--baseline {path}: not an ornith-stack bench result (no 'suites')")
    return data


def figures(result: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of one result: decode median, per task decode, pass rate and acceptance,
    total throughput per concurrency."""
    suites = result.get("suites", {})
    tasks = suites.get("tasks", {}).get("tasks", {})
    essay = _median(suites.get("decode", {}).get("decode_tok_s"))
    return {
        # Seed 000's headline comes from the task runs: all tasks' decode tokens over their decode time;
        # the essay prompts (ignore_eos) are a separate figure, and the headline only without tasks.
        "decode_tok_s": _task_decode(tasks) or essay,
        "decode_source": "tasks" if _task_decode(tasks) else "essays" if essay else None,
        "essay_decode_tok_s": essay,
        "ttft_s": _median(suites.get("decode", {}).get("ttft_s")),
        "acceptance_length": {t: _acceptance(v) for t, v in tasks.items()},
        "accuracy": {t: v.get("accuracy") for t, v in tasks.items()},
        "task_decode_tok_s": {t: v.get("task_decode_tok_s") or _median(v.get("decode_tok_s")) for t, v in tasks.items()},
        "task_throughput": {t: {str(x["concurrency"]): x.get("output_tok_s") for x in v.get("throughput") or []}
                            for t, v in tasks.items()},
        "decode_acceptance_length": suites.get("decode", {}).get("acceptance_length"),
        "concurrency_tok_s": {
            str(level.get("concurrency")): level.get("output_tok_s")
            for level in suites.get("concurrency", {}).get("levels", [])
        },
    }


def compare(result: dict[str, Any], profile: Profile | None, baseline: dict[str, Any] | None,
            baseline_name: str = "") -> dict[str, Any]:
    ours = figures(result)
    out: dict[str, Any] = {"this_run": ours}
    if baseline is not None:
        base = figures(baseline)
        out["baseline"] = base | {"file": baseline_name, "url": baseline.get("url")}
        # Like with like: task decode against task decode, essays against essays.
        same = ours["decode_source"] == base["decode_source"]
        out["speedup_vs_baseline"] = (stats.ratio(ours["decode_tok_s"], base["decode_tok_s"]) if same
                                      else stats.ratio(ours["essay_decode_tok_s"], base["essay_decode_tok_s"]))
        out["speedup_per_task_vs_baseline"] = _ratios(ours["task_decode_tok_s"], base["task_decode_tok_s"])
        out["concurrency_speedup_vs_baseline"] = _ratios(ours["concurrency_tok_s"], base["concurrency_tok_s"])
        out["task_throughput_speedup_vs_baseline"] = {
            task: _ratios(levels, base["task_throughput"].get(task, {})) for task, levels in ours["task_throughput"].items()
        }
    if profile is not None and profile.expected is not None:
        seed = profile.expected.model_dump(mode="json")
        out["seed"] = seed
        out["percent_of_seed_decode"] = _percent(ours["decode_tok_s"], seed.get("decode_tok_s"))
        out["speedup_vs_seed_baseline"] = stats.ratio(ours["decode_tok_s"], seed.get("baseline_decode_tok_s"))
        out["speedup_per_task_vs_seed_baseline"] = {
            task: stats.ratio(rate, seed.get("baseline_decode_tok_s"))
            for task, rate in ours["task_decode_tok_s"].items()
        }
    if profile is not None:
        roof, why = roofline_for(profile)
        out["roofline"] = roof.to_json() | {"percent": roof.percent(ours["decode_tok_s"])} if roof else None
        if why:
            out["roofline_note"] = why
    return out


def _task_decode(tasks: dict[str, Any]) -> float | None:
    return stats.ratio(sum(t.get("decode_tokens") or 0 for t in tasks.values()),
                       sum(t.get("decode_seconds") or 0 for t in tasks.values()))


def _acceptance(task: dict[str, Any]) -> float | None:
    """Seed 004's figure (per-request mean at concurrency 1) where the requests have it, else the
    task window's counters."""
    return (task.get("acceptance") or {}).get("per_request_mean") or task.get("acceptance_length")


def _median(summary: Any) -> float | None:
    return summary.get("median") if isinstance(summary, dict) else None


def _ratios(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float | None]:
    return {key: stats.ratio(value, theirs.get(key)) for key, value in ours.items() if key in theirs}


def _percent(value: float | None, reference: float | None) -> float | None:
    r = stats.ratio(value, reference)
    return 100.0 * r if r is not None else None
