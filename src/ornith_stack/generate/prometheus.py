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
from ornith_stack.exporter import catalogue as C
from ornith_stack.generate import alerts as A
from ornith_stack.generate.core import GeneratedFile, with_header

RULES_DIR = "monitoring/prometheus/rules"
ANSIBLE_CONFIG = "ansible/roles/monitoring/templates/prometheus.yml.j2"
SOURCE = "src/ornith_stack/generate/prometheus.py, the metrics catalogue and the profiles"
BY = C.BY

# Recording rules: the names dashboards and alerts share.
ACCEPTANCE_5M = A.ACCEPTANCE_5M
DRAFT_RATIO_5M = C.SPEC_DRAFT_ACCEPTANCE_RATIO.name
GENERATION_RATE_1M = C.GENERATION_TOKENS_PER_SECOND.name
TTFT_P50, TTFT_P95 = A.TTFT_P50, A.TTFT_P95
ITL_P50, ITL_P95 = "ornith:inter_token_latency_seconds:p50_5m", "ornith:inter_token_latency_seconds:p95_5m"
EXPECTED_ACCEPTANCE = A.EXPECTED_ACCEPTANCE


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
        {"record": A.VERIFY_STEPS_5M, "expr": _rate_sum(C.SPEC_STEPS.series, "5m")},
    ]
    return {"groups": [
        {"name": "ornith-recording", "rules": rules},
        {"name": "ornith-profile-thresholds", "rules": A.threshold_rules()},
    ]}


def prometheus_config(exporter: str, alertmanager: str, scrape_interval: str = D.SCRAPE_INTERVAL,
                      rules_dir: str = "rules") -> dict[str, Any]:
    """Scrape configuration: the exporter at `exporter` (host:port), the engines it watches, and the
    Alertmanager at `alertmanager` (host:port) that receives the alerts."""
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "rule_files": [f"{rules_dir}/{name}" for name in D.RULE_FILES],
        "scrape_configs": [
            {"job_name": D.EXPORTER_JOB, "static_configs": [{"targets": [exporter]}]},
            # The engine's own metrics, raw (engine-specific names), at the addresses the exporter was
            # given: one list of targets, whatever port the profile serves on.
            {"job_name": D.ENGINE_JOB, "http_sd_configs": [{"url": f"http://{exporter}{D.SD_PATH}"}]},
            # The Model Gateway's own metrics (smg_*) where replicas run behind one; no targets otherwise.
            {"job_name": D.GATEWAY_JOB, "http_sd_configs": [{"url": f"http://{exporter}{D.GATEWAY_SD_PATH}"}]},
        ],
    }


def compose_config() -> dict[str, Any]:
    # Rules relative to this file: /etc/prometheus/rules/ in compose, beside it for promtool.
    return prometheus_config(f"{D.EXPORTER_SERVICE}:{D.EXPORTER_PORT}", f"{D.ALERTMANAGER_SERVICE}:{D.ALERTMANAGER_PORT}")


def ansible_config() -> dict[str, Any]:
    """Host mode: Prometheus beside the exporter; a Jinja2 template filled with the role's variables."""
    port = "{{ monitoring_exporter_listen.rsplit(':', 1)[-1] }}"
    # Absolute rule paths: the role validates the file with promtool from a temporary copy.
    return prometheus_config(f"127.0.0.1:{port}", f"127.0.0.1:{D.ALERTMANAGER_PORT}",
                             "{{ monitoring_prometheus_scrape_interval }}", "/etc/prometheus/rules")


def dump(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, width=1000, allow_unicode=True)


def files(root: Path) -> Iterator[GeneratedFile]:
    def generated(path: str, build: Callable[[], dict[str, Any]]) -> GeneratedFile:
        return GeneratedFile(path, SOURCE, lambda: with_header(SOURCE, dump(build()), "yaml"))

    recording, alerts = D.RULE_FILES
    yield generated(f"{RULES_DIR}/{recording}", recording_rules)
    yield generated(f"{RULES_DIR}/{alerts}", A.alert_rules)
    yield generated("monitoring/prometheus/prometheus.yml", compose_config)
    yield generated(ANSIBLE_CONFIG, ansible_config)
