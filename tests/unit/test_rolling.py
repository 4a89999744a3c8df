"""The rolling `up` (issue 43 item 1): with replicas behind the Model Gateway a change is applied one replica at
a time: out of rotation, drained, recreated, healthy, back in rotation, then the next one.

Docker is a fake Runner that keeps the containers' state (compose's config hashes, recreates); the gateway is a
loopback HTTP server speaking smg 0.3.2's worker API as measured by hand (GET /workers lists id and url, DELETE
/workers/{id} and POST /workers answer 202 and apply at once, the operator's credential or 401); each replica
is a loopback engine (tests/fake_engine.py) whose /metrics is vLLM 0.24.0's recorded text with the running
gauge set by the test."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fake_engine import FakeEngine, Route
from test_up_replicas import Notes, replica_profile

from ornith_stack import deployment
from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError
from ornith_stack.profiles import load_profile
from ornith_stack.profiles.model import Profile
from ornith_stack.stack import health, rolling, workers
from ornith_stack.stack.bringup import start
from ornith_stack.stack.compose import Stack, layout_for
from ornith_stack.stack.rolling import Roll, RollState, read_state, resume, state_path, write_state
from ornith_stack.stack.shell import Result

ROOT = Path(__file__).resolve().parents[2]
VLLM_METRICS = (ROOT / "tests/fixtures/engines/vllm-0.24.0/ngram/metrics.txt").read_text()
OPERATOR = "operator-credential-for-the-test"
OLD, NEW = "hash-old", "hash-new"


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rolling, "DRAIN_POLL_S", 0.01)
    monkeypatch.setattr(workers, "ROTATION_POLL_S", 0.01)
    monkeypatch.setattr(health, "POLL_S", 0.01)


class Gauges(Route):
    """vLLM's recorded /metrics of `engine` with `running` requests at its first read, one fewer at each
    later one (`finishing` False: stuck there)."""

    def __init__(self, engine: FakeEngine, running: int, finishing: bool = True) -> None:
        super().__init__()
        self.engine, self.running, self.finishing = engine, running, finishing

    @property  # type: ignore[override]
    def body(self) -> bytes:
        reads = self.engine.hits.get("/metrics", 1) - 1 if self.finishing else 0
        left = max(0, self.running - reads)
        return re.sub(r"^(vllm:num_requests_running\{[^}]*\}) 0\.0$", rf"\1 {left}.0", VLLM_METRICS,
                      flags=re.MULTILINE).encode()

    @body.setter
    def body(self, value: bytes) -> None:
        pass


CHAT = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello."}}]})


def replica(running: int = 0, finishing: bool = True) -> FakeEngine:
    engine = FakeEngine()
    engine.routes["/health"] = Route("")
    engine.routes["/metrics"] = Gauges(engine, running, finishing)
    engine.routes["/v1/chat/completions"] = Route(CHAT, content_type="application/json")
    return engine


class FakeGateway:
    """smg 0.3.2's worker routes and readiness on loopback; every change to its rotation is an event."""

    def __init__(self, urls: list[str], events: list[tuple[str, str]]) -> None:
        self.workers = {str(uuid.uuid4()): url for url in urls}
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, payload: object = None) -> None:
                body = json.dumps(payload or {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _operator(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {OPERATOR}":
                    return True
                self._answer(401)
                return False

            def do_GET(self) -> None:
                if self.path == deployment.GATEWAY_HEALTH_PATH:
                    self._answer(200 if gateway.workers else 503)
                elif self._operator():
                    self._answer(200, {"workers": [{"id": i, "url": u, "is_healthy": True}
                                                   for i, u in gateway.workers.items()]})

            def do_DELETE(self) -> None:
                worker = self.path.rpartition("/")[2]
                if self._operator():
                    url = gateway.workers.pop(worker, None)
                    events.append(("out", str(url)))
                    self._answer(202 if url else 404)

            def do_POST(self) -> None:
                url = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))["url"]
                if self._operator():
                    gateway.workers[str(uuid.uuid4())] = url
                    events.append(("in", url))
                    self._answer(202)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def listed(self) -> list[str]:
        return sorted(self.workers.values())


def compose_verb(argv: list[str]) -> list[str]:
    """`docker compose` argv without its global options (-p, -f, --env-file and their values)."""
    rest = argv[argv.index("compose") + 1:]
    while rest and rest[0] in ("-p", "-f", "--env-file"):
        rest = rest[2:]
    return rest


@dataclass
class Container:
    service: str
    config_hash: str
    healthy: bool = True


class FakeDocker:
    """The Docker CLI of one running stack: `compose config --hash`, `ps`, `inspect`, `port`, `logs` and `up`,
    each `up` an event (a recreate gives the container the configuration compose resolves now)."""

    def __init__(self, stack: Stack, want: dict[str, str], have: dict[str, str], ports: dict[str, str],
                 events: list[tuple[str, str]]) -> None:
        self.stack, self.want, self.ports, self.events = stack, want, ports, events
        self.containers = {s: Container(s, h) for s, h in have.items()}
        self.interrupt: str | None = None  # a replica whose recreate is interrupted (Ctrl-C)
        self.out_when_recreated: dict[str, list[str]] = {}  # what the state file recorded at each recreate

    def __call__(self, argv: Sequence[str], timeout: float = 600.0, on_line: object = None) -> Result:
        args = list(argv)
        if args[:3] == ["docker", "image", "inspect"]:
            return self._ok("sha256:image\n")
        if args[:2] == ["docker", "inspect"]:
            return self._ok(json.dumps([self._inspect(c) for c in self.containers.values()]))
        return self._compose(compose_verb(args))

    def _compose(self, verb: list[str]) -> Result:
        if verb[:2] == ["config", "--hash"]:
            return self._ok("".join(f"{s} {h}\n" for s, h in self.want.items()))
        if verb[:1] == ["ps"]:
            return self._ok("".join(f"c-{s}\n" for s in self.containers))
        if verb[:1] == ["port"]:
            address = self.ports.get(verb[1]) if verb[1] in self.containers else None
            return self._ok(f"{address}\n") if address else subprocess.CompletedProcess(verb, 1, "", "no port")
        if verb[:1] == ["logs"]:
            return self._ok("")
        if verb[:1] == ["up"]:
            return self._up(verb)
        raise AssertionError(f"no answer for docker compose {verb}")

    def _up(self, verb: list[str]) -> Result:
        if "--no-deps" in verb:
            service = verb[-1]
            if service == self.interrupt:
                raise KeyboardInterrupt
            self.out_when_recreated[service] = read_state(self.stack).out
            self.events.append(("recreated", service))
            self.containers[service] = Container(service, self.want[service])
        else:
            self.events.append(("compose up", "*"))
            self.containers.update({s: Container(s, h) for s, h in self.want.items()})
        return self._ok("")

    def _inspect(self, container: Container) -> dict[str, object]:
        return {"Id": f"c-{container.service}", "Image": "sha256:image",
                "Config": {"Image": "ornith-stack/vllm-cpu-demo:0.1.0",
                           "Labels": {"com.docker.compose.service": container.service,
                                      "com.docker.compose.config-hash": container.config_hash}},
                "HostConfig": {"RestartPolicy": {"Name": "unless-stopped"}},
                "State": {"Status": "running", "Running": True, "RestartCount": 0,
                          "Health": {"Status": "healthy" if container.healthy else "starting"}}}

    @staticmethod
    def _ok(stdout: str) -> Result:
        return subprocess.CompletedProcess([], 0, stdout, "")


@dataclass
class World:
    roll: Roll
    docker: FakeDocker
    gateway: FakeGateway
    engines: dict[str, FakeEngine]
    events: list[tuple[str, str]]
    notes: Notes

    def url(self, service: str) -> str:
        return deployment.worker_url(service, self.roll.port)


def world(tmp_path: Path, profile: Profile, changed: Sequence[str], running: dict[str, int] | None = None,
          operator: str = OPERATOR, drain_timeout_s: float = 60.0, start_timeout_s: float = 5.0,
          finishing: bool = True) -> World:
    """A running stack of `profile` whose `changed` services compose resolves differently now."""
    (tmp_path / "compose").mkdir(parents=True, exist_ok=True)
    stack = Stack(profile.name, f"ornith-{profile.name}", tmp_path / "compose" / f"{profile.name}.yml",
                  tmp_path / "compose" / ".env")
    layout = layout_for(profile)
    events: list[tuple[str, str]] = []
    engines = {s: replica((running or {}).get(s, 0), finishing) for s in layout.engines}
    port = profile.serve.port
    gateway = FakeGateway([deployment.worker_url(s, port) for s in layout.engines], events)
    services = [*layout.services, "exporter"]
    want = {s: NEW if s in changed else OLD for s in services}
    ports = {s: e.url.removeprefix("http://") for s, e in engines.items()}
    if layout.gateway:
        ports[layout.gateway] = gateway.address
    docker = FakeDocker(stack, want, dict.fromkeys(services, OLD), ports, events)
    notes = Notes()
    roll = Roll(docker, stack, layout, adapter_for(profile), port, "ornith-tiny", "", operator, start_timeout_s,
                drain_timeout_s, notes)
    return World(roll, docker, gateway, engines, events, notes)


@pytest.fixture
def engines_changed(tmp_path: Path) -> Iterator[World]:
    """Two replicas (engine-0 with 2 requests in flight), both changed, and the exporter with them."""
    yield world(tmp_path, replica_profile(), ["engine-0", "engine-1", "exporter"], running={"engine-0": 2})


def replica_notes(notes: Notes) -> list[str]:
    return [re.sub(r"[0-9.]+ s\b", "N s", n) for n in notes.seen if n.startswith("engine-")]


def test_a_change_rolls_one_replica_at_a_time_then_starts_the_rest(engines_changed: World) -> None:
    w = engines_changed
    changed, engines_started = start(w.roll, images_changed=False, all_at_once=False)
    url0, url1 = w.url("engine-0"), w.url("engine-1")
    assert w.events == [("out", url0), ("recreated", "engine-0"), ("in", url0),
                        ("out", url1), ("recreated", "engine-1"), ("in", url1), ("compose up", "*")]
    assert replica_notes(w.notes) == [
        "engine-0: out of rotation", "engine-0: drained in N s (2 in flight when taken out)", "engine-0: recreated",
        "engine-0: healthy after N s", "engine-0: back in rotation",
        "engine-1: out of rotation", "engine-1: drained in N s (0 in flight when taken out)", "engine-1: recreated",
        "engine-1: healthy after N s", "engine-1: back in rotation"]
    assert "rolling 2 of 2 replicas, one at a time" in w.notes.seen
    # Drained to the last request: the running gauge was read until it stayed at 0.
    assert w.engines["engine-0"].hits["/metrics"] >= 2 + rolling.DRAINED_READS
    # Each replica was recorded out of rotation while it was recreated; the record is gone afterwards.
    assert w.docker.out_when_recreated == {"engine-0": ["engine-0"], "engine-1": ["engine-1"]}
    assert not state_path(w.roll.stack).exists()
    assert w.gateway.listed() == [url0, url1]
    stack = w.roll.stack
    assert changed == ["rolled engine-0, engine-1 one at a time", f"started {stack.project} ({stack.compose_file.name})"]
    assert engines_started is False  # the engines were rolled, not started by `compose up`


def test_only_the_changed_replica_rolls_and_nothing_else_starts(tmp_path: Path) -> None:
    w = world(tmp_path, replica_profile(), ["engine-1"])
    changed, _ = start(w.roll, images_changed=False, all_at_once=False)
    url1 = w.url("engine-1")
    assert w.events == [("out", url1), ("recreated", "engine-1"), ("in", url1)]
    assert changed == ["rolled engine-1 one at a time"]


def test_an_interrupted_roll_is_resumed_by_the_next_up(engines_changed: World) -> None:
    w = engines_changed
    w.docker.interrupt = "engine-1"
    with pytest.raises(KeyboardInterrupt):
        start(w.roll, images_changed=False, all_at_once=False)
    url0, url1 = w.url("engine-0"), w.url("engine-1")
    # Ctrl-C while engine-1 was out of rotation: recorded, and said.
    assert w.gateway.listed() == [url0]
    assert read_state(w.roll.stack).out == ["engine-1"]
    assert state_path(w.roll.stack).stat().st_mode & 0o777 == 0o600
    assert w.notes.seen[-1] == ("engine-1: interrupted: out of rotation until `ornith-stack up` runs again (it puts "
                                "it back once healthy)")
    # The next `up` first puts it back (it is healthy), says so, and removes the record.
    w.events.clear()
    w.notes.seen.clear()
    resume(w.roll)
    assert w.events == [("in", url1)] and w.gateway.listed() == [url0, url1]
    assert w.notes.seen[:2] == ["rotation", "engine-1: recorded out of rotation by an interrupted `up`"]
    assert w.notes.seen[-1] == "engine-1: back in rotation"
    assert not state_path(w.roll.stack).exists()


def test_a_replica_the_gateway_does_not_take_back_stays_recorded_and_up_goes_on(tmp_path: Path) -> None:
    w = world(tmp_path, replica_profile(), [], operator="another")  # the gateway refuses this credential
    write_state(w.roll.stack, RollState(out=["engine-1"]))
    resume(w.roll)
    assert w.notes.seen[-1].startswith("engine-1: stays out of rotation: engine-1 is healthy but not back in "
                                       "rotation: the gateway refused ORNITH_OPERATOR_KEY on GET /workers (HTTP 401)")
    assert read_state(w.roll.stack).out == ["engine-1"] and w.events == []


def test_ctrl_c_while_draining_puts_the_unchanged_replica_back_at_once(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    w = world(tmp_path, replica_profile(), ["engine-0"], running={"engine-0": 5}, finishing=False)

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(rolling.time, "sleep", interrupted)
    with pytest.raises(KeyboardInterrupt):
        start(w.roll, images_changed=False, all_at_once=False)
    url0 = w.url("engine-0")
    assert w.events == [("out", url0), ("in", url0)]
    assert w.notes.seen[-1] == "engine-0: interrupted: engine-0 is back in rotation, not recreated"
    assert not state_path(w.roll.stack).exists()


def test_a_replica_that_does_not_drain_in_time_goes_back_and_the_roll_stops(tmp_path: Path) -> None:
    w = world(tmp_path, replica_profile(), ["engine-0", "engine-1"], running={"engine-0": 3}, finishing=False,
              drain_timeout_s=0.05)
    with pytest.raises(UserError) as caught:
        start(w.roll, images_changed=False, all_at_once=False)
    message = str(caught.value)
    assert message == ("engine-0 still had 3 requests in flight after 0 s (--drain-timeout); engine-0 is back in "
                       "rotation, not recreated: the roll stopped there (`up --drain-timeout SECONDS` waits longer; "
                       "`up --all-at-once` restarts every replica together)")
    assert "\n" not in message
    url0 = w.url("engine-0")
    assert w.events == [("out", url0), ("in", url0)]  # not recreated, and engine-1 untouched
    assert w.gateway.listed() == [url0, w.url("engine-1")]
    assert not state_path(w.roll.stack).exists()


def test_a_replica_that_never_becomes_healthy_is_left_out_and_named(tmp_path: Path) -> None:
    w = world(tmp_path, replica_profile(), ["engine-0"], start_timeout_s=0.05)
    w.engines["engine-0"].routes["/health"] = Route("loading", status=503)
    with pytest.raises(UserError, match=r"^engine-0 is out of rotation and not healthy: engine-0 did not answer "
                                        r"/health within 0 s; .* fix the cause \(`ornith-stack logs engine-0`\) and "
                                        r"run `ornith-stack up` again, which puts it back once healthy$"):
        start(w.roll, images_changed=False, all_at_once=False)
    assert w.gateway.listed() == [w.url("engine-1")]
    assert read_state(w.roll.stack).out == ["engine-0"]
    # Still unhealthy at the next `up`: it stays out, recorded, and `up` goes on to apply the change.
    w.notes.seen.clear()
    resume(w.roll)
    assert w.notes.seen[-1].startswith("engine-0: stays out of rotation: engine-0 did not answer")
    assert read_state(w.roll.stack).out == ["engine-0"]


def test_all_at_once_recreates_every_changed_service_together(engines_changed: World) -> None:
    w = engines_changed
    changed, engines_started = start(w.roll, images_changed=False, all_at_once=True)
    assert w.events == [("compose up", "*")]
    assert "--all-at-once: the changed replicas restart together (their requests fail meanwhile)" in w.notes.seen
    assert engines_started and changed == [f"started {w.roll.stack.project} ({w.roll.stack.compose_file.name})"]


def test_a_stack_not_serving_yet_starts_at_once(tmp_path: Path) -> None:
    w = world(tmp_path, replica_profile(), ["engine-0", "engine-1"])
    w.gateway.workers.clear()  # /readiness: 503
    start(w.roll, images_changed=False, all_at_once=False)
    assert w.events == [("compose up", "*")]
    assert "the gateway serves nothing now: the changed services start at once" in w.notes.seen


def test_without_the_operators_credential_the_roll_refuses_before_anything_changes(tmp_path: Path) -> None:
    for operator, refusal in (("", r"^a rolling change needs the operator's credential \(ORNITH_OPERATOR_KEY\)"),
                              ("another", r"^the gateway refused ORNITH_OPERATOR_KEY on GET /workers \(HTTP 401\)")):
        w = world(tmp_path / (operator or "none"), replica_profile(), ["engine-0"], operator=operator)
        with pytest.raises(UserError, match=refusal):
            start(w.roll, images_changed=False, all_at_once=False)
        assert w.events == [] and not state_path(w.roll.stack).exists()


def test_a_gateway_gone_mid_roll_is_one_line_and_the_replica_stays_recorded(tmp_path: Path) -> None:
    w = world(tmp_path, replica_profile(), ["engine-0"])
    w.docker.interrupt = None
    original = w.docker._up

    def gateway_dies(verb: list[str]) -> Result:
        w.gateway.server.shutdown()
        w.gateway.server.server_close()
        return original(verb)

    w.docker._up = gateway_dies  # type: ignore[method-assign]
    with pytest.raises(UserError, match=r"^engine-0 is healthy but not back in rotation: the gateway at "
                                        r"http://127\.0\.0\.1:\d+ does not answer GET /workers \(connect\): "
                                        r"`ornith-stack logs gateway`; `ornith-stack up` puts it back$"):
        start(w.roll, images_changed=False, all_at_once=False)
    assert read_state(w.roll.stack).out == ["engine-0"]


def test_one_engine_says_a_change_means_downtime_and_how_long_its_last_start_took(tmp_path: Path) -> None:
    w = world(tmp_path, load_profile("cpu-demo"), ["engine"])
    write_state(w.roll.stack, RollState(last_start_s=48.2))
    changed, engines_started = start(w.roll, images_changed=False, all_at_once=False)
    assert w.notes.seen == ["one engine, no replica to take over: the change means downtime while it restarts "
                            "(its last start took 48 s)"]
    assert w.events == [("compose up", "*")] and engines_started
    assert changed == [f"started {w.roll.stack.project} ({w.roll.stack.compose_file.name})"]


def test_nothing_changed_starts_nothing(tmp_path: Path) -> None:
    w = world(tmp_path, replica_profile(), [])
    assert start(w.roll, images_changed=False, all_at_once=False) == ([], False)
    assert w.events == [] and w.notes.seen == ["every service runs as configured"]


def test_the_state_file_is_kept_beside_the_env_file_and_a_broken_one_is_named(tmp_path: Path) -> None:
    stack = Stack("x2", "ornith-x2", tmp_path / "x2.yml", tmp_path / "compose" / ".env")
    assert state_path(stack) == tmp_path / "compose" / ".ornith-rolling-ornith-x2.json"
    (tmp_path / "compose").mkdir()
    state_path(stack).write_text("{not json")
    with pytest.raises(UserError, match=r"\.ornith-rolling-ornith-x2\.json is not the record of a rolling `up`: "
                                        r"check `ornith-stack status`"):
        read_state(stack)
    check = subprocess.run(["git", "check-ignore", "-q", "compose/.ornith-rolling-ornith-x2.json"], cwd=ROOT)
    assert check.returncode == 0  # git-ignored, like compose/.env


def test_status_reads_the_rotation_with_the_operator_credential_and_shows_a_replica_out(tmp_path: Path) -> None:
    from ornith_stack.commands.up import _rotation, in_rotation

    urls = [deployment.worker_url(s, 8000) for s in ("engine-0", "engine-1")]
    gateway = FakeGateway(urls[:1], [])  # engine-1 is out (a roll under way, or interrupted)
    stack = Stack("it-x2", "proj", tmp_path / "it-x2.yml", tmp_path / ".env")

    def docker(operator: str) -> Callable[..., Result]:
        def answer(argv: Sequence[str], timeout: float = 600.0, on_line: object = None) -> Result:
            config = {"services": {"gateway": {"environment": {"ORNITH_OPERATOR_KEY": operator}}}}
            return subprocess.CompletedProcess(list(argv), 0, json.dumps(config), "")
        return answer

    listed = in_rotation(docker(OPERATOR), stack, "gateway", f"http://{gateway.address}")
    assert listed == {urls[0]}
    assert [_rotation(url + "/", listed) for url in urls] == ["in", "[red]OUT[/]"]
    # No credential, or one the gateway refuses: the rotation is unknown, never shown as "in".
    for operator in ("", "another-credential"):
        unknown = in_rotation(docker(operator), stack, "gateway", f"http://{gateway.address}")
        assert unknown is None and _rotation(urls[0], unknown) == "?"
