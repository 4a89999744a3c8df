"""`ornith-stack up`: preflight, key, weights, images, start, health, smoke, in that order.

Nothing is written, pulled, built or started before preflight has passed. A second run with nothing
changed (same images, same resolved compose configuration, every service running) starts nothing.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ornith_stack import deployment
from ornith_stack.engines import EngineAdapter, adapter_for
from ornith_stack.errors import UserError
from ornith_stack.exporter import catalogue as C
from ornith_stack.profiles.model import Profile
from ornith_stack.stack.artifacts import download_weights, ensure_images, hub_models
from ornith_stack.stack.compose import (
    Layout,
    Stack,
    containers,
    gateway_keyed,
    layout_for,
    published,
    service_of,
    stack_for,
)
from ornith_stack.stack.envfile import Secret, api_key, monitoring_password, read_env, set_env
from ornith_stack.stack.preflight import preflight
from ornith_stack.stack.shell import Runner, first_line
from ornith_stack.stack.status import asks_for_login, chat_body, post_without_key
from ornith_stack.wire.http import ERROR_BYTES, METRICS_BYTES, WireError, bearer, fetch
from ornith_stack.wire.metrics import BadExposition, parse

# How long the engine may take to answer its health route after `up -d`: the compose healthchecks'
# start periods (900 s on GPUs: a cold load took 440 s on a Spark, then compile and graph capture;
# 300 s for the tiny CPU model) plus room.
START_TIMEOUT_GPU_S = 1800.0
START_TIMEOUT_CPU_S = 600.0
POLL_S = 3.0
SMOKE_PROMPT = "Say hello in one short sentence."
LOG_TAIL = 6


class Reporter(Protocol):
    def step(self, title: str) -> None:
        """A new step begins (the previous one is done)."""

    def note(self, text: str) -> None:
        """Progress inside the running step."""


@dataclass(frozen=True)
class UpOptions:
    root: Path
    profile: str = "auto"
    project: str | None = None
    env_file: Path | None = None
    with_key: bool = True
    start_timeout_s: float | None = None


@dataclass
class Access:
    """Where the user reaches the stack."""

    api_base: str
    model: str
    key: Secret
    monitoring: Secret = Secret("", "")  # the login of Prometheus, Alertmanager and Grafana (empty: none)
    thinking_field: str = ""  # where the smoke request's answer was: reasoning_content or content
    addresses: dict[str, str] = field(default_factory=dict)  # Grafana, Prometheus, ... -> URL


@dataclass
class Outcome:
    stack: Stack
    profile: Profile
    reason: str | None
    changed: list[str]
    access: Access


def up(options: UpOptions, run: Runner, reporter: Reporter, environ: Mapping[str, str] = os.environ) -> Outcome:
    reporter.step("preflight")
    env_path = options.env_file or options.root / "compose" / ".env"
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
    login = monitoring_password(env_path, environ, monitoring_bind)
    if login.created:
        changed.append(f"new monitoring password: {login.where}")

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
    if not images_changed and unchanged(run, stack):
        reporter.note("every service runs as configured")
    else:
        result = run(stack.compose("up", "--detach", "--no-build", "--remove-orphans"), timeout=900)
        if result.returncode != 0:
            raise UserError(f"`docker compose up` failed: {first_line(result)} (`ornith-stack logs` shows the services)")
        changed.append(f"started {stack.project} ({stack.compose_file.name})")

    adapter = adapter_for(profile)
    layout = layout_for(profile)
    endpoint = published(run, stack, layout.endpoint, profile.serve.port)
    if endpoint is None:
        raise UserError(f"the {layout.endpoint} service of {stack.project} publishes no port {profile.serve.port}: "
                        f"`ornith-stack logs {layout.endpoint}` shows why it stopped")
    reporter.step("engine health" if layout.gateway is None else f"health of {len(layout.engines)} replicas")
    timeout = options.start_timeout_s or (START_TIMEOUT_GPU_S if profile.hardware.gpu else START_TIMEOUT_CPU_S)
    wait_healthy(run, stack, layout, adapter, f"http://{endpoint}", timeout, reporter)

    reporter.step("smoke request")
    model = profile.serve.served_name or profile.model.repo or ""
    access = Access(f"http://{endpoint}/v1", model, key, login, addresses=addresses(run, stack))
    access.thinking_field = smoke(f"http://{endpoint}", adapter, model, key.value, layout)
    if key.value and layout.gateway is not None:
        if gateway_keyed(run, stack, layout):
            refuse_workers(f"http://{endpoint}")
        else:
            reporter.note(f"the {layout.gateway} service gets no API key: its {deployment.GATEWAY_WORKERS_PATH} "
                          "routes are open to anyone who reaches its port")
    if login.value:
        refuse_monitoring(access.addresses, timeout=120.0)
    exporter = access.addresses.get("exporter")
    if exporter:
        wait_exporter(exporter, timeout=120.0)
    return Outcome(stack, profile, ready.reason, changed, access)


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


def unchanged(run: Runner, stack: Stack) -> bool:
    """Every service has a running container (not restarting) made from the configuration compose resolves
    now and from the image its tag names now."""
    result = run(stack.compose("config", "--hash", "*"))
    if result.returncode != 0:
        return False
    want = dict(line.split(None, 1) for line in result.stdout.splitlines() if len(line.split()) == 2)
    have = {service_of(c): (c.get("Config", {}).get("Labels") or {}).get("com.docker.compose.config-hash")
            for c in containers(run, stack) if _current(run, c)}
    return bool(want) and all(have.get(service) == digest for service, digest in want.items())


def _current(run: Runner, container: dict[str, Any]) -> bool:
    """Running steadily (or, for a one-shot service such as alertmanager-config, finished with exit code
    0 under no restart policy), from the image its tag points at today."""
    state = container.get("State", {})
    restart = ((container.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name") or "no"
    finished = restart == "no" and state.get("Status") == "exited" and state.get("ExitCode") == 0
    if not finished and (state.get("Status") != "running" or state.get("Restarting")):
        return False
    tag = run(["docker", "image", "inspect", "--format", "{{.Id}}", str(container.get("Config", {}).get("Image"))])
    return tag.returncode == 0 and tag.stdout.strip() == container.get("Image")


def engine_log(run: Runner, stack: Stack, services: tuple[str, ...] | list[str], lines: int = 400) -> str:
    result = run(stack.compose("logs", "--no-color", "--no-log-prefix", "--tail", str(lines), *services))
    return result.stdout + result.stderr


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def log_tail(text: str, lines: int = LOG_TAIL) -> str:
    """The last lines of a log on one line, without terminal control sequences."""
    return " | ".join(line.strip() for line in ANSI.sub("", text).strip().splitlines()[-lines:])


def wait_healthy(run: Runner, stack: Stack, layout: Layout, adapter: EngineAdapter, base: str, timeout_s: float,
                 reporter: Reporter) -> None:
    """Until the endpoint answers its (unauthenticated) health route and, behind a gateway, every replica's
    container is healthy (the gateway is ready once one is), showing the start phases as they appear in the
    engines' logs; an engine that exits or restarts, or the timeout, is the error with its last lines."""
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while True:
        log = engine_log(run, stack, layout.engines)
        for phase, pattern in adapter.start_phases:
            if phase not in seen and re.search(pattern, log):
                seen.add(phase)
                reporter.note(phase)
        states = engine_states(run, stack, layout)
        for service, state in states.items():
            if state.get("Status") in ("exited", "dead") or int(state.get("RestartCount", 0) or 0) > 0 or (
                    state.get("Restarting")):
                last = log_tail(engine_log(run, stack, [service]))
                raise UserError(f"{_which(layout, service)} stopped (exit {state.get('ExitCode')}); its last lines: {last}")
        waiting = [s for s in layout.engines if layout.gateway and
                   (states.get(s, {}).get("Health") or {}).get("Status") != "healthy"]
        try:
            if not waiting and fetch(base + layout.health_path, 5, limit=ERROR_BYTES, cut=True).status == 200:
                return
        except WireError:
            pass
        if time.monotonic() > deadline:
            late = (f"{', '.join(waiting)} did not become healthy" if waiting
                    else f"the {layout.endpoint} did not answer {layout.health_path}")
            raise UserError(f"{late} within {timeout_s:.0f} s; the last lines: {log_tail(log)} "
                            f"(`ornith-stack logs {deployment.ENGINE_SERVICE}` shows more)")
        time.sleep(POLL_S)


def engine_states(run: Runner, stack: Stack, layout: Layout) -> dict[str, dict[str, Any]]:
    """Each engine service's container state (`docker inspect`'s State: Status, RestartCount, Health)."""
    return {service_of(c): c.get("State", {}) for c in containers(run, stack) if service_of(c) in layout.engines}


def _which(layout: Layout, service: str) -> str:
    return "the engine" if layout.gateway is None else f"replica {service}"


def smoke(base: str, adapter: EngineAdapter, model: str, key: str, layout: Layout) -> str:
    """One chat request with the key (and, with a key, the same request without it, which must be refused,
    as a user's curl without the header is); returns the message field the answer came in."""
    body = chat_body(model, SMOKE_PROMPT)
    try:
        answer = fetch(base + adapter.chat_path, 300, "POST", headers=bearer(key), json=body)
    except WireError as exc:
        raise UserError(f"the smoke request to {base} failed: {exc}") from None
    if answer.status != 200:
        raise UserError(f"the smoke request answered HTTP {answer.status}: {answer.text[:200]}")
    unauthenticated = post_without_key(base + adapter.chat_path, body) if key else None
    if key and unauthenticated != 401:
        raise UserError(f"{base}{adapter.chat_path} answered {_answer(unauthenticated)} without the API key "
                        f"(expected 401): the {layout.endpoint} did not take ORNITH_API_KEY; "
                        f"`ornith-stack logs {layout.endpoint}`")
    message = answer.json()["choices"][0]["message"]
    return "reasoning_content" if message.get("reasoning_content") else "content"


def refuse_workers(base: str) -> None:
    """A keyed gateway's worker-management route refuses a request without the key (an empty body: an open
    gateway refuses it as invalid, so the probe adds no worker)."""
    code = post_without_key(base + deployment.GATEWAY_WORKERS_PATH, {})
    if code != 401:
        raise UserError(f"{base}{deployment.GATEWAY_WORKERS_PATH} answered {_answer(code)} without the API key "
                        "(expected 401): anyone who reaches the gateway can add or remove its workers; "
                        "`ornith-stack logs gateway`")


def _answer(code: int | None) -> str:
    return "nothing" if code is None else f"HTTP {code}"


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
