"""A rolling `up`: with replicas behind the Model Gateway, the changed engines are recreated one at a time
while the others serve, so a change fails no request.

Per replica: out of the gateway's rotation (smg's worker API, workers.py, with the operator's credential),
drained (its own running and waiting gauges, read from its /metrics through the engine adapter, at 0; at most
the drain timeout), recreated
(`docker compose up --no-deps`), proved (healthy and one smoke request, at its own address), back in rotation
(`POST /workers`, then listed again); then the next one. The rest of the stack follows with the usual
`compose up`.

Before a replica leaves the rotation it is recorded in a state file beside the env file
(`.ornith-rolling-PROJECT.json`, mode 0600): an interrupted roll is repaired by the next `up`, which first
puts back every replica recorded out, once it is healthy. The same file keeps how long the engines' last start
took, which a single engine's `up` quotes as the downtime a change costs.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ornith_stack import deployment
from ornith_stack.engines import EngineAdapter
from ornith_stack.errors import UserError
from ornith_stack.stack.compose import Layout, Stack, container_address, published
from ornith_stack.stack.envfile import OPERATOR_VAR, write_private
from ornith_stack.stack.health import Reporter, engine_states, smoke, wait_healthy
from ornith_stack.stack.shell import Runner, first_line
from ornith_stack.stack.status import answers_ready
from ornith_stack.stack.workers import Gateway
from ornith_stack.wire.http import ERROR_BYTES, METRICS_BYTES, WireError, fetch
from ornith_stack.wire.metrics import BadExposition, parse

# How long a replica may take to finish its requests once out of rotation: the gateway's request timeout, as
# no request through the gateway lives longer (`up --drain-timeout` sets another).
DRAIN_TIMEOUT_S = float(deployment.GATEWAY_REQUEST_TIMEOUT_S)
DRAIN_POLL_S = 1.0
# Reads of 0 in a row that make a replica drained: a request the gateway routed just before the replica left
# its rotation reaches the engine a moment later.
DRAINED_READS = 2
STATE_PREFIX = ".ornith-rolling-"


# ------------------------------------------------------------------------------------------ the state file
@dataclass
class RollState:
    out: list[str] = field(default_factory=list)  # replicas taken out of rotation and not yet put back
    last_start_s: float | None = None  # how long the engines took to become healthy, the last time `up` started them


def state_path(stack: Stack) -> Path:
    """compose/.ornith-rolling-PROJECT.json: beside the env file (git-ignored, like it)."""
    env_file = stack.env_file or stack.compose_file.with_name(".env")
    return env_file.with_name(f"{STATE_PREFIX}{stack.project}.json")


def read_state(stack: Stack) -> RollState:
    path = state_path(stack)
    try:
        data = json.loads(path.read_text())
        out, last = data.get("out", []), data.get("last_start_s")
    except FileNotFoundError:
        return RollState()
    except (OSError, ValueError, AttributeError):
        raise UserError(f"{path} is not the record of a rolling `up`: check `ornith-stack status` (a replica may be "
                        "out of rotation), then remove the file") from None
    return RollState([s for s in out if isinstance(s, str)] if isinstance(out, list) else [],
                     float(last) if isinstance(last, (int, float)) else None)


def write_state(stack: Stack, state: RollState) -> None:
    """The record, mode 0600; none left when it holds nothing."""
    path = state_path(stack)
    if not state.out and state.last_start_s is None:
        path.unlink(missing_ok=True)
    else:
        write_private(path, json.dumps(asdict(state)) + "\n")


def mark_out(stack: Stack, service: str, out: bool) -> None:
    state = read_state(stack)
    state.out = [s for s in state.out if s != service] + ([service] if out else [])
    write_state(stack, state)


def remember_start(stack: Stack, seconds: float) -> None:
    state = read_state(stack)
    state.last_start_s = round(seconds, 1)
    write_state(stack, state)


def downtime_note(stack: Stack) -> str:
    """What a change costs a single engine: it restarts, and serves nothing meanwhile."""
    last = read_state(stack).last_start_s
    took = f"its last start took {last:.0f} s" if last is not None else "no start of it measured yet"
    return f"one engine, no replica to take over: the change means downtime while it restarts ({took})"


# ---------------------------------------------------------------------------------------------- a roll
@dataclass(frozen=True)
class Prefixed:
    """A reporter whose notes name the replica they are about."""

    reporter: Reporter
    prefix: str

    def step(self, title: str) -> None:
        self.reporter.step(title)

    def note(self, text: str) -> None:
        self.reporter.note(f"{self.prefix}: {text}")


@dataclass(frozen=True)
class Roll:
    """What rolling a stack's replicas needs: how to reach them and the gateway, and how long to wait."""

    run: Runner
    stack: Stack
    layout: Layout
    adapter: EngineAdapter
    port: int  # the engines' (and the gateway's) API port
    model: str
    key: str  # the users' key, for the smoke request
    operator: str  # the operator's credential, for the gateway's worker routes
    start_timeout_s: float
    drain_timeout_s: float
    reporter: Reporter

    def gateway(self) -> Gateway:
        if not self.operator:
            raise UserError(f"a rolling change needs the operator's credential ({OPERATOR_VAR}), which --no-api-key "
                            "leaves out: run `up` with a key, or `up --all-at-once` (every replica restarts together, "
                            "requests fail meanwhile)")
        address = published(self.run, self.stack, str(self.layout.gateway), self.port)
        if address is None:
            raise UserError(f"the {self.layout.gateway} service publishes no port {self.port}: "
                            f"`ornith-stack logs {self.layout.gateway}`")
        return Gateway(f"http://{address}", self.operator)

    def serving(self) -> bool:
        """Whether the gateway serves now (ready: a replica behind it is healthy)."""
        address = published(self.run, self.stack, str(self.layout.gateway), self.port)
        return address is not None and answers_ready(f"http://{address}{self.layout.health_path}")

    def url(self, service: str) -> str:
        return deployment.worker_url(service, self.port)

    def address(self, service: str) -> str | None:
        return container_address(self.run, self.stack, service, self.port)

    def note(self, service: str, text: str) -> None:
        self.reporter.note(f"{service}: {text}")


def in_flight(adapter: EngineAdapter, address: str) -> float | None:
    """The requests an engine runs or holds (its own gauges); None: its /metrics does not answer."""
    try:
        samples = parse(fetch(f"http://{address}{adapter.metrics_path}", 10, limit=METRICS_BYTES).text)
    except (WireError, BadExposition):
        return None
    names = adapter.metrics
    return sum(adapter.read(samples, name) or 0.0 for name in (names.requests_running, names.requests_waiting))


def container_healthy(roll: Roll, service: str) -> bool:
    state = engine_states(roll.run, roll.stack, Layout((service,), None, roll.adapter.health_path)).get(service, {})
    return (state.get("Health") or {}).get("Status") == "healthy"


def serves(roll: Roll, service: str) -> bool:
    """The replica answers its health route at its own address."""
    address = roll.address(service)
    try:
        return address is not None and fetch(f"http://{address}{roll.adapter.health_path}", 5, limit=ERROR_BYTES,
                                             cut=True).status == 200
    except WireError:
        return False


def drain(roll: Roll, service: str) -> None:
    """Until the replica runs and holds no request (DRAINED_READS reads of 0 in a row), at most the drain timeout."""
    address = roll.address(service)
    count = first = in_flight(roll.adapter, address) if address else None
    if count is None and address is not None and container_healthy(roll, service):
        raise UserError(f"{service}'s {roll.adapter.metrics_path} does not answer at {address} from this host, so "
                        "its requests cannot be counted: `up --all-at-once` recreates without draining")
    started, zeros = time.monotonic(), 0
    while count is not None and (zeros := zeros + 1 if count == 0 else 0) < DRAINED_READS:
        if count and time.monotonic() - started > roll.drain_timeout_s:
            raise UserError(f"{service} still had {count:.0f} requests in flight after {roll.drain_timeout_s:.0f} s "
                            "(--drain-timeout)")
        time.sleep(DRAIN_POLL_S)
        count = in_flight(roll.adapter, str(address))
    roll.note(service, "not serving: nothing to drain" if first is None else
              f"drained in {time.monotonic() - started:.1f} s ({first:.0f} in flight when taken out)")


def recreate(roll: Roll, service: str) -> None:
    result = roll.run(roll.stack.compose("up", "--detach", "--no-build", "--no-deps", service), timeout=900)
    if result.returncode != 0:
        raise UserError(f"`docker compose up {service}` failed: {first_line(result)}")
    roll.note(service, "recreated")


def prove(roll: Roll, service: str) -> float:
    """Until the replica is healthy and answers a smoke request at its own address; the seconds it took."""
    started = time.monotonic()
    address = roll.address(service)
    if address is None:
        raise UserError(f"{service} has no running container")
    alone = Layout((service,), None, roll.adapter.health_path)
    wait_healthy(roll.run, roll.stack, alone, roll.adapter, f"http://{address}", roll.start_timeout_s,
                 Prefixed(roll.reporter, service))
    smoke(f"http://{address}", roll.adapter, roll.model, roll.key, alone)
    return time.monotonic() - started


def put_back(roll: Roll, service: str) -> None:
    """Back in rotation and the record of it removed; a gateway that does not take it is the error."""
    try:
        roll.gateway().put_back(roll.url(service))
    except UserError as exc:
        raise UserError(f"{service} is healthy but not back in rotation: {exc}; `ornith-stack up` puts it back"
                        ) from None
    mark_out(roll.stack, service, False)
    roll.note(service, "back in rotation")


def restore(roll: Roll, service: str) -> str:
    """After a failure before the recreate the replica is unchanged: back in rotation if it serves."""
    if not serves(roll, service):
        return f"{service} stays out of rotation (it does not answer its health route)"
    try:
        put_back(roll, service)
    except UserError:
        return f"{service} may be out of rotation: the next `ornith-stack up` puts it back"
    return f"{service} is back in rotation, not recreated"


def take_out_and_drain(roll: Roll, service: str) -> None:
    mark_out(roll.stack, service, True)  # recorded first: an interruption from here on is repaired by `up`
    try:
        others = [u for u, w in roll.gateway().workers().items() if w.healthy and u != roll.url(service)]
        if not others:
            roll.note(service, "no other replica is healthy in rotation: requests fail until it is back")
        was_in = roll.gateway().take_out(roll.url(service))
        # Not listed: new (a replica added to the layout) or left out by an earlier failure.
        roll.note(service, "out of rotation" if was_in else "not in rotation")
        drain(roll, service)
    except KeyboardInterrupt:
        roll.note(service, f"interrupted: {restore(roll, service)}")
        raise
    except UserError as exc:
        raise UserError(f"{exc}; {restore(roll, service)}: the roll stopped there (`up --drain-timeout SECONDS` "
                        "waits longer; `up --all-at-once` restarts every replica together)") from None


def roll_replica(roll: Roll, service: str) -> None:
    """One replica: out, drained, recreated, healthy, back in."""
    take_out_and_drain(roll, service)
    try:
        recreate(roll, service)
        took = prove(roll, service)
    except KeyboardInterrupt:
        roll.note(service, "interrupted: out of rotation until `ornith-stack up` runs again (it puts it back once "
                           "healthy)")
        raise
    except UserError as exc:
        raise UserError(f"{service} is out of rotation and not healthy: {exc}. The other replicas serve: fix the cause "
                        f"(`ornith-stack logs {service}`) and run `ornith-stack up` again, which puts it back once "
                        "healthy") from None
    roll.note(service, f"healthy after {took:.0f} s")
    put_back(roll, service)


def resume(roll: Roll) -> None:
    """Put back every replica an interrupted roll recorded out, once healthy (one that is not, or that the gateway
    does not take, stays out and recorded: a change the roll then applies recreates it)."""
    recorded = read_state(roll.stack).out
    if not recorded:
        return
    roll.reporter.step("rotation")
    for service in recorded:
        if service not in roll.layout.engines:
            mark_out(roll.stack, service, False)
            continue
        roll.note(service, "recorded out of rotation by an interrupted `up`")
        try:
            roll.note(service, f"healthy after {prove(roll, service):.0f} s")
            put_back(roll, service)
        except UserError as exc:  # `up` goes on: the change it applies may be what repairs the replica
            roll.note(service, f"stays out of rotation: {exc}")


def roll_engines(roll: Roll, stale: list[str], all_at_once: bool) -> list[str]:
    """Recreate the changed replicas one at a time, when there are replicas and the gateway serves (else
    nothing: the caller's `compose up` starts every changed service at once); the replicas rolled."""
    engines = [s for s in roll.layout.engines if s in stale]
    if roll.layout.gateway is None or not engines:
        return []
    if all_at_once:
        roll.reporter.note("--all-at-once: the changed replicas restart together (their requests fail meanwhile)")
        return []
    if not roll.serving():
        roll.reporter.note(f"the {roll.layout.gateway} serves nothing now: the changed services start at once")
        return []
    roll.gateway().workers()  # the operator's credential opens the worker routes, before anything changes
    roll.reporter.step(f"rolling {len(engines)} of {len(roll.layout.engines)} replicas, one at a time")
    for service in engines:
        roll_replica(roll, service)
    return engines
