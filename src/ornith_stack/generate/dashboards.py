"""Grafana dashboards built from the metrics catalogue, written as JSON with fixed uids.

Plain typed builders (no SDK): a `Panel` is a title, a unit and its PromQL targets; `dashboard()` lays
them out on Grafana's 24-column grid. Compose and the Helm chart provision the same JSON files.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ornith_stack.deployment import GRAFANA_DATASOURCE_UID as DATASOURCE_UID  # noqa: F401 (the provisioned default)
from ornith_stack.deployment import OVERVIEW_DASHBOARD_UID
from ornith_stack.engines import ADAPTERS
from ornith_stack.exporter import catalogue as C
from ornith_stack.generate.alerts import (
    ABORTED_SHARE,
    ACCEPTANCE_FRACTION,
    CACHE_FILLING_SHARE,
    CACHE_NEARLY_FULL_SHARE,
    GATEWAY_HEALTH,
    MIN_VERIFY_STEPS_PER_S,
)
from ornith_stack.generate.core import GeneratedFile, with_header

DASHBOARD_DIR = "monitoring/grafana/dashboards"
SOURCE = "src/ornith_stack/generate/dashboards.py"
# Each data-parallel replica is one exporter target (in Helm's sidecars the pod's name): the variable
# `target`, shown as "Replica", selects replicas, and per-replica panels group by this label.
REPLICA = "target"
SELECT = f'{{profile=~"$profile", {REPLICA}=~"${REPLICA}"}}'
SCHEMA_VERSION = 39  # Grafana 11.x
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}  # the dashboard's datasource variable
ENGINES = tuple(ADAPTERS)
TOKENS_PER_S = "suffix: tok/s"  # Grafana's custom-suffix unit; "tokens/s" is no unit id
# The Model Gateway's own series (sglang-router 0.3.2, tests/fixtures/gateway/metrics.txt), by `worker`: the
# replica's URL as the gateway routes to it. Prometheus' gateway job labels them with the gateway's own
# target, so they are selected by profile only.
GATEWAY_OUTCOMES = "smg_worker_cb_outcomes_total"  # requests per worker, by outcome (circuit breaker's count)
GATEWAY_SELECT = '{profile=~"$profile"}'
# The host's series (GPUs, the model cache) carry the exporter's profile and no target: selected by profile, and
# told apart by the exporter's `instance` (a compose host, or a Helm sidecar's pod).
HOST_SELECT = GATEWAY_SELECT


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
    # The engines whose metrics can fill it; the others are named. Empty: another component's metrics
    # (the Model Gateway's), which the description names.
    engines: tuple[str, ...] = ENGINES

    @property
    def full_description(self) -> str:
        missing = [name for name in ENGINES if name not in self.engines]
        if not missing or not self.engines:
            return self.description
        names = " and ".join(ADAPTERS[name].display_name for name in missing)
        return f"{self.description} {names} does not export this: the panel stays empty for its engines.".strip()


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def sel(metric: C.Metric | C.Recorded | str, extra: str = "") -> str:
    """A series with the dashboard's profile/target selection (and `extra` matchers)."""
    name = metric if isinstance(metric, str) else metric.series
    inner = SELECT[1:-1] + (f", {extra}" if extra else "")
    return f"{name}{{{inner}}}"


# Quantiles of every histogram panel: p95 is what the TTFT alert reads.
QUANTILES = (0.5, 0.9, 0.95, 0.99)


def quantiles(bucket: str, title: str, unit: str, description: str, engines: tuple[str, ...] = ENGINES,
              width: int = 12) -> Panel:
    """p50, p90, p95, p99 and the mean of a histogram (`bucket`: its _bucket series, any name)."""
    return Panel(title, (
        *(Query(quantile_expr(q, bucket), f"{{{{target}}}} p{round(q * 100)}") for q in QUANTILES),
        Query(mean_expr(bucket), "{{target}} mean"),
    ), unit=unit, min=0, description=description, engines=engines, width=width)


def mean_expr(bucket: str) -> str:
    """The histogram's mean over the rate interval: rate of its _sum over rate of its _count."""
    base = bucket.removesuffix("_bucket")
    return f"{rate_by(base + '_sum', 'target')} / ({rate_by(base + '_count', 'target')} > 0)"


def heatmap(bucket: str, title: str, unit: str, description: str, engines: tuple[str, ...] = ENGINES,
            width: int = 12) -> Panel:
    return Panel(title, (Query(f"sum by (le) (rate({bucket}{SELECT}[$__rate_interval]))", "{{le}}"),),
                 unit=unit, kind="heatmap", description=description, engines=engines, width=width)


def latency_panels(title: str, histogram: C.Metric) -> tuple[Panel, Panel]:
    """p50/p90/p99 and a heatmap of an engine latency histogram passed through by the exporter."""
    return (quantiles(histogram.bucket, title, "s", histogram.help),
            heatmap(histogram.bucket, f"{title}: distribution", "s", histogram.help))


# The engines' request length histograms: (bucket, title, what one observation is, engines).
LENGTHS = tuple((bucket, title, help_, (a.kind,)) for a in ADAPTERS.values() for bucket, title, help_ in a.length_histograms)


def length_panels(make: Callable[..., Panel], suffix: str = "") -> tuple[Panel, ...]:
    """One quarter-width panel per request length histogram, made by `quantiles` or `heatmap`."""
    return tuple(make(bucket, title + suffix, "short", help_, engines, width=6)
                 for bucket, title, help_, engines in LENGTHS)


def rate_by(series: str, by: str, extra: str = "") -> str:
    return f"sum by ({by}) (rate({sel(series, extra)}[$__rate_interval]))"


class EngineQueries:
    """The dashboard's query writing, as the engine adapters use it for the panels of their own series."""

    sel = staticmethod(sel)

    @staticmethod
    def rate_by(series: str, by: str) -> str:
        return rate_by(series, by)


def engine_queries(panel: str) -> tuple[tuple[Query, ...], tuple[str, ...]]:
    """(queries, engines) of an engine panel: each adapter's queries of its own series, in engine order."""
    found = {a.kind: a.panel_queries(EngineQueries()).get(panel, ()) for a in ADAPTERS.values()}
    return tuple(Query(*q) for qs in found.values() for q in qs), tuple(k for k, qs in found.items() if qs)


def histogram_buckets(*panels: str) -> tuple[tuple[str, str], ...]:
    """(engine, bucket) of the engines' latency histograms for these panels, in engine and panel order."""
    return tuple((a.kind, a.histograms[p]) for a in ADAPTERS.values() for p in panels if p in a.histograms)


def engine_panel(panel: str, title: str, *extra: Query, **options: Any) -> Panel:
    """A panel of the engines' own series (their queries from the adapters), then `extra` queries."""
    queries, engines = engine_queries(panel)
    return Panel(title, queries + extra, engines=engines, **options)


def expected_acceptance(fraction: float = 1.0) -> str:
    """The selected profiles' published acceptance length (its lowest task), times `fraction`."""
    scale = "" if fraction == 1.0 else f"{fraction:g} * "
    return (f'{scale}max by (profile, task) ({C.EXPECTED_ACCEPTANCE}) and on (profile) '
            f'count by (profile) ({C.ENGINE_UP.series}{{profile=~"$profile"}})')


def per_replica_row() -> Row:
    """Each profile's pool of replicas in total, and each replica on its own below: one replica that
    accepts less, decodes slower or queues more shows as its own line instead of moving an average."""
    acceptance, steps = sel(C.SPEC_ACCEPTANCE_LENGTH.name), sel(C.SPEC_VERIFY_STEPS_PER_SECOND.name)
    decode = sel(C.GENERATION_TOKENS_PER_SECOND)
    queue = ((sel(C.REQUESTS_WAITING), "waiting"), (sel(C.REQUESTS_RUNNING), "running"))
    # 1 + accepted / steps of the pool: each replica's acceptance length weighted by its verification steps.
    pooled = f"sum by (profile) ({acceptance} * {steps}) / (sum by (profile) ({steps}) > 0)"
    totals = (
        Panel("Acceptance length, all replicas", (
            Query(pooled, "{{profile}} all replicas"),
            Query(expected_acceptance(), "expected {{profile}} ({{task}})"),
        ), unit="none", min=1, width=8, description="Tokens per verification step of all selected replicas of "
          "a profile together (accepted / steps over 5 minutes, each replica weighted by its steps)."),
        Panel("Decode throughput, all replicas", (
            Query(f"sum by (profile) ({decode})", "{{profile}} all replicas"),
        ), unit=TOKENS_PER_S, min=0, width=8, description=f"Sum over the selected replicas of a profile. "
          f"{C.GENERATION_TOKENS_PER_SECOND.help}"),
        Panel("Requests queued and running, all replicas", tuple(
            Query(f"sum by (profile) ({series})", f"{{{{profile}}}} {what}") for series, what in queue
        ), unit="short", min=0, width=8, description="Sum over the selected replicas of a profile."),
    )
    by_replica = (
        Panel("Acceptance length by replica", (
            Query(f"sum by ({REPLICA}) ({acceptance})"),
            Query(expected_acceptance(ACCEPTANCE_FRACTION), "acceptance alert's threshold {{profile}}"),
        ), unit="none", min=1, width=8, description=f"{C.SPEC_ACCEPTANCE_LENGTH.help} The acceptance alert "
          f"fires per replica below {ACCEPTANCE_FRACTION:.0%} of the profile's published figure."),
        Panel("Decode throughput by replica", (Query(f"sum by ({REPLICA}) ({decode})"),),
              unit=TOKENS_PER_S, min=0, width=8, description=C.GENERATION_TOKENS_PER_SECOND.help),
        Panel("Requests queued and running by replica", tuple(
            Query(f"sum by ({REPLICA}) ({series})", f"{{{{{REPLICA}}}}} {what}") for series, what in queue
        ), unit="short", min=0, width=8,
          description=f"{C.REQUESTS_WAITING.help} The queue alert fires per replica."),
    )
    gateway = (
        Panel("Gateway: requests per replica", (
            Query(f"sum by (worker, outcome) (rate({GATEWAY_OUTCOMES}{GATEWAY_SELECT}[$__rate_interval]))",
                  "{{worker}} {{outcome}}"),
        ), unit="reqps", min=0, engines=(), description="Requests the Model Gateway sent to each replica "
          "(`worker`: its URL as the gateway routes to it), by outcome. Empty without a gateway (one replica)."),
        Panel("Gateway: replica health", (Query(f"{GATEWAY_HEALTH}{GATEWAY_SELECT}", "{{worker}}"),),
              unit="none", min=-1, max=1, engines=(), description="1 while the Model Gateway's health checks "
              "pass the replica (it routes to it), 0 once they fail, -1 while it is out of the gateway's rotation "
              "(a rolling change, or a pod gone from discovery). Empty without a gateway (one replica)."),
    )
    return Row("Per replica", totals + by_replica + gateway)


def host(metric: C.Metric, extra: str = "") -> str:
    return f"{metric.series}{{{HOST_SELECT[1:-1]}{', ' + extra if extra else ''}}}"


def host_row() -> Row:
    """What users feel that no engine counter says: the GPUs (NVML through the exporter), the model cache's disk,
    and clients giving up (aborted requests)."""
    gpu = "{{instance}} GPU {{gpu}}"
    free_share = f"{host(C.MODEL_CACHE_FREE)} / {host(C.MODEL_CACHE_SIZE)}"
    aborted, finished = rate_by(C.REQUESTS_ABORTED.series, "target"), rate_by(C.REQUESTS_FINISHED.series, "target")
    return Row("GPUs, model cache and aborts", (
        Panel("GPU memory", (
            Query(host(C.GPU_MEMORY_USED), f"{gpu} used"),
            Query(host(C.GPU_MEMORY_TOTAL), f"{gpu} total"),
        ), unit="bytes", min=0, width=8, engines=(), description=f"{C.GPU_MEMORY_USED.help} No alert reads it: "
          "a lost GPU pages (OrnithGpuLost), a full one does not."),
        Panel("GPU utilization", (Query(host(C.GPU_UTILIZATION), gpu),), unit="percentunit", min=0, max=1, width=8,
              engines=(), description=C.GPU_UTILIZATION.help),
        Panel("GPUs and NVML answering", (
            Query(host(C.GPU_UP), gpu),
            Query(host(C.GPU_NVML_STATE, 'state="error"') + " == 1", "{{instance}} NVML failing"),
        ), unit="bool", min=0, max=1, width=8, engines=(), description=f"{C.GPU_UP.help} NVML failing as a whole "
          "(OrnithNvmlFailing) shows as its own line. Empty on a host without NVIDIA GPUs (state no_gpu)."),
        Panel("Model cache free", (
            Query(free_share, "{{instance}} {{path}}"),
            Query(f"vector({CACHE_NEARLY_FULL_SHARE:g})", "ticket below"),
            Query(f"vector({CACHE_FILLING_SHARE:g})", "page below, if still falling"),
        ), unit="percentunit", min=0, max=1, width=8, engines=(), description=f"{C.MODEL_CACHE_FREE.help} As a share "
          "of the file system's size: below the ticket line OrnithModelCacheDiskNearlyFull fires, below the page "
          "line OrnithModelCacheDiskFillingUp pages when the 6-hour trend runs out within 4 hours."),
        Panel("Model cache bytes", (
            Query(host(C.MODEL_CACHE_FREE), "{{instance}} {{path}} free"),
            Query(host(C.MODEL_CACHE_SIZE), "{{instance}} {{path}} size"),
        ), unit="bytes", min=0, width=8, engines=(), description=C.MODEL_CACHE_SIZE.help),
        Panel("Client aborts", (
            Query(f"{aborted} / ({finished} > 0)", "{{target}} aborted"),
            Query(f"vector({ABORTED_SHARE:g})", "ticket above (1h, 20+ requests)"),
        ), unit="percentunit", min=0, max=1, width=8, description=f"{C.REQUESTS_ABORTED.help} Share of the finished "
          "requests; the ticket (OrnithClientAbortsHigh) reads the profile's last hour."),
    ))


def overview_rows() -> tuple[Row, ...]:
    expected = expected_acceptance()
    draft, accepted = rate_by(C.SPEC_DRAFT_TOKENS.series, "target"), rate_by(C.SPEC_ACCEPTED_TOKENS.series, "target")
    return (
        Row("Speculative decoding", (
            Panel("Acceptance length (tokens per step)", (
                Query(sel(C.SPEC_ACCEPTANCE_LENGTH.name), "{{target}} 5m"),
                Query(sel(C.SPEC_ENGINE_ACCEPTANCE_LENGTH), "{{target}} engine's own"),
                Query(expected, "expected {{profile}} ({{task}})"),
            ), unit="none", min=1, description=C.SPEC_ACCEPTANCE_LENGTH.help
              + " The expected line is the running profile's published figure, where it publishes one."),
            Panel("Draft acceptance rate", (
                Query(sel(C.SPEC_DRAFT_ACCEPTANCE_RATIO), "{{target}}"),
            ), unit="percentunit", min=0, max=1, description=C.SPEC_DRAFT_ACCEPTANCE_RATIO.help),
            Panel("Speculative token flow", (
                Query(draft, "{{target}} proposed"),
                Query(accepted, "{{target}} accepted"),
                Query(f"{draft} - {accepted}", "{{target}} rejected"),
            ), unit=TOKENS_PER_S, min=0, description="Drafted tokens proposed, accepted and rejected per second "
              "(rejected = proposed - accepted). SGLang's proposed count is verify steps x (draft tokens - 1)."),
            Panel("Verification steps per second", (
                Query(sel(C.SPEC_VERIFY_STEPS_PER_SECOND.name), "{{target}}"),
                Query(f"vector({MIN_VERIFY_STEPS_PER_S:g})", "acceptance alert's minimum"),
            ), unit="ops", min=0, description=C.SPEC_VERIFY_STEPS_PER_SECOND.help
              + f" Below {MIN_VERIFY_STEPS_PER_S:g} steps/s the acceptance alert stays quiet (too little traffic)."),
            Panel("Acceptance by draft position", (
                Query(sel(C.SPEC_POSITION_ACCEPTANCE_RATIO), "{{target}} position {{position}}"),
            ), unit="percentunit", min=0, max=1, description=C.SPEC_POSITION_ACCEPTANCE_RATIO.help,
              engines=tuple(k for k, a in ADAPTERS.items() if a.counts_per_position)),
        )),
        per_replica_row(),
        Row("Throughput", (
            Panel("Token throughput", (
                Query(sel(C.GENERATION_TOKENS_PER_SECOND), "{{target}} decode"),
                Query(sel(C.PROMPT_TOKENS_PER_SECOND), "{{target}} prompt"),
            ), unit=TOKENS_PER_S, min=0, description=C.GENERATION_TOKENS_PER_SECOND.help),
            engine_panel(
                "finished", "Requests by finish reason, and errors",
                Query(rate_by(C.SCRAPE_ERRORS.series, "target"), "{{target}} scrape errors"),
                unit="reqps", min=0, description="Finished requests per second (vLLM by finish reason: stop, "
              "length, abort; SGLang all and aborted), and failed scrapes of the engine."),
        )),
        Row("Latency", (
            *latency_panels("Time to first token", C.TTFT),
            *latency_panels("Inter-token latency", C.ITL),
            *latency_panels("End-to-end request latency", C.E2E),
            *(quantiles(bucket, "Time per output token (TPOT)", "s",
                        "Mean time per output token of each request (after the first).", (kind,))
              for kind, bucket in histogram_buckets("tpot")),
            histogram_panel(("queue_time",), "Queue time",
                            "Time requests waited in the engine's queue before scheduling."),
            histogram_panel(("prefill_time", "decode_time"), "Prefill and decode time",
                            "Time each request spent in prefill and in decode."),
        )),
        Row("Requests and caches", (
            *length_panels(quantiles),
            *length_panels(heatmap, ": distribution"),
            engine_panel("prefix_cache", "Prefix cache hit rate", unit="percentunit", min=0, max=1, description="Share of prompt tokens served from the prefix "
              "cache (vLLM hits / queries; SGLang's radix cache_hit_rate gauge)."),
            engine_panel("preemptions", "Preemptions", unit="ops", min=0, description="Requests preempted (vLLM) or retracted (SGLang) for lack of "
              "KV cache; they recompute later. SGLang shows 0 until its first retraction creates the counter."),
            Panel("KV cache and mamba slot usage", (
                Query(sel(C.KV_CACHE_USAGE), "{{target}} KV"),
                Query(sel(C.MAMBA_CACHE_USAGE), "{{target}} mamba slots"),
            ), unit="percentunit", min=0, max=1, description=f"{C.KV_CACHE_USAGE.help} {C.MAMBA_CACHE_USAGE.help}"),
            Panel("Requests running and queued", (
                Query(sel(C.REQUESTS_RUNNING), "{{target}} running"),
                Query(sel(C.REQUESTS_WAITING), "{{target}} waiting"),
            ), unit="short", min=0, description=C.REQUESTS_WAITING.help),
            engine_panel("waiting_by_reason", "Waiting requests by reason", unit="short", min=0, description="Requests waiting, by why: capacity (no room to "
              "schedule them) or deferred (transient constraints such as a KV transfer)."),
        )),
        host_row(),
        Row("Canary", (
            Panel("Canary answer", (
                Query(sel(C.CANARY_SUCCESS), "{{target}} completed"),
                Query(sel(C.CANARY_CORRECT), "{{target}} correct"),
            ), unit="bool", min=0, max=1, width=6, description=C.CANARY_CORRECT.help),
            Panel("Canary time to first token", (Query(sel(C.CANARY_TTFT)),), unit="s", min=0, width=6,
                  description=C.CANARY_TTFT.help),
            Panel("Canary decode speed", (Query(sel(C.CANARY_DECODE_RATE)),), unit=TOKENS_PER_S, min=0, width=6,
                  description=C.CANARY_DECODE_RATE.help),
            Panel("Time since the last canary run", (Query(f"time() - {sel(C.CANARY_LAST_RUN)}"),), unit="s",
                  min=0, width=6, description=C.CANARY_LAST_RUN.help),
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


def histogram_panel(panels: tuple[str, ...], title: str, description: str) -> Panel:
    """p50, p95 and p99 of the engines' latency histograms for `panels` (legend: the phase when several)."""
    queries = tuple(
        Query(quantile_expr(q, bucket), f"{{{{target}}}} {phase}p{round(q * 100)}")
        for panel in panels for kind, bucket in histogram_buckets(panel)
        for phase in [panel.removesuffix("_time") + " " if len(panels) > 1 else ""] for q in (0.5, 0.95, 0.99))
    found = {kind for kind, _ in histogram_buckets(*panels)}
    return Panel(title, queries, unit="s", min=0, description=description,
                 engines=tuple(k for k in ENGINES if k in found))


def quantile_expr(q: float, bucket: str) -> str:
    return f"histogram_quantile({q}, sum by (target, le) (rate({bucket}{SELECT}[$__rate_interval])))"


def _panel_json(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    datasource = DATASOURCE
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    targets = [{"datasource": datasource, "refId": chr(ord("A") + i), "expr": q.expr, "legendFormat": q.legend,
                "instant": q.instant, "range": not q.instant}
               for i, q in enumerate(panel.queries)]
    body: dict[str, Any] = {
        "id": pid, "type": panel.kind, "title": panel.title, "description": panel.full_description,
        "datasource": datasource, "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []}, "targets": targets,
    }
    if panel.kind == "heatmap":
        body["targets"][0]["format"] = "heatmap"
        body["options"] = {"calculate": False, "yAxis": {"unit": panel.unit}, "cellGap": 1}
    elif panel.kind == "table":
        body["targets"][0]["format"] = "table"
        body["transformations"] = [{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True,
                                                                                    "__name__": True}}}]
    else:
        body["options"] = {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
    return body


def _variable(name: str, label: str, query: str, description: str) -> dict[str, Any]:
    return {"name": name, "label": label, "description": description, "type": "query", "query": query,
            "datasource": DATASOURCE,
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
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "refresh": 1, "hide": 0, "includeAll": False, "multi": False},
            _variable("profile", "Profile", f"label_values({up}, profile)", "The served profile."),
            # Named `target` (the label it selects, the URL parameter var-target of saved links), shown as
            # "Replica": each replica is one engine target.
            _variable(REPLICA, "Replica", f'label_values({up}{{profile=~"$profile"}}, {REPLICA})',
                      "Engine targets of the selected profiles: one per data-parallel replica."),
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


DASHBOARDS = {OVERVIEW_DASHBOARD_UID: ("Ornith: speculative decoding overview", overview_rows)}


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
