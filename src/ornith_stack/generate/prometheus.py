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
# Meta-monitoring: Prometheus scrapes itself and Alertmanager (failed notifications, the alert path).
PROMETHEUS_JOB, ALERTMANAGER_JOB = "prometheus", "alertmanager"
PROMETHEUS_SELF = f"localhost:{D.PROMETHEUS_PORT}"
# The engine job's own protection: the recorded engines send 434 to 588 samples and 53 to 97 kB per
# scrape (tests/fixtures/engines/); ten times the most, and the exporter's body limit, stop a runaway
# target without touching a real one.
ENGINE_SAMPLE_LIMIT = 6000
ENGINE_BODY_SIZE_LIMIT = "8MB"


def recording_rules() -> dict[str, Any]:
    rules = [{"record": r.name, "expr": r.expr} for r in C.RECORDED]
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
            {"job_name": D.ENGINE_JOB, "http_sd_configs": [{"url": f"http://{exporter}{D.SD_PATH}"}],
             "sample_limit": ENGINE_SAMPLE_LIMIT, "body_size_limit": ENGINE_BODY_SIZE_LIMIT},
            # The Model Gateway's own metrics (smg_*) where replicas run behind one; no targets otherwise.
            {"job_name": D.GATEWAY_JOB, "http_sd_configs": [{"url": f"http://{exporter}{D.GATEWAY_SD_PATH}"}]},
            {"job_name": PROMETHEUS_JOB, "static_configs": [{"targets": [PROMETHEUS_SELF]}]},
            {"job_name": ALERTMANAGER_JOB, "static_configs": [{"targets": [alertmanager]}]},
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
