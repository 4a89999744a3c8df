"""Deployment facts every generated file, the exporter and the templates share (a leaf module).

Python imports these names; Jinja2 templates see this module as the global `deployment`
(e.g. `{{ deployment.EXPORTER_PORT }}`). Container images are pinned in images.yaml.
"""

from __future__ import annotations

import hashlib

# The version of ornith-stack, of its images (ornith-stack/exporter, ornith-stack/vllm-cpu-demo) and of
# the Helm chart (version and appVersion).
VERSION = "0.1.0"
# Labels of the images this project builds (compose's build.labels): what is inside, for `docker inspect`.
# A changed label is a changed image config, so `docker compose build` (and `ornith-stack up`) builds again.
IMAGE_LABEL_VERSION = "org.ornith-stack.version"
IMAGE_LABEL_UPSTREAM = "org.ornith-stack.upstream"

# The exporter: the port it serves /metrics on and the compose service that runs it.
EXPORTER_PORT = 9400
# Containers listen on every address of their own network namespace; a host-mode exporter listens
# on loopback unless asked, so it is not reachable from the network by default.
EXPORTER_LISTEN = f":{EXPORTER_PORT}"
EXPORTER_LISTEN_HOST = f"127.0.0.1:{EXPORTER_PORT}"
EXPORTER_SERVICE = "exporter"
# The Dockerfile this project builds the exporter image (images.yaml services.exporter) from, relative to the
# repository root.
EXPORTER_DOCKERFILE = "docker/exporter.Dockerfile"
# The unprivileged user (and group) the images this project builds run as, in Docker and in Helm.
EXPORTER_UID = 10001
METRICS_PATH = "/metrics"
# Prometheus HTTP service discovery on the exporter: the engines it watches, so Prometheus scrapes
# their raw /metrics without a second list of addresses.
SD_PATH = "/sd/engines"
# ... and the Model Gateways in front of replicas (their smg_* metrics), given with `exporter --gateway`.
GATEWAY_SD_PATH = "/sd/gateways"

# Prometheus job names; alert rules select on them and the Helm ServiceMonitor relabels to them.
EXPORTER_JOB = "ornith-exporter"
ENGINE_JOB = "engine"
GATEWAY_JOB = "gateway"
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

# Monitoring beyond loopback (compose's ORNITH_MONITORING_BIND): Prometheus and Alertmanager ask for HTTP
# basic auth (their own --web.config.file), Grafana for a login, all as one user with the password
# ORNITH_MONITORING_PASSWORD. The one-shot service below writes the files into a volume mounted at
# MONITORING_AUTH_DIR: the password, the web config (a bcrypt hash) and Grafana's settings.
MONITORING_BIND_VARIABLE = "ORNITH_MONITORING_BIND"
MONITORING_PASSWORD_VARIABLE = "ORNITH_MONITORING_PASSWORD"
# bcrypt hashes the first 72 bytes of a password only (the bcrypt package refuses longer ones).
MONITORING_PASSWORD_MAX_BYTES = 72
MONITORING_USER = "ornith"
MONITORING_AUTH_SERVICE = "monitoring-auth"
MONITORING_AUTH_DIR = "/auth"
MONITORING_PASSWORD_FILE = f"{MONITORING_AUTH_DIR}/password"
MONITORING_WEB_CONFIG = f"{MONITORING_AUTH_DIR}/web.yml"
MONITORING_GRAFANA_INI = f"{MONITORING_AUTH_DIR}/grafana.ini"
# Prometheus' readiness URL, with the credentials in it when there is a password: its healthcheck's wget
# (busybox in the official image) takes them from the URL only.
MONITORING_READY_URL_FILE = f"{MONITORING_AUTH_DIR}/prometheus-ready-url"

# The rule files Prometheus loads (generated under monitoring/prometheus/rules/).
RULE_FILES = ("ornith-recording.yml", "ornith-alerts.yml")

# Data-parallel replicas: one engine service per GPU set; with more than one, SGLang's Model Gateway
# (PyPI sglang-router, the `smg` router) is the single endpoint in front of them, on the profile's port.
ENGINE_SERVICE = "engine"
# HF_HOME in the engine containers (the images set it too); huggingface_hub keeps the weights in its hub/.
HF_HOME_IN_CONTAINER = "/data/hf"
# Where containers read an operator's profile (`profiles new`) from: compose mounts the file there.
CONTAINER_PROFILE_DIR = "/etc/ornith-stack/profiles"
# The compose variable that names the operator's profile file on the host that runs compose: empty, the
# path where `profiles new` wrote it; Ansible copies the file to the host and sets it (the controller's
# path does not exist there, and Docker would mount an empty folder in its place).
PROFILE_FILE_VARIABLE = "ORNITH_PROFILE_FILE"
GATEWAY_SERVICE = "gateway"
GATEWAY_METRICS_PORT = 29000
# Cache-aware routing: a request goes to the replica whose radix tree shares its longest prefix, unless
# the load is unbalanced; then to the least loaded one. Requests that share a chat template's prefix all
# match one replica, so only the balance rule spreads them (measured with sglang-router 0.3.2 and two
# vLLM replicas: sequential requests all went to one). The gateway balances once the busiest replica has
# 64 requests more in flight than the idlest (and 1.5x as many): far beyond a replica that runs 4 at a
# time (seed 000), so the threshold is the engine's running-request limit where the profile sets one.
GATEWAY_POLICY = "cache_aware"
# Ready when at least one worker is healthy (/liveness and /health answer as soon as the process runs).
GATEWAY_HEALTH_PATH = "/readiness"
# Seconds between the gateway's health checks of each replica; it takes a replica out after 3 failed ones.
# Its default, 60 s, leaves a dead replica in rotation for 3 minutes when no traffic opens its circuit
# breaker (10 failed requests do: measured, it then retried them on the other replica, none failed).
GATEWAY_HEALTH_CHECK_INTERVAL_S = 10
# The gateway's worker-management route (POST adds a worker, GET lists them): keyed, it answers 401
# without the key; `up` and `status` probe it with an empty body, which an open gateway refuses with 422
# (measured on sglang-router 0.3.2), so the probe never adds a worker.
GATEWAY_WORKERS_PATH = "/workers"


def engine_services(replicas: int) -> list[str]:
    """Service names of the engines: `engine` alone, `engine-0`, `engine-1`, ... behind a gateway."""
    return [ENGINE_SERVICE] if replicas == 1 else [f"{ENGINE_SERVICE}-{i}" for i in range(replicas)]


def gateway_service(replicas: int) -> str | None:
    """The Model Gateway's service name in front of more than one replica; None for one engine."""
    return GATEWAY_SERVICE if replicas > 1 else None


def gateway_args(worker_urls: list[str], port: int, host: str = "0.0.0.0", metrics_host: str = "0.0.0.0",
                 metrics_port: int = GATEWAY_METRICS_PORT, balance_threshold: int | None = None) -> list[str]:
    """The Model Gateway's argv (after `python3 -m sglang_router.launch_router`) for these workers (none: the
    caller adds a discovery of its own)."""
    workers = ["--worker-urls", *worker_urls] if worker_urls else []
    balance = ["--balance-abs-threshold", str(balance_threshold)] if balance_threshold else []
    return [*workers, "--policy", GATEWAY_POLICY, *balance,
            "--health-check-interval-secs", str(GATEWAY_HEALTH_CHECK_INTERVAL_S), "--host", host, "--port", str(port),
            "--prometheus-host", metrics_host, "--prometheus-port", str(metrics_port)]

# Kernel and compile caches of the engines, kept across container and pod restarts: the H200 took 172 s to
# become healthy with empty cache folders, 60 s with those a previous start left (FACTS 13: 114 s of kernel
# compilation). Every cache the engines write goes under one mount; each variable points one of them there.
COMPILE_CACHE_PATH = "/var/cache/ornith-compile"
COMPILE_CACHE_ENV = {
    "XDG_CACHE_HOME": f"{COMPILE_CACHE_PATH}/xdg",  # flashinfer's JIT, sglang, deep_gemm, tvm-ffi (~/.cache/...)
    "TRITON_CACHE_DIR": f"{COMPILE_CACHE_PATH}/triton",  # Triton kernels (~/.triton/cache)
    "TORCHINDUCTOR_CACHE_DIR": f"{COMPILE_CACHE_PATH}/inductor",  # torch.compile's inductor (/tmp by default)
    "VLLM_CACHE_ROOT": f"{COMPILE_CACHE_PATH}/vllm",  # vLLM's torch.compile cache (torch_compile_cache/)
    "CUDA_CACHE_PATH": f"{COMPILE_CACHE_PATH}/nv",  # the driver's PTX JIT cache (~/.nv/ComputeCache)
}


def compile_cache_key(kind: str, version: str, image: str) -> str:
    """The cache's name for one engine build: kind, version and a digest of the image pin, so a new engine
    version or image never loads kernels another one compiled."""
    digest = hashlib.sha256(image.encode()).hexdigest()[:8]
    return f"{kind}-{version}-{digest}".replace(".", "-")
