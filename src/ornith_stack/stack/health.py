"""Whether started engines serve: their start phases and health, then one smoke request (`up` and its
rolling change prove every start the same way)."""

from __future__ import annotations

import re
import time
from typing import Any, Protocol

from ornith_stack.engines import EngineAdapter
from ornith_stack.errors import UserError
from ornith_stack.stack.compose import Layout, Stack, containers, service_of
from ornith_stack.stack.shell import Runner
from ornith_stack.stack.status import chat_body, post_without_key
from ornith_stack.wire.http import ERROR_BYTES, WireError, bearer, fetch

POLL_S = 3.0
SMOKE_PROMPT = "Say hello in one short sentence."
LOG_TAIL = 6


class Reporter(Protocol):
    def step(self, title: str) -> None:
        """A new step begins (the previous one is done)."""

    def note(self, text: str) -> None:
        """Progress inside the running step."""


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
                    else f"{layout.endpoint} did not answer {layout.health_path}")
            raise UserError(f"{late} within {timeout_s:.0f} s; the last lines: {log_tail(log)} "
                            f"(`ornith-stack logs {(waiting or list(layout.engines))[0]}` shows more)")
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
        raise UserError(f"{base}{adapter.chat_path} answered {answered(unauthenticated)} without the API key "
                        f"(expected 401): the {layout.endpoint} did not take ORNITH_API_KEY; "
                        f"`ornith-stack logs {layout.endpoint}`")
    message = answer.json()["choices"][0]["message"]
    return "reasoning_content" if message.get("reasoning_content") else "content"


def answered(code: int | None) -> str:
    return "nothing" if code is None else f"HTTP {code}"
