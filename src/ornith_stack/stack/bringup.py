"""`ornith-stack up`: preflight, key, weights, images, start, health, smoke, in that order.

Nothing is written, pulled, built or started before preflight has passed. A second run with nothing
changed (same images, same resolved compose configuration, every service running) starts nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ornith_stack import deployment
from ornith_stack.engines import EngineAdapter, adapter_for
from ornith_stack.errors import UserError
from ornith_stack.exporter import catalogue as C
from ornith_stack.profiles.model import Profile
from ornith_stack.stack.artifacts import download_weights, ensure_images, hub_models
from ornith_stack.stack.compose import Layout, Stack, gateway_keyed, layout_for, published, stack_for, stale_services
from ornith_stack.stack.envfile import (
    Secret,
    api_key,
    check_secrets,
    kept_secret,
    monitoring_password,
    operator_key,
    read_env,
    set_env,
)
from ornith_stack.stack.health import POLL_S, Reporter, answered, engine_states, smoke, wait_healthy
from ornith_stack.stack.preflight import preflight
from ornith_stack.stack.rolling import DRAIN_TIMEOUT_S, Roll, downtime_note, remember_start, resume, roll_engines
from ornith_stack.stack.shell import Runner, first_line
from ornith_stack.stack.status import asks_for_login, post_without_key, status_with
from ornith_stack.wire.http import METRICS_BYTES, WireError, fetch
from ornith_stack.wire.metrics import BadExposition, parse

# How long the engine may take to answer its health route after `up -d`: the compose healthchecks'
# start periods (900 s on GPUs: a cold load took 440 s on a Spark, then compile and graph capture;
# 300 s for the tiny CPU model) plus room.
START_TIMEOUT_GPU_S = 1800.0
START_TIMEOUT_CPU_S = 600.0


@dataclass(frozen=True)
class UpOptions:
    root: Path
    profile: str = "auto"
    project: str | None = None
    env_file: Path | None = None
    with_key: bool = True
    start_timeout_s: float | None = None
    all_at_once: bool = False  # replicas: recreate every changed one together (not one at a time)
    drain_timeout_s: float = DRAIN_TIMEOUT_S


@dataclass
class Access:
    """Where the user reaches the stack."""

    api_base: str
    model: str
    key: Secret
    monitoring: Secret = Secret("", "")  # the login of Prometheus, Alertmanager and Grafana (empty: none)
    operator: Secret = Secret("", "")  # the operator's credential: worker and admin routes (empty: none)
    thinking_field: str = ""  # where the smoke request's answer was: reasoning_content or content
    addresses: dict[str, str] = field(default_factory=dict)  # Grafana, Prometheus, ... -> URL


@dataclass
class Outcome:
    stack: Stack
    profile: Profile
    reason: str | None
    changed: list[str]
    access: Access


# The first step: checks only, nothing written or started before it passes.
PREFLIGHT = "preflight"


def up(options: UpOptions, run: Runner, reporter: Reporter, environ: Mapping[str, str] = os.environ) -> Outcome:
    reporter.step(PREFLIGHT)
    env_path = options.env_file or options.root / "compose" / ".env"
    check_secrets(env_path, environ)  # the user's input, before anything runs or is written
    values = {**read_env(env_path), **environ}
    hf_home = hf_cache(values)
    monitoring_bind = values.get(deployment.MONITORING_BIND_VARIABLE) or "127.0.0.1"
    # Beyond loopback the monitoring services always get a password: `up` makes one below if none is set.
    ready = preflight(options.profile, run, values.get("ORNITH_BIND", "127.0.0.1"), options.with_key, hf_home,
                      root=options.root, monitoring_bind=monitoring_bind, monitoring_password=True)
    profile = ready.profile
    stack = stack_for(options.root, profile.name, options.project, env_path)
    changed: list[str] = []

    reporter.step("API key")
    key = api_key(env_path, environ, options.with_key)
    if key.created:
        changed.append(f"new API key: {key.where}")
    operator = operator_key(env_path, environ, options.with_key)
    if operator.created:
        changed.append(f"new operator credential: {operator.where}")
    login = monitoring_password(env_path, environ, monitoring_bind)
    if login.created:
        changed.append(f"new monitoring password: {login.where}")
    if login.value:  # Grafana's admin: a credential of its own, never the viewers' login
        admin = kept_secret(env_path, environ, deployment.GRAFANA_ADMIN_PASSWORD_VARIABLE, create=True)
        if admin.created:
            changed.append(f"new Grafana admin password: {admin.where}")
    adapter = adapter_for(profile)
    layout = layout_for(profile)
    timeout = options.start_timeout_s or (START_TIMEOUT_GPU_S if profile.hardware.gpu else START_TIMEOUT_CPU_S)
    model = profile.serve.served_name or profile.model.repo or ""
    roll = Roll(run, stack, layout, adapter, profile.serve.port, model, key.value, operator.value, timeout,
                options.drain_timeout_s, reporter)
    if layout.gateway is not None:
        resume(roll)  # an interrupted roll's replicas back in rotation, before anything else changes

    reporter.step("weights")
    if hub_models(profile):
        # The engine gets the hub folder alone, read-only: not the token of `hf auth login` beside it, and
        # nothing it could write into the user's own folder (it runs as root, and may run the checkpoint's own code).
        for name, value in hf_mount(hf_home).items():
            if values.get(name) != value:
                set_env(env_path, name, value)
        download_weights(profile, hf_home, reporter.note)
    else:
        reporter.note(f"{profile.model.repo} is inside the engine image")

    reporter.step("images")
    images_changed = ensure_images(run, stack, reporter.note)
    changed += images_changed

    reporter.step("start")
    started, engines_started = start(roll, bool(images_changed), options.all_at_once)
    changed += started

    endpoint = published(run, stack, layout.endpoint, profile.serve.port)
    if endpoint is None:
        raise UserError(f"the {layout.endpoint} service of {stack.project} publishes no port {profile.serve.port}: "
                        f"`ornith-stack logs {layout.endpoint}` shows why it stopped")
    reporter.step("engine health" if layout.gateway is None else f"health of {len(layout.engines)} replicas")
    began = time.monotonic()
    wait_healthy(run, stack, layout, adapter, f"http://{endpoint}", timeout, reporter)
    if engines_started:
        remember_start(stack, time.monotonic() - began)

    reporter.step("smoke request")
    access = Access(f"http://{endpoint}/v1", model, key, login, operator, addresses=addresses(run, stack))
    access.thinking_field = smoke(f"http://{endpoint}", adapter, model, key.value, layout)
    if key.value and layout.gateway is not None:
        if gateway_keyed(run, stack, layout):
            refuse_workers(f"http://{endpoint}")
        else:
            reporter.note(f"the {layout.gateway} service gets no API key: its {deployment.GATEWAY_WORKERS_PATH} "
                          "routes are open to anyone who reaches its port")
    if key.value:
        reporter.step("roles")
        for line in prove_roles(f"http://{endpoint}", adapter, layout, key.value, operator.value):
            reporter.note(line)
    if login.value:
        refuse_monitoring(access.addresses, timeout=120.0)
    exporter = access.addresses.get("exporter")
    if exporter:
        wait_exporter(exporter, timeout=120.0)
    return Outcome(stack, profile, ready.reason, changed, access)


def start(roll: Roll, images_changed: bool, all_at_once: bool) -> tuple[list[str], bool]:
    """Apply the change: with replicas behind a serving gateway the changed ones one at a time, then every other
    changed service at once (`compose up`). What changed, one line each, and whether an engine started so."""
    run, stack, layout = roll.run, roll.stack, roll.layout
    stale = stale_services(run, stack)
    if not images_changed and stale == []:
        roll.reporter.note("every service runs as configured")
        return [], False
    rolled = roll_engines(roll, stale or [], all_at_once)
    changed = [f"rolled {', '.join(rolled)} one at a time"] if rolled else []
    rest = [s for s in stale or layout.services if s not in rolled]
    if rolled and not rest:
        return changed, False
    engines = [s for s in rest if s in layout.engines]
    if layout.gateway is None and engines and engine_states(run, stack, layout):
        roll.reporter.note(downtime_note(stack))
    result = run(stack.compose("up", "--detach", "--no-build", "--remove-orphans"), timeout=900)
    if result.returncode != 0:
        raise UserError(f"`docker compose up` failed: {first_line(result)} (`ornith-stack logs` shows the services)")
    return [*changed, f"started {stack.project} ({stack.compose_file.name})"], bool(engines)


def hf_mount(hf_home: Path) -> dict[str, str]:
    """The compose variables that mount `hf_home`'s hub folder (the weights) read-only, and nothing else of it."""
    return {"ORNITH_HF_CACHE": str(hf_home / "hub"), "ORNITH_HF_CACHE_MOUNT": f"{deployment.HF_HOME_IN_CONTAINER}/hub:ro"}


def hf_cache(values: Mapping[str, str]) -> Path:
    """The host Hugging Face folder (HF_HOME) `up` downloads into: ORNITH_HF_CACHE when it is a path (the hub
    folder in it, as `up` writes it, or the folder itself), else the user's own."""
    given = values.get("ORNITH_HF_CACHE", "")
    if given.startswith("/"):
        path = Path(given)
        return path.parent if path.name == "hub" else path
    home = values.get("HF_HOME") or os.path.join(values.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                "huggingface")
    return Path(home)


def refuse_workers(base: str) -> None:
    """A keyed gateway's worker-management route refuses a request without the key (an empty body: an open
    gateway refuses it as invalid, so the probe adds no worker)."""
    code = post_without_key(base + deployment.GATEWAY_WORKERS_PATH, {})
    if code != 401:
        raise UserError(f"{base}{deployment.GATEWAY_WORKERS_PATH} answered {answered(code)} without the API key "
                        "(expected 401): anyone who reaches the gateway can add or remove its workers; "
                        "`ornith-stack logs gateway`")


def prove_roles(base: str, adapter: EngineAdapter, layout: Layout, key: str, operator: str) -> list[str]:
    """The users' key gets 401/403 on every control and admin route the endpoint serves (the gateway's worker
    routes, the engine's admin routes) and the engine's other routes refuse a request without it; the
    operator's credential opens the control routes. Returns what was proved, one line per role."""
    refused: tuple[tuple[str, str], ...]
    if layout.gateway is not None:
        refused, probes = deployment.GATEWAY_CONTROL_ROUTES, [r for r in deployment.GATEWAY_CONTROL_ROUTES
                                                              if r[0] == "GET"]
    else:
        refused, probes = adapter.admin_routes, [adapter.operator_probe] if adapter.operator_probe else []
    for method, path in refused:
        code = status_with(base + path, method, key)
        if code not in (401, 403):
            raise UserError(f"{method} {base}{path} answered {answered(code)} to the users' key (expected 401 or 403): "
                            f"ORNITH_API_KEY can steer the {layout.endpoint}; `ornith-stack logs {layout.endpoint}`")
    for method, path in adapter.keyed_routes if layout.gateway is None else ():
        code = status_with(base + path, method, "")
        if code != 401:
            raise UserError(f"{method} {base}{path} answered {answered(code)} without the API key (expected 401): "
                            f"the {layout.endpoint} serves it to anyone; `ornith-stack logs {layout.endpoint}`")
    lines = [f"the users' key: 401/403 on {', '.join(f'{m} {p}' for m, p in refused)}" if refused else
             "the users' key: the endpoint serves no control or admin route"]
    if adapter.keyed_routes and layout.gateway is None:
        lines.append(f"no key: 401 on {', '.join(f'{m} {p}' for m, p in adapter.keyed_routes)} too")
    for method, path in probes:
        code = status_with(base + path, method, operator)
        if code is None or code in (401, 403) or code >= 500:
            raise UserError(f"{method} {base}{path} answered {answered(code)} to the operator's credential: "
                            f"the {layout.endpoint} did not take ORNITH_OPERATOR_KEY; "
                            f"`ornith-stack logs {layout.endpoint}`")
    if probes:
        lines.append(f"the operator's credential: {', '.join(f'{m} {p}' for m, p in probes)} answered")
    return lines


LOGIN_SERVICES = ("prometheus", "alertmanager")


def refuse_monitoring(addresses: Mapping[str, str], timeout: float) -> None:
    """With a monitoring password, Prometheus and Alertmanager refuse a request without it (each waited for
    until it answers at all): an open one would let anyone who reaches it read the metrics or silence alerts."""
    deadline = time.monotonic() + timeout
    for name in (n for n in LOGIN_SERVICES if n in addresses):
        while (refused := asks_for_login(addresses[name])) is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if refused is not True:
            answer = "nothing" if refused is None else "without the password"
            raise UserError(f"{name} at {addresses[name]} answered {answer} (expected 401): it does not ask for "
                            f"{deployment.MONITORING_PASSWORD_VARIABLE}; `ornith-stack logs {name}` and "
                            f"`ornith-stack logs {deployment.MONITORING_AUTH_SERVICE}`")


def wait_exporter(address: str, timeout: float) -> None:
    """Until the exporter reads the engine up (ornith_engine_up 1)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            samples = parse(fetch(f"http://{address}{deployment.METRICS_PATH}", 10, limit=METRICS_BYTES).text)
            if any(sample.value == 1 for sample in samples.get(C.ENGINE_UP.series, [])):
                return
        except (WireError, BadExposition):
            pass
        if time.monotonic() > deadline:
            raise UserError(f"the exporter at {address} does not read the engine up after {timeout:.0f} s: "
                            "`ornith-stack logs exporter`")
        time.sleep(POLL_S)


SERVICE_PORTS = {
    "exporter": deployment.EXPORTER_PORT,
    "prometheus": deployment.PROMETHEUS_PORT,
    "grafana": deployment.GRAFANA_PORT,
    "alertmanager": deployment.ALERTMANAGER_PORT,
}


def addresses(run: Runner, stack: Stack) -> dict[str, str]:
    """host:port of each monitoring service that publishes one."""
    found = {name: published(run, stack, name, port) for name, port in SERVICE_PORTS.items()}
    return {name: address for name, address in found.items() if address}
