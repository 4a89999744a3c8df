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
# What the exporter's canary checks (`exporter --canary-check`): the known answer, or liveness only (any streamed
# answer) for a model that cannot know it. A profile's `canary_check` names one.
CANARY_CHECK_ANSWER, CANARY_CHECK_LIVENESS = "answer", "liveness"
CANARY_CHECKS = (CANARY_CHECK_ANSWER, CANARY_CHECK_LIVENESS)
# The exporter's GPU collector (NVML): auto reports "no_gpu" where there is no NVIDIA driver, required reports
# that as an error (a GPU profile's exporter: compose, Helm and Ansible pass it), off reports nothing.
GPU_METRICS_AUTO, GPU_METRICS_REQUIRED, GPU_METRICS_OFF = "auto", "required", "off"
GPU_METRICS_MODES = (GPU_METRICS_AUTO, GPU_METRICS_REQUIRED, GPU_METRICS_OFF)
# The exporter reads NVML only: the NVIDIA runtime gives its container the driver's utility libraries, no CUDA.
NVIDIA_DRIVER_CAPABILITIES_NVML = "utility"
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
# Prometheus' jobs of the monitoring itself (compose and Ansible scrape both).
PROMETHEUS_JOB, ALERTMANAGER_JOB = "prometheus", "alertmanager"
ALERTMANAGER_PORT = 9093
ALERT_WEBHOOK_PLACEHOLDER = "http://ornith-webhook.invalid/alerts"
# Alertmanager's receiver of the always-firing watchdog: the dead man's switch (`status` warns without one).
HEARTBEAT_RECEIVER = "ornith-heartbeat"

# Grafana: the provisioned Prometheus datasource every dashboard panel names.
GRAFANA_DATASOURCE_UID = "ornith-prometheus"
# The overview dashboard's fixed uid: its URL is /d/<uid> on every Grafana (the runbooks link to it).
OVERVIEW_DASHBOARD_UID = "ornith-overview"

# Monitoring beyond loopback (compose's ORNITH_MONITORING_BIND): Prometheus and Alertmanager ask for HTTP
# basic auth (their own --web.config.file), Grafana's viewers for a login, all as one user with the password
# ORNITH_MONITORING_PASSWORD; Grafana's admin has a password of its own (GRAFANA_ADMIN_PASSWORD). The
# one-shot service below writes the files into a volume mounted at MONITORING_AUTH_DIR, each mode 0600 and
# owned by the one user that reads it: Prometheus' and Alertmanager's (MONITORING_UID_VARIABLE, the upstream
# images' nobody by default) or Grafana's (GRAFANA_UID_VARIABLE). No credential is ever in a command line.
MONITORING_BIND_VARIABLE = "ORNITH_MONITORING_BIND"
MONITORING_PASSWORD_VARIABLE = "ORNITH_MONITORING_PASSWORD"
GRAFANA_ADMIN_PASSWORD_VARIABLE = "GRAFANA_ADMIN_PASSWORD"
GRAFANA_ADMIN_USER = "admin"
MONITORING_UID_VARIABLE = "ORNITH_MONITORING_UID"
MONITORING_UID_DEFAULT = 65534  # prom/prometheus and prom/alertmanager run as nobody
GRAFANA_UID_VARIABLE = "ORNITH_GRAFANA_UID"
GRAFANA_UID_DEFAULT = 472  # grafana/grafana's user
# bcrypt hashes the first 72 bytes of a password only (the bcrypt package refuses longer ones).
MONITORING_PASSWORD_MAX_BYTES = 72
MONITORING_USER = "ornith"
MONITORING_AUTH_SERVICE = "monitoring-auth"
# Compose's one-shot before the engines and the gateway: it refuses (and so they never start) an API published
# beyond loopback (ORNITH_BIND) without ORNITH_API_KEY (stack/keycheck.py).
KEY_CHECK_SERVICE = "api-key-check"
MONITORING_AUTH_DIR = "/auth"
# Prometheus' and Alertmanager's files.
MONITORING_PASSWORD_FILE = f"{MONITORING_AUTH_DIR}/password"
MONITORING_WEB_CONFIG = f"{MONITORING_AUTH_DIR}/web.yml"
# Prometheus' healthcheck reads the credentials from a file: GNU wget's WGETRC (the Debian stand-in image),
# else promtool's HTTP client configuration (the upstream image, whose busybox wget takes them from argv only).
MONITORING_WGETRC = f"{MONITORING_AUTH_DIR}/wgetrc"
MONITORING_PROMTOOL_HTTP_CONFIG = f"{MONITORING_AUTH_DIR}/promtool-http.yml"
# Grafana's files: its settings, the viewers' password (datasource, /metrics) and the admin's.
MONITORING_GRAFANA_INI = f"{MONITORING_AUTH_DIR}/grafana.ini"
GRAFANA_VIEWER_PASSWORD_FILE = f"{MONITORING_AUTH_DIR}/grafana-viewer-password"
GRAFANA_ADMIN_PASSWORD_FILE = f"{MONITORING_AUTH_DIR}/grafana-admin-password"

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
# Faults behind the gateway (smg 0.3.2's flags, read in its --help): a request that fails before its first
# byte (a replica killed or refusing) is tried again, GATEWAY_RETRIES attempts in all (smg counts the first)
# with backoff from 50 ms; GATEWAY_CB_FAILURES failures within the window open the replica's circuit breaker
# (no request goes there) for GATEWAY_CB_OPEN_S, then GATEWAY_CB_SUCCESSES successes close it again. One
# attempt more than the failures that open the breaker: a request whose every attempt went to the dead
# replica makes its last one after the breaker opened, so on a healthy replica. A
# stream already flowing cannot be retried: its client sees the failure. A dead replica is out of rotation
# at the latest after GATEWAY_HEALTH_FAILURES failed health checks, GATEWAY_HEALTH_CHECK_INTERVAL_S apart
# (GATEWAY_OUT_OF_ROTATION_S), sooner under traffic by its circuit breaker.
GATEWAY_CB_FAILURES = 3
GATEWAY_RETRIES = GATEWAY_CB_FAILURES + 1
GATEWAY_RETRY_BACKOFF_MS = (50, 2000)  # initial, maximum
GATEWAY_CB_SUCCESSES = 2
GATEWAY_CB_OPEN_S = 15
GATEWAY_CB_WINDOW_S = 30
GATEWAY_HEALTH_FAILURES = 2
GATEWAY_OUT_OF_ROTATION_S = GATEWAY_HEALTH_CHECK_INTERVAL_S * GATEWAY_HEALTH_FAILURES
# The gateway ends a request after this long (smg's own default, written out): the longest request that can
# pass it, and so the longest a draining replica waits for one.
GATEWAY_REQUEST_TIMEOUT_S = 1800
# A rolling change drains an engine before it stops: it waits for its running requests, at most the longest
# request the profile allows: its max tokens (context) at the slowest single-stream decode rate the seed
# measured, or this rate where the profile has none (below every rate the seeds measured: 18.1 tok/s, the
# Spark at 261k tokens of context).
DRAIN_DECODE_TOK_S = 15.0

# The gateway's worker-management route (POST adds a worker, GET lists them): keyed, it answers 401
# without the key; `up` and `status` probe it with an empty body, which an open gateway refuses with 422
# (measured on sglang-router 0.3.2), so the probe never adds a worker.
GATEWAY_WORKERS_PATH = "/workers"
# smg 0.3.2's control plane: only the operator's credential (--control-plane-api-keys) opens these; the users'
# key gets 401. `up` checks each with the users' key, and the read-only ones (GET) with the operator's.
GATEWAY_CONTROL_ROUTES = (("GET", GATEWAY_WORKERS_PATH), ("POST", GATEWAY_WORKERS_PATH),
                          ("DELETE", f"{GATEWAY_WORKERS_PATH}/ornith-probe"), ("GET", "/get_loads"),
                          ("POST", "/flush_cache"))


def engine_services(replicas: int) -> list[str]:
    """Service names of the engines: `engine` alone, `engine-0`, `engine-1`, ... behind a gateway."""
    return [ENGINE_SERVICE] if replicas == 1 else [f"{ENGINE_SERVICE}-{i}" for i in range(replicas)]


def worker_url(service: str, port: int) -> str:
    """A replica's URL as the gateway knows it (its --worker-urls, its /workers list): the compose service name
    on the stack's network."""
    return f"http://{service}:{port}"


def gateway_service(replicas: int) -> str | None:
    """The Model Gateway's service name in front of more than one replica; None for one engine."""
    return GATEWAY_SERVICE if replicas > 1 else None


def gateway_args(worker_urls: list[str], port: int, host: str = "0.0.0.0", metrics_host: str = "0.0.0.0",
                 metrics_port: int = GATEWAY_METRICS_PORT, balance_threshold: int | None = None) -> list[str]:
    """The Model Gateway's argv (after `python3 -m sglang_router.launch_router`) for these workers (none: the
    caller adds a discovery of its own)."""
    workers = ["--worker-urls", *worker_urls] if worker_urls else []
    balance = ["--balance-abs-threshold", str(balance_threshold)] if balance_threshold else []
    return [*workers, "--policy", GATEWAY_POLICY, *balance, *gateway_fault_args(), "--host", host,
            "--port", str(port), "--prometheus-host", metrics_host, "--prometheus-port", str(metrics_port)]


def gateway_fault_args() -> list[str]:
    """The gateway's retry, circuit-breaker, health-check and timeout flags (see GATEWAY_RETRIES above)."""
    return ["--retry-max-retries", str(GATEWAY_RETRIES),
            "--retry-initial-backoff-ms", str(GATEWAY_RETRY_BACKOFF_MS[0]),
            "--retry-max-backoff-ms", str(GATEWAY_RETRY_BACKOFF_MS[1]),
            "--cb-failure-threshold", str(GATEWAY_CB_FAILURES), "--cb-success-threshold", str(GATEWAY_CB_SUCCESSES),
            "--cb-timeout-duration-secs", str(GATEWAY_CB_OPEN_S), "--cb-window-duration-secs", str(GATEWAY_CB_WINDOW_S),
            "--health-failure-threshold", str(GATEWAY_HEALTH_FAILURES),
            "--health-check-interval-secs", str(GATEWAY_HEALTH_CHECK_INTERVAL_S),
            "--request-timeout-secs", str(GATEWAY_REQUEST_TIMEOUT_S)]

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
