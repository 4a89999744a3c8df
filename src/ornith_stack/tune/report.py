"""The tuner's products: a Markdown table, a Pareto plot, and the winner as an operator profile."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import asdict
from pathlib import Path

import yaml

from ornith_stack.errors import UserError
from ornith_stack.generate.core import find_root, render
from ornith_stack.generate.profile_files import operator_files
from ornith_stack.profiles import shipped_profile_names, user_profile_dir
from ornith_stack.profiles.model import Profile
from ornith_stack.tune.spec import Slo
from ornith_stack.tune.state import Record

WRITTEN_BY = "Written by `ornith-stack tune`"


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isinf(value) else f"{value:,.0f}"


def table(records: list[Record], slo: Slo, winner: Record | None) -> str:
    """One row per candidate: its changed flags, the planner's word, and its goodput under the SLO."""
    lines = [
        f"SLO: p99 TTFT <= {slo.ttft_p99_ms:g} ms, p99 TPOT <= {slo.tpot_p99_ms:g} ms. Goodput: the highest request "
        "rate whose p99s meet the SLO, and the output tok/s there.",
        "",
        "| candidate | status | goodput rate/s | goodput tok/s | p99 TTFT ms | p99 TPOT ms | acceptance | "
        "highest rate tried | start s | planner |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        best = r.goodput
        shown = best or (min(r.levels, key=lambda lv: lv.miss) if r.levels else None)
        status = r.status if r.status != "measured" else ("meets" if best else f"misses by {r.closest_miss:.0%}")
        name = f"**{r.name}** (winner)" if winner is not None and r.key == winner.key else r.name
        acceptance = f"{r.acceptance_length:.2f}" if r.acceptance_length else "-"
        start = f"{r.start_s:.0f}" if r.start_s is not None else "-"
        top = f"{max(lv.rate for lv in r.levels):g}" if r.levels else "-"
        lines.append(
            f"| {name} | {status} | {f'{best.rate:g}' if best else '-'} | {r.goodput_tok_s:,.1f} | "
            f"{_ms(shown.ttft_p99_ms if shown else None)} | {_ms(shown.tpot_p99_ms if shown else None)} | "
            f"{acceptance} | {top} | {start} | {r.planner.replace('|', '/')} |")
    failures = [r for r in records if r.status == "crashed"]
    for r in failures:
        lines += ["", f"{r.name} crashed: {r.reason}", "```", r.log_tail, "```"]
    return "\n".join(lines) + "\n"


def plot(records: list[Record], slo: Slo, winner: Record | None, path: Path) -> Path:
    """Output tok/s against p99 TTFT: every measured level of every candidate, the SLO's TTFT bound drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    points: list[tuple[float, float]] = []
    for r in records:
        levels = [lv for lv in r.levels if lv.ttft_p99_ms is not None and lv.output_tok_s is not None]
        if not levels:
            continue
        xs = [lv.ttft_p99_ms or 0.0 for lv in levels]
        ys = [lv.output_tok_s or 0.0 for lv in levels]
        points += zip(xs, ys, strict=True)
        is_winner = winner is not None and r.key == winner.key
        ax.plot(xs, ys, marker="o", linewidth=2.5 if is_winner else 1,
                label=f"{r.name} (winner)" if is_winner else r.name)
    front = _pareto(points)
    if front:
        ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="black", linestyle=":",
                linewidth=1, label="Pareto front")
    ax.axvline(slo.ttft_p99_ms, color="red", linestyle="--", label=f"SLO p99 TTFT {slo.ttft_p99_ms:g} ms")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)  # from zero: a 2% difference must not look like a factor of two
    ax.set_xlabel("p99 TTFT (ms)")
    ax.set_ylabel("output tok/s")
    ax.set_title(f"tune: each candidate at rising request rates (SLO also p99 TPOT <= {slo.tpot_p99_ms:g} ms)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both lower TTFT and higher throughput, by rising TTFT."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return front


def write_winner(profile: Profile, winner: Record, name: str, command: str, slo: Slo) -> list[Path]:
    """The winner as an operator profile (as `profiles new` writes one), its measurements beside it, and its
    compose file, Helm values and Ansible variables (in the checkout around the current folder, else beside
    the profile); a profile of that name not written by tune is never replaced."""
    if name in shipped_profile_names():
        raise UserError(f"--name {name!r} is a shipped profile; choose another name")
    folder = user_profile_dir()
    folder.mkdir(parents=True, exist_ok=True)
    profile_file = folder / f"{name}.yaml"
    if profile_file.exists() and WRITTEN_BY not in profile_file.read_text(errors="replace"):
        raise UserError(f"{profile_file} exists and was not written by tune; choose another --name")
    tuned = profile.model_copy(update={"name": name})
    data = tuned.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    data["engine"] = {"kind": profile.engine.kind, "version": profile.engine.version}  # image pin: images.yaml
    best = winner.goodput
    head = [f"{WRITTEN_BY}: `{command}`", f"from profile {profile.name}, candidate {winner.name}.",
            f"Goodput under {slo.text()} (ms): {winner.goodput_tok_s:,.1f} output tok/s at "
            f"{best.rate:g} requests/s." if best else "No level met the SLO; the closest candidate.",
            f"Measurements: {name}.tune.json beside this file."]
    profile_file.write_text("".join(f"# {line}\n" for line in head) + yaml.safe_dump(data, sort_keys=False))
    measurements = folder / f"{name}.tune.json"
    measurements.write_text(json.dumps({"command": command, "slo": asdict(slo), "winner": asdict(winner)}, indent=1))
    try:
        out = find_root()
    except UserError:
        out = folder / name
    written = render(out, operator_files(tuned, profile_file, command))
    return [profile_file, measurements, *(out / w.path for w in written)]


def start_commands(name: str) -> list[str]:
    """How to start the winner: with the compose stack, or its engine command on this machine."""
    return [f"ornith-stack up {shlex.quote(name)}", f"$(ornith-stack launch-args {shlex.quote(name)})"]


def speculation_note(records: list[Record], axis: str, own_depth: object, winner: Record) -> str:
    """Whether the speculative depth changed the winner: the winner's depth against the best candidate that
    kept the profile's depth."""
    tried = sorted({str(r.settings[axis]) for r in records if axis in r.settings and r.status == "measured"})
    if not tried:
        return f"speculative depth: only the profile's ({own_depth}) was measured"
    kept = [r for r in records if axis not in r.settings and r.status == "measured"]
    best_kept = max((r.goodput_tok_s for r in kept), default=0.0)
    if axis not in winner.settings:
        return (f"speculative depth did not change the winner: the profile's {own_depth} stayed best "
                f"(also measured: {', '.join(tried)})")
    depth = winner.settings[axis]
    return (f"speculative depth changed the winner: {axis}={depth} gives {winner.goodput_tok_s:,.1f} tok/s against "
            f"{best_kept:,.1f} for the best candidate at the profile's {own_depth}")
