"""The Model Gateway keyed from $ORNITH_API_KEY and $ORNITH_OPERATOR_KEY: the real sglang-router 0.3.2 (`smg`) on
loopback, started the way its image starts it (the launcher file, compose's argv), with no engine behind it.

Without a key smg 0.3.2 let anyone add a worker of theirs and remove the real ones (`POST /workers` → 202),
after which clients' requests, bearer key included, went to that worker; with the users' key as its only key,
every user could. Now the users' key opens the data plane only, the operator's credential the worker routes;
neither is in an argv or a log line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from ports import free_port

from ornith_stack import deployment
from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError
from ornith_stack.profiles import from_data, load_profile
from ornith_stack.stack.bringup import prove_roles
from ornith_stack.stack.compose import layout_for

pytest.importorskip("sglang_router", reason="pip install 'sglang-router==0.3.2' (the dev extra)")

LAUNCHER = Path(__file__).resolve().parents[2] / "src" / "ornith_stack" / "gateway_launch.py"
KEY = "gw-k3y-0123456789abcdef"
OPERATOR = "op-cr3d-fedcba9876543210"
CHAT = {"model": "any", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def _start(tmp_path: Path, *extra: str, key: str = KEY, operator: str = OPERATOR,
           host: str = "127.0.0.1") -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    argv = [sys.executable, str(LAUNCHER), *deployment.gateway_args(
        [], port, host=host, metrics_host="127.0.0.1", metrics_port=free_port()), *extra]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ORNITH_")}, "ORNITH_API_KEY": key,
           "ORNITH_OPERATOR_KEY": operator}
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    return proc, f"http://127.0.0.1:{port}", log


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    proc, url, log = _start(tmp_path_factory.mktemp("gateway"))
    try:
        deadline = time.monotonic() + 60
        while True:  # /liveness answers as soon as it serves (/readiness waits for a worker)
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/liveness", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield proc, url, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


WITHOUT_KEY = [("POST", "/workers", {"url": "http://127.0.0.1:9"}), ("DELETE", "/workers/any-id", None),
               ("GET", "/workers", None), ("GET", "/get_loads", None), ("POST", "/flush_cache", None),
               ("POST", "/v1/chat/completions", CHAT)]


@pytest.mark.parametrize(("method", "path", "body"), WITHOUT_KEY, ids=[f"{m} {p}" for m, p, _ in WITHOUT_KEY])
@pytest.mark.parametrize("auth", [None, "Bearer not-the-key"], ids=["no key", "wrong key"])
def test_without_the_key_the_gateway_answers_401(gateway: tuple[subprocess.Popen[bytes], str, Path], method: str,
                                                 path: str, body: dict | None, auth: str | None) -> None:
    _, url, _ = gateway
    headers = {"Authorization": auth} if auth else {}
    assert httpx.request(method, url + path, json=body, headers=headers, timeout=10).status_code == 401


CONTROL = [("GET", "/workers", None), ("POST", "/workers", {"url": "http://127.0.0.1:9"}),
           ("DELETE", "/workers/any-id", None), ("GET", "/get_loads", None), ("POST", "/flush_cache", None)]


@pytest.mark.parametrize(("method", "path", "body"), CONTROL, ids=[f"{m} {p}" for m, p, _ in CONTROL])
def test_the_users_key_cannot_steer_the_workers(gateway: tuple[subprocess.Popen[bytes], str, Path], method: str,
                                                path: str, body: dict | None) -> None:
    _, url, _ = gateway
    answer = httpx.request(method, url + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert answer.status_code == 401, answer.text


def test_the_operator_lists_adds_and_removes_workers_and_no_key_is_in_an_argv_or_log(
    gateway: tuple[subprocess.Popen[bytes], str, Path],
) -> None:
    proc, url, log = gateway
    user, operator = {"Authorization": f"Bearer {KEY}"}, {"Authorization": f"Bearer {OPERATOR}"}
    added = httpx.post(f"{url}/workers", json={"url": "http://127.0.0.1:9"}, headers=operator, timeout=10)
    assert added.status_code == 202, added.text
    listed = httpx.get(f"{url}/workers", headers=operator, timeout=10)
    assert listed.status_code == 200, listed.text
    assert httpx.get(f"{url}/get_loads", headers=operator, timeout=10).status_code == 200
    assert httpx.post(f"{url}/flush_cache", headers=operator, timeout=10).status_code == 200
    # No such worker (the one added never passes its health check): past the key check, smg's own 400.
    removed = httpx.delete(f"{url}/workers/any-id", headers=operator, timeout=10)
    assert removed.status_code == 400 and "worker" in removed.text.lower(), removed.text
    # No worker is healthy, so the chat cannot be served; but the users' key passed the key check.
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=user, timeout=30).status_code != 401
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    assert cmdline and KEY.encode() not in cmdline and OPERATOR.encode() not in cmdline  # smg renames (setproctitle)
    assert KEY not in log.read_text() and OPERATOR not in log.read_text()


@pytest.mark.parametrize("words", [("--api-key", "visible-in-ps"), ("--api-key=visible-in-ps",),
                                   ("--api-ke=visible-in-ps",), ("--api", "visible-in-ps"),
                                   ("--control-plane-api-keys", "o:n:admin:visible-in-ps"),
                                   ("--control-plane=o:n:admin:visible-in-ps",)],
                         ids=["--api-key K", "--api-key=K", "abbreviated =", "abbreviated", "control plane",
                              "control plane abbreviated"])
def test_the_launcher_refuses_a_key_as_a_flag(tmp_path: Path, words: tuple[str, ...]) -> None:
    proc, _, log = _start(tmp_path, *words)
    assert proc.wait(timeout=60) == 2
    text = log.read_text()
    assert text.startswith("error: pass the gateway's key in $ORNITH_") and "visible-in-ps" not in text
    assert text.count("\n") == 1


def test_ups_role_proof_passes_on_the_launched_gateway(gateway: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    _, url, _ = gateway
    data = load_profile("cpu-demo").model_dump(mode="json", exclude_none=True)
    profile = from_data({**data, "name": "cpu-demo-x2", "serve": {**data["serve"], "replicas": 2}},
                        Path("cpu-demo-x2.yaml"))
    lines = prove_roles(url, adapter_for(profile), layout_for(profile), KEY, OPERATOR)
    assert lines == ["the users' key: 401/403 on GET /workers, POST /workers, DELETE /workers/ornith-probe, "
                     "GET /get_loads, POST /flush_cache",
                     "the operator's credential: GET /workers, GET /get_loads answered"]
    with pytest.raises(UserError, match=r"GET http://127\.0\.0\.1:\d+/workers answered HTTP 401 to the operator's "
                                        r"credential: the gateway did not take ORNITH_OPERATOR_KEY"):
        prove_roles(url, adapter_for(profile), layout_for(profile), KEY, "not-the-operators")


def test_the_launcher_refuses_a_keyless_gateway_beyond_loopback(tmp_path: Path) -> None:
    proc, _, log = _start(tmp_path, key="", host="0.0.0.0")
    assert proc.wait(timeout=60) == 2
    assert log.read_text().startswith("error: no $ORNITH_API_KEY: refusing to serve the gateway on 0.0.0.0")


def test_the_launcher_refuses_the_users_key_as_the_operators(tmp_path: Path) -> None:
    proc, _, log = _start(tmp_path, operator=KEY)
    assert proc.wait(timeout=60) == 2
    text = log.read_text()
    assert text.startswith("error: $ORNITH_OPERATOR_KEY must differ from $ORNITH_API_KEY") and KEY not in text


def test_the_gateway_image_and_compose_hand_it_the_engines_key() -> None:
    """`up`'s smoke test checks the gateway's 401 on the published port: compose must give it the key."""
    repo = LAUNCHER.parents[2]
    dockerfile = (repo / "docker" / "gateway.Dockerfile").read_text()
    assert 'ENTRYPOINT ["python3", "/usr/local/bin/ornith-gateway"]' in dockerfile
    assert "COPY src/ornith_stack/gateway_launch.py /usr/local/bin/ornith-gateway" in dockerfile
    for path in sorted((repo / "tests" / "fixtures" / "computed").glob("compose-*.yml")):
        services = yaml.safe_load(path.read_text())["services"]
        gateway = services[deployment.GATEWAY_SERVICE]
        assert gateway["environment"]["ORNITH_API_KEY"] == "${ORNITH_API_KEY:-}", path.name
        assert gateway["environment"]["ORNITH_OPERATOR_KEY"] == "${ORNITH_OPERATOR_KEY:-}", path.name
        assert not any(w.startswith(("--api-key", "--control-plane")) for w in gateway["command"]), path.name
