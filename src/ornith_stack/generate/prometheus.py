"""Prometheus configuration, recording rules and alert rules, built from the catalogue and the profiles.

Every metric name comes from `catalogue`; every acceptance threshold from a profile's
`expected.acceptance_length`. `ornith-stack render` writes the results under monitoring/prometheus/,
and Ansible's host-mode Prometheus configuration from the same builder.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
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
PROMETHEUS_JOB, ALERTMANAGER_JOB = D.PROMETHEUS_JOB, D.ALERTMANAGER_JOB
PROMETHEUS_SELF = f"localhost:{D.PROMETHEUS_PORT}"


@dataclass(frozen=True)
class ScrapeLimits:
    """What one scrape of a job may bring; past any of them Prometheus fails that scrape (its `up` 0)
    instead of storing a runaway target's series."""

    sample_limit: int
    label_limit: int  # labels of one series, the target's own (job, instance, namespace, pod...) included
    label_value_length_limit: int
    body_size_limit: str  # uncompressed

    def prometheus(self) -> dict[str, Any]:
        """As a scrape job's keys."""
        return asdict(self)

    def service_monitor(self) -> dict[str, Any]:
        """As a ServiceMonitor's spec keys (prometheus-operator spells them in camelCase)."""
        return {re.sub(r"_(.)", lambda m: m.group(1).upper(), k): v for k, v in asdict(self).items()}


def _mib(samples: int, bytes_per_sample: int) -> str:
    return f"{math.ceil(samples * bytes_per_sample / 2**20)}MB"  # Prometheus' MB is 2^20 bytes


# Labels a series may carry: the recorded engines' most (vLLM 0.32's cache_config_info, 37), the exporter's
# most (ornith_engine_info, 6), and what a scrape adds (job, instance, target, profile, node, replica and,
# in Kubernetes, namespace, pod, service, container, endpoint).
ENGINE_LABEL_LIMIT, LABEL_LIMIT = 64, 32
# Characters of one label value: the recordings' longest is 29; the exporter cuts the engine's own values
# (the model name) to C.MAX_LABEL_LENGTH; the rest are target URLs and names.
LABEL_VALUE_LENGTH_LIMIT = 1024
# The exporter's answer: its own process' samples and its host collectors' (GPUs, model cache) beside
# C.MAX_TARGETS targets' worst case, at most 1 KiB per sample (a bucket line with a 256-character model name
# and a long target URL is about 500 B).
PROCESS_SAMPLES = 16
EXPORTER_SAMPLES = C.MAX_TARGETS * C.max_samples_per_target() + C.max_host_samples() + PROCESS_SAMPLES
SCRAPE_LIMITS: dict[str, ScrapeLimits] = {
    D.EXPORTER_JOB: ScrapeLimits(EXPORTER_SAMPLES, LABEL_LIMIT, LABEL_VALUE_LENGTH_LIMIT, _mib(EXPORTER_SAMPLES, 1024)),
    # The recorded engines send 434 to 588 samples and 53 to 97 kB per scrape (tests/fixtures/engines/);
    # ten times the most, and the exporter's own body limit, stop a runaway engine without touching a real one.
    D.ENGINE_JOB: ScrapeLimits(6000, ENGINE_LABEL_LIMIT, LABEL_VALUE_LENGTH_LIMIT, "8MB"),
    # The Model Gateway (smg 0.3.2) sent 151 samples over two workers (tests/fixtures/engines/sglang-0.5.17/
    # gateway-2x-gpu96/); its series grow with the workers.
    D.GATEWAY_JOB: ScrapeLimits(6000, LABEL_LIMIT, LABEL_VALUE_LENGTH_LIMIT, "8MB"),
    # Prometheus 2.42 idle sent 324 samples (44 kB); rule groups and jobs add a few hundred. Alertmanager
    # sends fewer.
    PROMETHEUS_JOB: ScrapeLimits(10000, LABEL_LIMIT, LABEL_VALUE_LENGTH_LIMIT, "8MB"),
    ALERTMANAGER_JOB: ScrapeLimits(10000, LABEL_LIMIT, LABEL_VALUE_LENGTH_LIMIT, "8MB"),
}


def _job(name: str, **config: Any) -> dict[str, Any]:
    return {"job_name": name, **config, **SCRAPE_LIMITS[name].prometheus()}


def service_monitor_limits() -> dict[str, dict[str, Any]]:
    """The limits of the chart's ServiceMonitors, which set them for all their endpoints: the main one
    scrapes the exporter and the engines (the larger of each limit), the gateway's its own."""
    both = (SCRAPE_LIMITS[D.EXPORTER_JOB], SCRAPE_LIMITS[D.ENGINE_JOB])
    main = ScrapeLimits(max(x.sample_limit for x in both), max(x.label_limit for x in both),
                        max(x.label_value_length_limit for x in both),
                        max((x.body_size_limit for x in both), key=lambda v: int(v.removesuffix("MB"))))
    return {"main": main.service_monitor(), "gateway": SCRAPE_LIMITS[D.GATEWAY_JOB].service_monitor()}


def recording_rules() -> dict[str, Any]:
    rules = [{"record": r.name, "expr": r.expr} for r in C.RECORDED]
    return {"groups": [
        {"name": "ornith-recording", "rules": rules},
        {"name": "ornith-profile-thresholds", "rules": A.threshold_rules()},
        # After the thresholds: a group's rules see the earlier rules' results of the same evaluation.
        {"name": "ornith-slo", "rules": A.recording_rules()},
    ]}


def prometheus_config(exporter: str, alertmanager: str, scrape_interval: str = D.SCRAPE_INTERVAL,
                      rules_dir: str = "rules", password_file: str | None = None) -> dict[str, Any]:
    """Scrape configuration: the exporter at `exporter` (host:port), the engines it watches, and the
    Alertmanager at `alertmanager` (host:port) that receives the alerts. With `password_file`, Prometheus
    reaches itself and Alertmanager as the monitoring user (an empty file: no password, which a server
    without a web config ignores)."""
    auth = {"basic_auth": {"username": D.MONITORING_USER, "password_file": password_file}} if password_file else {}
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "alerting": {"alertmanagers": [{**auth, "static_configs": [{"targets": [alertmanager]}]}]},
        "rule_files": [f"{rules_dir}/{name}" for name in D.RULE_FILES],
        "scrape_configs": [
            _job(D.EXPORTER_JOB, static_configs=[{"targets": [exporter]}]),
            # The engine's own metrics, raw (engine-specific names), at the addresses the exporter was
            # given: one list of targets, whatever port the profile serves on.
            _job(D.ENGINE_JOB, http_sd_configs=[{"url": f"http://{exporter}{D.SD_PATH}"}]),
            # The Model Gateway's own metrics (smg_*) where replicas run behind one; no targets otherwise.
            _job(D.GATEWAY_JOB, http_sd_configs=[{"url": f"http://{exporter}{D.GATEWAY_SD_PATH}"}]),
            _job(PROMETHEUS_JOB, **auth, static_configs=[{"targets": [PROMETHEUS_SELF]}]),
            _job(ALERTMANAGER_JOB, **auth, static_configs=[{"targets": [alertmanager]}]),
        ],
    }


def compose_config() -> dict[str, Any]:
    # Rules relative to this file: /etc/prometheus/rules/ in compose, beside it for promtool.
    # The password file: compose's monitoring-auth one-shot writes it (empty without a password).
    return prometheus_config(f"{D.EXPORTER_SERVICE}:{D.EXPORTER_PORT}", f"{D.ALERTMANAGER_SERVICE}:{D.ALERTMANAGER_PORT}",
                             password_file=D.MONITORING_PASSWORD_FILE)


def ansible_config() -> dict[str, Any]:
    """Host mode: Prometheus beside the exporter; a Jinja2 template filled with the role's variables."""
    port = "{{ monitoring_exporter_listen.rsplit(':', 1)[-1] }}"
    # Absolute rule paths: the role validates the file with promtool from a temporary copy.
    # The password file: the role writes it (empty without monitoring_password).
    return prometheus_config(f"127.0.0.1:{port}", f"127.0.0.1:{D.ALERTMANAGER_PORT}",
                             "{{ monitoring_prometheus_scrape_interval }}", "/etc/prometheus/rules",
                             password_file="{{ __monitoring_password_file }}")


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
