"""`up`, `status`, `logs` and `down` for both layouts: one engine, or replicas behind the Model Gateway.

The layout's service names are checked against the compose file the template renders for a two-replica
cpu-demo (one fact: deployment's names); the gateway probes run against the real sglang-router 0.3.2 on
loopback, keyed and open (measured first by hand: keyed, POST /workers and a chat without the key answer
401; open, an empty POST /workers answers 422 and adds nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from docker_replay import Replay, recorded
from ports import free_port

from ornith_stack import deployment
from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError
from ornith_stack.generate.profile_files import render_profile
from ornith_stack.profiles import from_data, load_profile
from ornith_stack.profiles.model import Profile
from ornith_stack.stack.bringup import prove_roles, refuse_workers, wait_healthy
from ornith_stack.stack.compose import (
    Stack,
    compose_json,
    gateway_keyed,
    layout_for,
    log_services,
    pick_stack,
    published,
    service_environment,
    stack_services,
)
from ornith_stack.stack.shell import Result
from ornith_stack.stack.status import chat_body, endpoint_access, post_without_key, refuses


def replica_profile(replicas: int = 2) -> Profile:
    data = load_profile("cpu-demo").model_dump(mode="json", exclude_none=True)
    data["name"] = "cpu-demo-x2"
    data["serve"]["replicas"] = replicas
    return from_data(data, Path("cpu-demo-x2.yaml"))


def compose_services(profile: Profile) -> dict[str, dict[str, object]]:
    return dict(yaml.safe_load(render_profile(profile, "compose.yml.j2", "compose"))["services"])


def test_one_engine_publishes_the_api_itself() -> None:
    profile = load_profile("cpu-demo")
    layout = layout_for(profile)
    assert (layout.engines, layout.gateway, layout.endpoint) == (("engine",), None, "engine")
    assert layout.health_path == "/health"
    assert "ports" in compose_services(profile)["engine"]


def test_replicas_publish_the_api_through_the_gateway_the_compose_file_names() -> None:
    profile = replica_profile()
    layout = layout_for(profile)
    services = compose_services(profile)
    assert layout.engines == ("engine-0", "engine-1") and layout.endpoint == "gateway"
    assert layout.health_path == deployment.GATEWAY_HEALTH_PATH
    api = f":{profile.serve.port}"
    publishing = sorted(name for name, s in services.items() if any(str(p).endswith(api) for p in s.get("ports", [])))
    assert publishing == [layout.endpoint]
    assert {name for name in services if name.startswith("engine")} == set(layout.engines)
    # On CPU the replicas share the cores: no GPU reservation, no device ids.
    assert all("deploy" not in services[name] for name in layout.engines)


def test_logs_engine_means_every_replica_and_an_unknown_name_lists_the_services() -> None:
    known = ["alertmanager", "engine-0", "engine-1", "exporter", "gateway"]
    layout = layout_for(replica_profile())
    assert log_services(known, layout, "engine") == ["engine-0", "engine-1"]
    assert log_services(known, layout, "engine-1") == ["engine-1"]
    assert log_services(known, layout, None) == []
    with pytest.raises(UserError, match=r"no service 'engine-7' in this stack; its services: alertmanager, engine-0"):
        log_services(known, layout, "engine-7")
    # Without the compose file nothing is known: compose itself answers for the name.
    assert log_services([], layout, "engine-7") == ["engine-7"]
    assert log_services(["engine", "exporter"], layout_for(load_profile("cpu-demo")), "engine") == ["engine"]


@contextmanager
def gateway(*args: str) -> Iterator[str]:
    """The real Model Gateway with no workers on loopback ports; its base URL."""
    pytest.importorskip("sglang_router", reason="pip install 'sglang-router==0.3.2' (the dev extra)")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", *args, "--host", "127.0.0.1",
                             "--port", str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port",
                             str(free_port())], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"the gateway exited with {proc.returncode}"
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the gateway did not answer /health in 60 s"
                time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_keyed_gateway_refuses_workers_and_chat_without_the_key() -> None:
    with gateway("--api-key", "k-for-the-test") as base:
        refuse_workers(base)  # no error: 401
        assert refuses(post_without_key(base + "/v1/chat/completions", chat_body("ornith", "ping", 1))) is True
        # What `status` prints from: both refused; not ready, as no replica serves behind it.
        seen = endpoint_access(base, layout_for(replica_profile()), "/v1/chat/completions", "ornith")
        assert (seen.api, seen.workers, seen.gateway_ready) == (True, True, False)
        added = httpx.post(base + deployment.GATEWAY_WORKERS_PATH, json={},
                           headers={"Authorization": "Bearer k-for-the-test"}, timeout=10)
        assert added.status_code != 401  # the key opens it: the probe tells keyed from broken


def test_ups_role_proof_fails_where_the_users_key_is_the_gateways_admin_key() -> None:
    """smg keyed with --api-key alone (as the stack ran before issue 42): the users' key lists the workers."""
    profile = replica_profile()
    with gateway("--api-key", "k-for-the-test") as base:
        with pytest.raises(UserError, match=r"^GET http://127\.0\.0\.1:\d+/workers answered HTTP 200 to the users' "
                                            r"key \(expected 401 or 403\): ORNITH_API_KEY can steer the gateway"):
            prove_roles(base, adapter_for(profile), layout_for(profile), "k-for-the-test", "op-for-the-test")


def test_an_open_gateway_is_named_and_the_probe_adds_no_worker() -> None:
    with gateway() as base:
        with pytest.raises(UserError, match=r"/workers answered HTTP 422 without the API key \(expected 401\): "
                                            r"anyone who reaches the gateway can add or remove its workers"):
            refuse_workers(base)
        assert endpoint_access(base, layout_for(replica_profile()), "/v1/chat/completions", "ornith").workers is False
        assert httpx.get(base + deployment.GATEWAY_WORKERS_PATH, timeout=10).json()["total"] == 0


def test_nothing_listening_is_not_answering() -> None:
    assert refuses(post_without_key(f"http://127.0.0.1:{free_port()}/v1/chat/completions", {})) is None


CONFIG = ("docker", "compose", "-p", "up-x2-5305")


def recorded_stack() -> Stack:
    """The stack the recordings in tests/fixtures/docker/replicas/ came from (its compose file elsewhere)."""
    return Stack("it-replicas-5305", "up-x2-5305", Path("/nonexistent/compose/it-replicas-5305.yml"), None)


def test_the_services_and_environment_compose_resolved_for_two_replicas(tmp_path: Path) -> None:
    replay = Replay({CONFIG: recorded("replicas/compose-config")})
    stack = recorded_stack()
    layout = layout_for(replica_profile())
    # Without its compose file nothing is known (compose answers for a name itself); with it, its services.
    assert stack_services(replay, stack) == []
    present = Stack(stack.profile, stack.project, tmp_path / "x2.yml", None)
    present.compose_file.write_text("services: {}\n")
    assert stack_services(replay, present) == ["alertmanager", "alertmanager-config", "engine-0", "engine-1",
                                               "exporter", "gateway", "grafana", "prometheus"]
    assert service_environment(replay, stack, "engine-1")["ORNITH_API_KEY"] == "recorded-placeholder-key"
    # Today's template gives the gateway no key: its /workers routes are not expected to refuse.
    assert service_environment(replay, stack, "gateway") == {} and not gateway_keyed(replay, stack, layout)


def test_a_gateway_with_the_key_in_its_environment_is_keyed() -> None:
    config = json.loads(recorded("replicas/compose-config").stdout)
    config["services"]["gateway"]["environment"] = {"ORNITH_API_KEY": "recorded-placeholder-key"}
    keyed = subprocess.CompletedProcess([], 0, json.dumps(config), "")
    assert gateway_keyed(Replay({CONFIG: keyed}), recorded_stack(), layout_for(replica_profile()))
    config["services"]["gateway"]["environment"] = {"ORNITH_API_KEY": None}  # `--no-api-key`: set, empty
    empty = subprocess.CompletedProcess([], 0, json.dumps(config), "")
    assert not gateway_keyed(Replay({CONFIG: empty}), recorded_stack(), layout_for(replica_profile()))


class Recorded:
    """The Docker CLI as it answered about the running two-replica stack at one moment (`inspect`: the
    recording of `docker inspect`, a replica's State replaced where a test says so): `compose ps`,
    `docker inspect` and the replicas' logs."""

    def __init__(self, inspect: str, states: dict[str, dict[str, object]] | None = None) -> None:
        self.inspect = json.loads(recorded(f"replicas/{inspect}").stdout)
        self.logs = "engine-logs-" + inspect.partition("-")[2]
        for container in self.inspect:
            service = container["Config"]["Labels"]["com.docker.compose.service"]
            container["State"].update((states or {}).get(service, {}))

    def __call__(self, argv: Sequence[str], timeout: float = 600.0, on_line: object = None) -> Result:
        if argv[:2] == ["docker", "inspect"]:
            return subprocess.CompletedProcess(argv, 0, json.dumps(self.inspect), "")
        if "ps" in argv:
            return recorded("replicas/compose-ps-quiet")
        if "logs" in argv:
            return recorded(f"replicas/{self.logs}")
        raise AssertionError(f"no recording for {argv}")


class Notes:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def step(self, title: str) -> None:
        self.seen.append(title)

    def note(self, text: str) -> None:
        self.seen.append(text)


@contextmanager
def endpoint(status: int) -> Iterator[str]:
    """A real HTTP server on loopback answering every GET with `status` (the gateway's /readiness)."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def wait(run: Recorded, base: str, timeout_s: float = 0.0) -> Notes:
    notes = Notes()
    profile = replica_profile()
    wait_healthy(run, recorded_stack(), layout_for(profile), adapter_for(profile), base, timeout_s, notes)
    return notes


def test_up_waits_for_every_replica_and_the_gateway_and_shows_the_start_phases() -> None:
    with endpoint(200) as base:
        notes = wait(Recorded("inspect-healthy"), base)
    # vLLM on CPU captures no CUDA graphs; every other phase is in the replicas' recorded logs, in order.
    assert notes.seen == ["weights loaded", "KV pool sized", "API up"]


def test_replicas_not_healthy_yet_keep_up_waiting_though_the_endpoint_answers() -> None:
    # Recorded 7 minutes after `up -d` on two loaded cores: both replicas past their start period, loading.
    with endpoint(200) as base, pytest.raises(UserError, match=r"^engine-0, engine-1 did not become healthy within "
                                                               r"0 s; the last lines: "):
        wait(Recorded("inspect-starting"), base)


def test_a_replica_that_exited_is_named_with_its_last_lines() -> None:
    with endpoint(503) as base, pytest.raises(UserError, match=r"^replica engine-1 stopped \(exit 137\); its last "
                                                               r"lines: "):
        wait(Recorded("inspect-starting", {"engine-1": {"Status": "exited", "ExitCode": 137, "Running": False}}),
             base, timeout_s=60)


def test_the_replicas_publish_no_port_and_the_gateway_publishes_the_api() -> None:
    """Why `up` of a replica profile failed with "publishes no port": it asked for the engine's."""
    stack = recorded_stack()
    replay = Replay({(*CONFIG, "port", "gateway"): recorded("replicas/compose-port-gateway"),
                     (*CONFIG, "port", "engine-0"): recorded("replicas/compose-port-engine-0")})
    layout = layout_for(replica_profile())
    assert published(replay, stack, layout.endpoint, 8000) == "127.0.0.1:53605"
    assert published(replay, stack, layout.engines[0], 8000) is None


def test_compose_ps_json_in_either_shape_lists_every_container() -> None:
    """Compose 2.21+ writes one object per line (this recording, 2.26.1); older ones one JSON array."""
    lines = recorded("replicas/compose-ps")
    array = subprocess.CompletedProcess([], 0, "[" + ",".join(lines.stdout.split()) + "]", "")
    stack = recorded_stack()
    for answer in (lines, array):
        found = compose_json(Replay({CONFIG: answer}), stack, "ps", "--all", "--format", "json")
        assert sorted(c["Service"] for c in found) == ["alertmanager", "alertmanager-config", "engine-0", "engine-1",
                                                        "exporter", "gateway", "grafana", "prometheus"]


def test_a_replica_stack_is_found_among_projects_of_other_checkouts(tmp_path: Path) -> None:
    """`compose ls` as recorded: this project and another engineer's cpu-demo, each from its own checkout."""
    listing = recorded("replicas/compose-ls").stdout
    for checkout in ("/work/wt/replicas", "/work/wt/house"):
        moved = tmp_path / Path(checkout).name
        (moved / "compose").mkdir(parents=True)
        (moved / "compose" / ".env.example").write_text("")
        listing = listing.replace(checkout, str(moved))
    replay = Replay({("docker", "compose", "ls"): subprocess.CompletedProcess([], 0, listing, "")})
    with pytest.raises(UserError, match=r"several projects run \(ornith-it-24521, up-x2-5305\): pass --project NAME"):
        pick_stack(replay, None)
    stack = pick_stack(replay, "up-x2-5305")
    assert (stack.profile, stack.compose_file) == ("it-replicas-5305", tmp_path / "replicas" / "compose" /
                                                   "it-replicas-5305.yml")
