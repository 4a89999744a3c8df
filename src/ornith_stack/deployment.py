"""Deployment facts every generated file, the exporter and the templates share (a leaf module).

Python imports these names; Jinja2 templates see this module as the global `deployment`
(e.g. `{{ deployment.EXPORTER_PORT }}`). Container images are pinned in images.yaml.
"""

from __future__ import annotations

# The version of ornith-stack, of its images (ornith-stack/exporter, ornith-stack/vllm-cpu-demo) and of
# the Helm chart (version and appVersion).
VERSION = "0.1.0"

# The exporter: the port it serves /metrics on and the compose service that runs it.
EXPORTER_PORT = 9400
# Containers listen on every address of their own network namespace; a host-mode exporter listens
# on loopback unless asked, so it is not reachable from the network by default.
EXPORTER_LISTEN = f":{EXPORTER_PORT}"
EXPORTER_LISTEN_HOST = f"127.0.0.1:{EXPORTER_PORT}"
EXPORTER_SERVICE = "exporter"
# The unprivileged user (and group) the images this project builds run as, in Docker and in Helm.
EXPORTER_UID = 10001
METRICS_PATH = "/metrics"
# Prometheus HTTP service discovery on the exporter: the engines it watches, so Prometheus scrapes
# their raw /metrics without a second list of addresses.
SD_PATH = "/sd/engines"

# Prometheus job names; alert rules select on them and the Helm ServiceMonitor relabels to them.
EXPORTER_JOB = "ornith-exporter"
ENGINE_JOB = "engine"
SCRAPE_INTERVAL = "15s"
# Ports Prometheus and Grafana serve on, in their containers and by default on the host.
PROMETHEUS_PORT = 9090
GRAFANA_PORT = 3000

# Alertmanager: its compose service and port, and the webhook URL of the generated configuration until
# the operator's replaces it (a reserved name, RFC 2606, that never resolves: nothing leaves unasked).
ALERTMANAGER_SERVICE = "alertmanager"
ALERTMANAGER_PORT = 9093
ALERT_WEBHOOK_PLACEHOLDER = "http://ornith-webhook.invalid/alerts"

# Grafana: the provisioned Prometheus datasource every dashboard panel names.
GRAFANA_DATASOURCE_UID = "ornith-prometheus"

# The rule files Prometheus loads (generated under monitoring/prometheus/rules/).
RULE_FILES = ("ornith-recording.yml", "ornith-alerts.yml")
