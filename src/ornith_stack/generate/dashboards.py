"""Grafana dashboards built from the metrics catalogue, written as JSON with fixed uids.

Plain typed builders (no SDK): a `Panel` is a title, a unit and its PromQL targets; `dashboard()` lays
them out on Grafana's 24-column grid. Compose and the Helm chart provision the same JSON files.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ornith_stack.deployment import GRAFANA_DATASOURCE_UID as DATASOURCE_UID
from ornith_stack.exporter import catalogue as C
from ornith_stack.generate import prometheus as R
from ornith_stack.generate.core import GeneratedFile, with_header

DASHBOARD_DIR = "monitoring/grafana/dashboards"
SOURCE = "src/ornith_stack/generate/dashboards.py"
SELECT = '{profile=~"$profile", target=~"$target"}'
SCHEMA_VERSION = 39  # Grafana 11.x


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = "{{target}}"
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # timeseries, stat, table
    description: str = ""
    width: int = 12
    height: int = 8
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def sel(metric: C.Metric | C.Recorded | str, extra: str = "") -> str:
    """A series with the dashboard's profile/target selection (and `extra` matchers)."""
    name = metric if isinstance(metric, str) else metric.series
    inner = SELECT[1:-1] + (f", {extra}" if extra else "")
    return f"{name}{{{inner}}}"


def quantile(q: float, metric: C.Metric) -> str:
    return (f"histogram_quantile({q}, sum by (target, le) "
            f"(rate({metric.bucket}{SELECT}[$__rate_interval])))")


def latency_panel(title: str, histogram: C.Metric) -> Panel:
    """p50 and p95 of an engine latency histogram passed through by the exporter."""
    return Panel(title, (
        Query(quantile(0.5, histogram), "{{target}} p50"),
        Query(quantile(0.95, histogram), "{{target}} p95"),
    ), unit="s", min=0, description=histogram.help)


def overview_rows() -> tuple[Row, ...]:
    return (
        Row("Speculative decoding", (
            Panel("Acceptance length (tokens per step)", (
                Query(sel(C.SPEC_ACCEPTANCE_LENGTH), "{{target}} scrape window"),
                Query(sel(R.ACCEPTANCE_5M), "{{target}} 5m"),
                Query(f'{R.EXPECTED_ACCEPTANCE}{{profile=~"$profile"}}', "expected {{profile}} ({{task}})"),
            ), unit="none", min=1, description=C.SPEC_ACCEPTANCE_LENGTH.help),
            Panel("Draft acceptance rate", (
                Query(sel(C.SPEC_DRAFT_ACCEPTANCE_RATIO), "{{target}}"),
            ), unit="percentunit", min=0, max=1, description=C.SPEC_DRAFT_ACCEPTANCE_RATIO.help),
            Panel("Acceptance by draft position", (
                Query(sel(C.SPEC_POSITION_ACCEPTANCE_RATIO), "{{target}} position {{position}}"),
            ), unit="percentunit", min=0, max=1, width=24, description=C.SPEC_POSITION_ACCEPTANCE_RATIO.help),
        )),
        Row("Throughput and latency", (
            Panel("Generation throughput", (
                Query(sel(C.GENERATION_TOKENS_PER_SECOND), "{{target}} generated"),
                Query(sel(C.PROMPT_TOKENS_PER_SECOND), "{{target}} prompt"),
            ), unit="tokens/s", min=0, description=C.GENERATION_TOKENS_PER_SECOND.help),
            latency_panel("Time to first token", C.TTFT),
            latency_panel("Inter-token latency", C.ITL),
            latency_panel("End-to-end request latency", C.E2E),
        )),
        Row("Load", (
            Panel("KV cache usage", (Query(sel(C.KV_CACHE_USAGE)),), unit="percentunit", min=0, max=1,
                  description=C.KV_CACHE_USAGE.help),
            Panel("Requests running and queued", (
                Query(sel(C.REQUESTS_RUNNING), "{{target}} running"),
                Query(sel(C.REQUESTS_WAITING), "{{target}} waiting"),
            ), unit="short", min=0, description=C.REQUESTS_WAITING.help),
        )),
        Row("Canary", (
            Panel("Canary answer", (
                Query(sel(C.CANARY_SUCCESS), "{{target}} completed"),
                Query(sel(C.CANARY_CORRECT), "{{target}} correct"),
            ), unit="bool", min=0, max=1, width=8, description=C.CANARY_CORRECT.help),
            Panel("Canary time to first token", (Query(sel(C.CANARY_TTFT)),), unit="s", min=0, width=8,
                  description=C.CANARY_TTFT.help),
            Panel("Canary decode speed", (Query(sel(C.CANARY_DECODE_RATE)),), unit="tokens/s", min=0, width=8,
                  description=C.CANARY_DECODE_RATE.help),
        )),
        Row("Engines and exporter", (
            Panel("Engines", (Query(sel(C.ENGINE_INFO), "", instant=True),), kind="table", width=24, height=6,
                  description=C.ENGINE_INFO.help),
            Panel("Engine up", (Query(sel(C.ENGINE_UP)),), unit="bool", min=0, max=1, width=8,
                  description=C.ENGINE_UP.help),
            Panel("Scrape errors", (
                Query(f"sum by (target, reason) (rate({sel(C.SCRAPE_ERRORS)}[$__rate_interval]))",
                      "{{target}} {{reason}}"),
            ), unit="ops", min=0, width=8, description=C.SCRAPE_ERRORS.help),
            Panel("Scrape duration", (Query(sel(C.SCRAPE_DURATION)),), unit="s", min=0, width=8,
                  description=C.SCRAPE_DURATION.help),
        )),
    )


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    datasource = {"type": "prometheus", "uid": DATASOURCE_UID}
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    targets = [{"datasource": datasource, "refId": chr(ord("A") + i), "expr": q.expr, "legendFormat": q.legend,
                "instant": q.instant, "range": not q.instant}
               for i, q in enumerate(panel.queries)]
    body: dict[str, Any] = {
        "id": pid, "type": panel.kind, "title": panel.title, "description": panel.description,
        "datasource": datasource, "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []}, "targets": targets,
    }
    if panel.kind == "table":
        body["targets"][0]["format"] = "table"
        body["transformations"] = [{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True,
                                                                                    "__name__": True}}}]
    else:
        body["options"] = {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
    return body


def _variable(name: str, query: str) -> dict[str, Any]:
    return {"name": name, "label": name, "type": "query", "query": {"query": query, "refId": name},
            "definition": query, "datasource": {"type": "prometheus", "uid": DATASOURCE_UID},
            "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}


def dashboard(uid: str, title: str, rows: Iterable[Row]) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y = 1, 0
    for row in rows:
        panels.append({"id": pid, "type": "row", "title": row.title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y, x, line_height = pid + 1, y + 1, 0, 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel_json(panel, pid, x, y))
            pid, x, line_height = pid + 1, x + panel.width, max(line_height, panel.height)
        y += line_height
    up = C.ENGINE_UP.series
    return {
        "uid": uid, "title": title, "tags": ["ornith-stack"],
        "description": "Speculative decoding, throughput, latency, load and canary of the Ornith engines.",
        "timezone": "browser", "editable": False,
        "schemaVersion": SCHEMA_VERSION, "version": 1, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [
            _variable("profile", f"label_values({up}, profile)"),
            _variable("target", f'label_values({up}{{profile=~"$profile"}}, target)'),
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


DASHBOARDS = {"ornith-overview": ("Ornith: speculative decoding overview", overview_rows)}


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of a built dashboard; tests run them against Prometheus."""
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]


def build(uid: str) -> dict[str, Any]:
    title, rows = DASHBOARDS[uid]
    return dashboard(uid, title, rows())


def text(uid: str) -> str:
    """A dashboard's JSON file as written under monitoring/grafana/dashboards/ and into the Helm chart."""
    return with_header(SOURCE, build(uid), "json")


def files(root: Path) -> Iterator[GeneratedFile]:
    for uid in DASHBOARDS:
        yield GeneratedFile(f"{DASHBOARD_DIR}/{uid}.json", SOURCE, partial(text, uid))
