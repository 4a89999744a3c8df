"""The Model Gateway keyed from $ORNITH_API_KEY: the real sglang-router 0.3.2 (`smg`) on loopback, started the
way its image starts it (the launcher file, compose's argv), with no engine behind it.

Without a key smg 0.3.2 let anyone add a worker of theirs and remove the real ones (`POST /workers` → 202),
after which clients' requests, bearer key included, went to that worker. With the key every worker route
and the chat route answer 401 to a request without it; the key is in no argv and no log line.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from ornith_stack import deployment

pytest.importorskip("sglang_router", reason="pip install 'sglang-router==0.3.2' (the dev extra)")

LAUNCHER = Path(__file__).resolve().parents[2] / "src" / "ornith_stack" / "gateway_launch.py"
KEY = "gw-k3y-0123456789abcdef"
CHAT = {"model": "any", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(tmp_path: Path, *extra: str, key: str = KEY) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = _free_port()
    argv = [sys.executable, str(LAUNCHER), *deployment.gateway_args(
        [], port, host="127.0.0.1", metrics_host="127.0.0.1", metrics_port=_free_port()), *extra]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ORNITH_")}, "ORNITH_API_KEY": key}
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


def test_with_the_key_a_worker_is_accepted_and_the_key_is_in_no_argv_or_log(
    gateway: tuple[subprocess.Popen[bytes], str, Path],
) -> None:
    proc, url, log = gateway
    auth = {"Authorization": f"Bearer {KEY}"}
    added = httpx.post(f"{url}/workers", json={"url": "http://127.0.0.1:9"}, headers=auth, timeout=10)
    assert added.status_code == 202, added.text
    assert httpx.get(f"{url}/workers", headers=auth, timeout=10).status_code == 200
    # No worker is healthy, so the chat cannot be served; but it passed the key check.
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=auth, timeout=30).status_code != 401
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    assert cmdline and KEY.encode() not in cmdline  # smg renames its process (setproctitle)
    assert KEY not in log.read_text()


def test_the_launcher_refuses_the_key_as_a_flag(tmp_path: Path) -> None:
    proc, _, log = _start(tmp_path, "--api-key", "visible-in-ps")
    assert proc.wait(timeout=60) == 2
    text = log.read_text()
    assert text.startswith("error: pass the gateway's key in $ORNITH_API_KEY") and "visible-in-ps" not in text


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
        assert "--api-key" not in gateway["command"], path.name
