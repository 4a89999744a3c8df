"""Prometheus configuration, recording rules and alert rules, built from the catalogue and the profiles.

Every metric name comes from `catalogue`; every acceptance threshold from a profile's
`expected.acceptance_length`. `ornith-stack render` writes the results under monitoring/prometheus/,
and Ansible's host-mode Prometheus configuration from the same builder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from ornith_stack import deployment as D
from ornith_stack.engines import adapter_for
from ornith_stack.exporter import catalogue as C
from ornith_stack.generate.core import GeneratedFile, with_header
from ornith_stack.profiles import load_all

RULES_DIR = "monitoring/prometheus/rules"
ANSIBLE_CONFIG = "ansible/roles/monitoring/templates/prometheus.yml.j2"
SOURCE = "src/ornith_stack/generate/prometheus.py, the metrics catalogue and the profiles"
BY = "target, profile, engine, model"

# Thresholds that are operating choices, not facts of a seed. README explains each.
ACCEPTANCE_FRACTION = 0.6  # alert below 60% of the profile's lowest published acceptance length
TTFT_P95_SECONDS = 10.0
KV_CACHE_FULL_RATIO = 0.95
QUEUE_BACKLOG_REQUESTS = 5

# Recording rules: the names dashboards and alerts share.
ACCEPTANCE_5M = C.SPEC_ACCEPTANCE_LENGTH.name
DRAFT_RATIO_5M = C.SPEC_DRAFT_ACCEPTANCE_RATIO.name
GENERATION_RATE_1M = C.GENERATION_TOKENS_PER_SECOND.name
TTFT_P50, TTFT_P95 = "ornith:time_to_first_token_seconds:p50_5m", "ornith:time_to_first_token_seconds:p95_5m"
ITL_P50, ITL_P95 = "ornith:inter_token_latency_seconds:p50_5m", "ornith:inter_token_latency_seconds:p95_5m"
EXPECTED_ACCEPTANCE = "ornith:profile_expected_acceptance_length"


def _rate_sum(series: str, window: str) -> str:
    return f"sum by ({BY}) (rate({series}[{window}]))"


def _quantile(q: float, metric: C.Metric) -> str:
    return f"histogram_quantile({q}, sum by ({BY}, le) (rate({metric.bucket}[5m])))"


def recording_rules() -> dict[str, Any]:
    rules = [
        *({"record": r.name, "expr": r.expr} for r in C.RECORDED),
        {"record": TTFT_P50, "expr": _quantile(0.5, C.TTFT)},
        {"record": TTFT_P95, "expr": _quantile(0.95, C.TTFT)},
        {"record": ITL_P50, "expr": _quantile(0.5, C.ITL)},
        {"record": ITL_P95, "expr": _quantile(0.95, C.ITL)},
    ]
    return {"groups": [
        {"name": "ornith-recording", "rules": rules},
        {"name": "ornith-profile-expectations", "rules": expectation_rules()},
    ]}


def expectation_rules() -> list[dict[str, Any]]:
    """One constant series per profile that publishes an acceptance length: its lowest task's value."""
    rules = []
    for profile in load_all():
        per_task = profile.expected.acceptance_length if profile.expected else {}
        if per_task:
            task = min(per_task, key=per_task.__getitem__)
            rules.append({
                "record": EXPECTED_ACCEPTANCE,
                "expr": f"vector({per_task[task]})",
                "labels": {"profile": profile.name, "task": task, "engine": adapter_for(profile).kind,
                           "source": profile.expected.source},  # type: ignore[union-attr]
            })
    return rules


def alert_rules() -> dict[str, Any]:
    alerts = [
        _alert("OrnithEngineDown", f"{C.ENGINE_UP.series} == 0", "2m", "critical",
               "Engine {{ $labels.target }} is down or answers garbage",
               "The exporter could not scrape and parse {{ $labels.target }}/metrics for 2 minutes; "
               "see ornith_exporter_scrape_errors_total for the reason."),
        _alert("OrnithExporterDown", f'up{{job="{D.EXPORTER_JOB}"}} == 0', "2m", "critical",
               "The ornith exporter {{ $labels.instance }} is not answering",
               "Prometheus cannot scrape the exporter; no engine metrics arrive."),
        _alert("OrnithSpecAcceptanceLow",
               f"{ACCEPTANCE_5M} < on(profile) group_left() ({ACCEPTANCE_FRACTION} * {EXPECTED_ACCEPTANCE})",
               "10m", "warning",
               "Speculative acceptance on {{ $labels.target }} is {{ $value | printf \"%.2f\" }} tokens/step",
               f"Below {ACCEPTANCE_FRACTION:.0%} of the profile's published acceptance length for 10 minutes. "
               "A zeroed mask embedding or a wrong draft checkpoint halves acceptance; check the draft."),
        _alert("OrnithTimeToFirstTokenHigh", f"{TTFT_P95} > {TTFT_P95_SECONDS}", "5m", "warning",
               "TTFT p95 on {{ $labels.target }} is {{ $value | printf \"%.1f\" }} s",
               f"Time to first token p95 above {TTFT_P95_SECONDS:g} s for 5 minutes."),
        _alert("OrnithKVCacheNearlyFull", f"{C.KV_CACHE_USAGE.series} > {KV_CACHE_FULL_RATIO}", "5m", "warning",
               "KV cache on {{ $labels.target }} is {{ $value | humanizePercentage }} full",
               f"KV cache usage above {KV_CACHE_FULL_RATIO:.0%} for 5 minutes: requests will be preempted "
               "or queued."),
        _alert("OrnithQueueBacklog", f"{C.REQUESTS_WAITING.series} > {QUEUE_BACKLOG_REQUESTS}", "5m", "warning",
               "{{ $value }} requests waiting on {{ $labels.target }}",
               f"More than {QUEUE_BACKLOG_REQUESTS} requests waited for 5 minutes without the queue draining."),
        _alert("OrnithCanaryFailing", f"{C.CANARY_SUCCESS.series} == 0", "5m", "critical",
               "Canary requests to {{ $labels.target }} fail",
               "The canary's known-answer request has not completed for 5 minutes."),
        _alert("OrnithCanaryWrong", f"{C.CANARY_CORRECT.series} == 0", "10m", "warning",
               "Canary answers from {{ $labels.target }} are wrong",
               "The engine answers the canary's fixed greedy question wrongly: check the model, chat "
               "template and draft (a speculative bug changes greedy output)."),
    ]
    return {"groups": [{"name": "ornith-alerts", "rules": alerts}]}


def _alert(name: str, expr: str, duration: str, severity: str, summary: str, description: str) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": duration, "labels": {"severity": severity},
            "annotations": {"summary": summary, "description": description}}


def prometheus_config(exporter: str, scrape_interval: str = D.SCRAPE_INTERVAL, rules_dir: str = "rules") -> dict[str, Any]:
    """Scrape configuration: the exporter at `exporter` (host:port), and the engines it watches."""
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [f"{rules_dir}/{name}" for name in D.RULE_FILES],
        "scrape_configs": [
            {"job_name": D.EXPORTER_JOB, "static_configs": [{"targets": [exporter]}]},
            # The engine's own metrics, raw (engine-specific names), at the addresses the exporter was
            # given: one list of targets, whatever port the profile serves on.
            {"job_name": D.ENGINE_JOB, "http_sd_configs": [{"url": f"http://{exporter}{D.SD_PATH}"}]},
        ],
    }


def compose_config() -> dict[str, Any]:
    # Rules relative to this file: /etc/prometheus/rules/ in compose, beside it for promtool.
    return prometheus_config(f"{D.EXPORTER_SERVICE}:{D.EXPORTER_PORT}")


def ansible_config() -> dict[str, Any]:
    """Host mode: Prometheus beside the exporter; a Jinja2 template filled with the role's variables."""
    port = "{{ monitoring_exporter_listen.rsplit(':', 1)[-1] }}"
    # Absolute rule paths: the role validates the file with promtool from a temporary copy.
    return prometheus_config(f"127.0.0.1:{port}", "{{ monitoring_prometheus_scrape_interval }}", "/etc/prometheus/rules")


def dump(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=1000, allow_unicode=True)


def files(root: Path) -> Iterator[GeneratedFile]:
    def generated(path: str, build: Callable[[], dict[str, Any]]) -> GeneratedFile:
        return GeneratedFile(path, SOURCE, lambda: with_header(SOURCE, dump(build()), "yaml"))

    recording, alerts = D.RULE_FILES
    yield generated(f"{RULES_DIR}/{recording}", recording_rules)
    yield generated(f"{RULES_DIR}/{alerts}", alert_rules)
    yield generated("monitoring/prometheus/prometheus.yml", compose_config)
    yield generated(ANSIBLE_CONFIG, ansible_config)
