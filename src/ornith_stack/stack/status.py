"""`ornith-stack status`: per engine, what the exporter reads (health, acceptance, decode speed, requests,
KV use), from two reads of its /metrics a moment apart."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import yaml

from ornith_stack import deployment
from ornith_stack.engines import SpecCounters, acceptance_length
from ornith_stack.errors import UserError
from ornith_stack.exporter import catalogue as C
from ornith_stack.stack.compose import Layout
from ornith_stack.wire.http import ERROR_BYTES, METRICS_BYTES, WireError, basic_auth, bearer, fetch
from ornith_stack.wire.metrics import parse

Reading = dict[str, dict[str, float]]  # target -> series name -> value
INFO_LABELS = ("engine", "version", "model", "profile")


@dataclass(frozen=True)
class EngineStatus:
    target: str
    up: bool
    info: dict[str, str]
    acceptance_length: float | None  # over the interval when steps happened in it, else lifetime
    decode_tok_s: float | None
    running: float | None
    waiting: float | None
    kv_usage: float | None


def read_exporter(address: str) -> str:
    try:
        return fetch(f"http://{address}{deployment.METRICS_PATH}", 15, limit=METRICS_BYTES).text
    except WireError as exc:
        raise UserError(f"the exporter at {address} does not answer ({exc.reason}): `ornith-stack logs exporter`"
                        ) from None


def parse_exporter(text: str) -> tuple[Reading, dict[str, dict[str, str]]]:
    """Every ornith_* series by target (summed over its other labels), and each target's info labels."""
    values: Reading = defaultdict(dict)
    info: dict[str, dict[str, str]] = {}
    for name, samples in parse(text).items():
        for sample in samples:
            target = sample.labels.get("target")
            if target is None or "position" in sample.labels:
                continue
            if name == C.ENGINE_INFO.name:
                info[target] = {k: sample.labels.get(k, "") for k in INFO_LABELS}
            values[target][name] = values[target].get(name, 0.0) + sample.value
    return values, info


def engine_status(address: str, interval_s: float = 2.0) -> list[EngineStatus]:
    before = read_exporter(address)
    started = time.monotonic()
    time.sleep(interval_s)
    after = read_exporter(address)
    return compare(before, after, time.monotonic() - started)


def compare(before_text: str, after_text: str, elapsed: float) -> list[EngineStatus]:
    """Each engine's figures from two exporter scrapes `elapsed` seconds apart."""
    before, _ = parse_exporter(before_text)
    after, info = parse_exporter(after_text)
    rows = []
    for target, now in sorted(after.items()):
        then = before.get(target, {})
        rows.append(EngineStatus(
            target=target,
            up=now.get(C.ENGINE_UP.series) == 1.0,
            info=info.get(target, {}),
            acceptance_length=_acceptance(then, now),
            decode_tok_s=_rate(then, now, C.DECODE_TOKENS.series, elapsed),
            running=now.get(C.REQUESTS_RUNNING.series),
            waiting=now.get(C.REQUESTS_WAITING.series),
            kv_usage=now.get(C.KV_CACHE_USAGE.series),
        ))
    return rows


def _counters(values: dict[str, float]) -> SpecCounters | None:
    steps = values.get(C.SPEC_STEPS.series)
    return None if steps is None else SpecCounters(steps, values.get(C.SPEC_ACCEPTED_TOKENS.series, 0.0))


def _acceptance(then: dict[str, float], now: dict[str, float]) -> float | None:
    after = _counters(now)
    if after is None:
        return now.get(C.SPEC_ENGINE_ACCEPTANCE_LENGTH.series)
    window = acceptance_length(_counters(then), after)
    return window if window is not None else acceptance_length(None, after)


def _rate(then: dict[str, float], now: dict[str, float], name: str, elapsed: float) -> float | None:
    if name not in now or name not in then or elapsed <= 0 or now[name] < then[name]:
        return None
    return (now[name] - then[name]) / elapsed


def chat_body(model: str, prompt: str, max_tokens: int = 32) -> dict[str, Any]:
    """A chat request with thinking on (Ornith/Qwen3.5 then answer in `reasoning_content` first)."""
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "chat_template_kwargs": {"enable_thinking": True}}


def post_without_key(url: str, body: dict[str, Any]) -> int | None:
    """The HTTP status of a POST without an Authorization header (None: nothing answered)."""
    return status_with(url, "POST", "", body)


def status_with(url: str, method: str, key: str, body: dict[str, Any] | None = None) -> int | None:
    """The HTTP status of a request with `key` as its bearer (empty: no Authorization header; None: nothing
    answered). A POST or PUT carries `body` (none: an empty JSON object, which no route acts on)."""
    payload = (body if body is not None else {}) if method in ("POST", "PUT") else None
    try:
        return fetch(url, 300, method, headers=bearer(key), json=payload, limit=ERROR_BYTES, cut=True).status
    except WireError:
        return None


def refuses(code: int | None) -> bool | None:
    """Whether a request without the key was refused (None: nothing answered)."""
    return None if code is None else code in (401, 403)


def answers_ready(url: str) -> bool:
    try:
        return fetch(url, 10, limit=ERROR_BYTES, cut=True).status == 200
    except WireError:
        return False


def monitoring_login(password: str) -> dict[str, str]:
    """The basic-auth header of Prometheus and Alertmanager with the monitoring password (none: no password)."""
    return basic_auth(deployment.MONITORING_USER, password) if password else {}


def asks_for_login(address: str) -> bool | None:
    """Whether the service at host:port refuses a request without the monitoring password (None: it did
    not answer)."""
    try:
        return refuses(fetch(f"http://{address}/-/ready", 10, limit=ERROR_BYTES, cut=True).status)
    except WireError:
        return None


def _loaded_config(address: str, password: str) -> str | None:
    """The configuration the running Alertmanager at host:port loaded, from its own API (None: it did not
    answer, or not to `password`): what it uses, not what a file on the host says."""
    try:
        loaded = fetch(f"http://{address}/api/v2/status", 10, headers=monitoring_login(password)).json()
        loaded = loaded["config"]["original"]
    except (WireError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return loaded if isinstance(loaded, str) else None


def alerts_go_nowhere(address: str, password: str = "") -> bool | None:
    """Whether the running Alertmanager at host:port still sends to the generated placeholder webhook, a
    reserved name that never resolves (None: it did not answer, or not to `password`)."""
    loaded = _loaded_config(address, password)
    return None if loaded is None else deployment.ALERT_WEBHOOK_PLACEHOLDER in loaded


def heartbeat_goes_nowhere(address: str, password: str = "") -> bool | None:
    """Whether the running Alertmanager's heartbeat receiver (the dead man's switch that notices a broken
    alert path) has no webhook or the placeholder (None: it did not answer, or not to `password`)."""
    loaded = _loaded_config(address, password)
    if loaded is None:
        return None
    try:
        receivers = yaml.safe_load(loaded).get("receivers") or []
    except (yaml.YAMLError, AttributeError):
        return None
    hooks = [c.get("url", "") for r in receivers if isinstance(r, dict) and r.get("name") == deployment.HEARTBEAT_RECEIVER
             for c in r.get("webhook_configs") or []]
    return not [url for url in hooks if url and url != deployment.ALERT_WEBHOOK_PLACEHOLDER]


@dataclass(frozen=True)
class EndpointAccess:
    """What answers at the published endpoint without the API key."""

    api: bool | None  # a chat request without the key is refused (None: nothing answered)
    workers: bool | None  # a gateway's /workers refuses it (None: no gateway, or nothing answered)
    gateway_ready: bool | None  # the gateway's readiness route answers 200 (None: no gateway)


def endpoint_access(base: str, layout: Layout, chat_path: str, model: str) -> EndpointAccess:
    """Probes of the endpoint at `base` as a caller without the key (a gateway's /v1/models is open even
    with a key, so a chat request decides; keyed, it is refused before any generation)."""
    api = refuses(post_without_key(base + chat_path, chat_body(model, "ping", max_tokens=1)))
    if layout.gateway is None:
        return EndpointAccess(api, None, None)
    workers = refuses(post_without_key(base + deployment.GATEWAY_WORKERS_PATH, {}))
    return EndpointAccess(api, workers, answers_ready(base + layout.health_path))
