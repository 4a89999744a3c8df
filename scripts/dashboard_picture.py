"""Draw the Grafana dashboard's main panels from a running Prometheus, with matplotlib.

Grafana cannot run on the build machine (its image cannot be pulled, Debian has no package), so the
README's picture of "what you get" is drawn here from the dashboard's own queries: each panel's PromQL is
read from the dashboard JSON, its variables are filled as Grafana would with "All" selected, and the
range is asked of the Prometheus the stack runs.

    python scripts/dashboard_picture.py --prometheus http://127.0.0.1:9090 --out monitoring/grafana/dashboard.png
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "monitoring" / "grafana" / "dashboards" / "ornith-overview.json"
PANELS = ("Acceptance length (tokens per step)", "Token throughput", "Time to first token",
          "Inter-token latency", "KV cache and mamba slot usage", "Requests running and queued")
# What Grafana puts in place of the dashboard's variables with every value selected; the range is the
# picture's own, so $__rate_interval is a fixed window of four 15 s scrapes.
VARIABLES = {"$profile": ".*", "$target": ".*", "$__rate_interval": "1m"}
STEP_S = 15


def panel_queries(dashboard: dict[str, Any], title: str) -> list[tuple[str, str]]:
    """(PromQL, legend format) of the panel called `title`, its variables filled."""
    for panel in dashboard.get("panels", []):
        if panel.get("title") == title:
            queries = []
            for target in panel.get("targets", []):
                expr = str(target.get("expr", ""))
                for name, value in VARIABLES.items():
                    expr = expr.replace(name, value)
                queries.append((expr, str(target.get("legendFormat", ""))))
            return queries
    raise SystemExit(f"error: the dashboard has no panel {title!r}")


def query_range(prometheus: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    answer = httpx.get(f"{prometheus}/api/v1/query_range",
                       params={"query": expr, "start": start, "end": end, "step": STEP_S}, timeout=30)
    body = answer.json()
    if body.get("status") != "success":
        raise SystemExit(f"error: Prometheus refused {expr!r}: {body.get('error', answer.text[:200])}")
    return list(body["data"]["result"])


def panel_unit(dashboard: dict[str, Any], title: str) -> str:
    """The panel's Grafana unit as an axis label ("suffix: tok/s" is Grafana's custom unit tok/s)."""
    panel = next(p for p in dashboard.get("panels", []) if p.get("title") == title)
    unit = str(panel.get("fieldConfig", {}).get("defaults", {}).get("unit", ""))
    return {"percentunit": "fraction", "none": "", "short": "requests"}.get(unit, unit.removeprefix("suffix: "))


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), fmt) or str(labels)


def draw(prometheus: str, minutes: float, out: Path) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dashboard = json.loads(DASHBOARD.read_text())
    end = time.time()
    start = end - minutes * 60
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.5))
    drawn = 0
    for ax, title in zip(axes.flat, PANELS, strict=True):
        for expr, fmt in panel_queries(dashboard, title):
            for series in query_range(prometheus, expr, start, end):
                points = [(float(t) - end, float(v)) for t, v in series["values"] if v not in ("NaN", "+Inf")]
                if points:
                    ax.plot([t / 60 for t, _ in points], [v for _, v in points], label=legend(fmt, series["metric"]))
                    drawn += 1
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("minutes before now")
        ax.set_ylabel(panel_unit(dashboard, title))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"{dashboard.get('title', 'dashboard')}: the dashboard's queries over {prometheus}, "
                 f"last {minutes:g} min ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(end))})")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    print(f"{out}: {drawn} series in {len(PANELS)} panels")
    return 0 if drawn else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus base URL")
    parser.add_argument("--minutes", type=float, default=10.0, help="how far back to draw")
    parser.add_argument("--out", type=Path, default=REPO / "monitoring" / "grafana" / "dashboard.png")
    args = parser.parse_args(argv)
    try:
        return draw(args.prometheus.rstrip("/"), args.minutes, args.out)
    except httpx.HTTPError as exc:
        print(f"error: cannot read {args.prometheus}: {exc} (is the stack up? `ornith-stack status`)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
