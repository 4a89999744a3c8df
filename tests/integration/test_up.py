"""`ornith-stack up cpu-demo` for real: the user's whole path on this machine (Docker, Compose v2, the
local base images of scripts/make-base-images.sh), then `status`, a second `up`, `down --volumes`.

Run: pytest -m integration tests/integration/test_up.py
The images come from the same places as tests/integration/test_compose.py: the exporter and cpu-demo
Dockerfiles build FROM the local Python base (ORNITH_PYTHON_BASE_IMAGE), Prometheus and Alertmanager are
Debian's (ORNITH_PROMETHEUS_IMAGE, ORNITH_ALERTMANAGER_IMAGE) and Grafana is a stand-in page (it cannot
be pulled here). `up` builds the cpu-demo image when it is missing or carries other labels than its own
(after test_compose built it, only the label layer is new); the engine then starts in about 1.5-3 minutes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from up_env import up_environment

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROJECT = f"up-it-{os.getpid()}"
PROMPT = "one two three four five one two three four five one two three four five one two three"


def cli(env: dict[str, str], *args: str, timeout: float = 2400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ornith_stack.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def project_objects() -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    found = []
    for kind in (["ps", "-aq"], ["volume", "ls", "-q"], ["network", "ls", "-q"]):
        found += subprocess.run(["docker", *kind, "--filter", label], capture_output=True, text=True,
                                check=True).stdout.split()
    return found


@pytest.fixture(scope="module")
def up_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with up_environment(f"up-{os.getpid()}") as env:
        env["ORNITH_TEST_ENV_FILE"] = str(tmp_path_factory.mktemp("up") / "compose.env")
        yield env
        subprocess.run(["docker", "compose", "-p", PROJECT, "down", "--volumes", "--remove-orphans"],
                       capture_output=True, check=False, timeout=300)


@pytest.fixture(scope="module")
def first_up(up_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # Under load here the engine took 9.5 minutes to answer /health (its compile); the default allows 10.
    result = cli(up_env, "up", "cpu-demo", "--project", PROJECT, "--env-file", up_env["ORNITH_TEST_ENV_FILE"],
                 "--start-timeout", "1500")
    print(result.stderr[-3000:])
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def printed_curl(output: str) -> tuple[str, str]:
    """The `export ...` line and the `curl ...` line that `up` printed under "curl:"."""
    lines = output.split("\ncurl:\n", 1)[1].splitlines()
    return lines[0], lines[1]


def http_code(script: str, env: dict[str, str]) -> str:
    env = {k: v for k, v in env.items() if k != "ORNITH_API_KEY"}
    return subprocess.run(["bash", "-c", script + " -o /dev/null -w '%{http_code}'"], env=env, capture_output=True,
                          text=True, timeout=300, check=True).stdout


def test_printed_curl_answers_200_with_the_key_and_401_without(first_up: subprocess.CompletedProcess[str],
                                                               up_env: dict[str, str]) -> None:
    assert "changed: built" in first_up.stdout or "changed: started" in first_up.stdout
    export, curl = printed_curl(first_up.stdout)
    assert export.startswith("export $(grep ^ORNITH_API_KEY=") and "$ORNITH_API_KEY" in curl
    assert http_code(f"{export}\n{curl}", up_env) == "200"
    assert http_code(curl, up_env) == "401"
    env_file = Path(up_env["ORNITH_TEST_ENV_FILE"])
    assert env_file.stat().st_mode & 0o777 == 0o600
    for name in ("Grafana", "Prometheus", "Alertmanager"):
        assert re.search(rf"^{name}: http://127\.0\.0\.1:\d+$", first_up.stdout, re.MULTILINE), name


def _api_key(up_env: dict[str, str]) -> str:
    text = Path(up_env["ORNITH_TEST_ENV_FILE"]).read_text()
    match = re.search(r"^ORNITH_API_KEY=(\S+)$", text, re.MULTILINE)
    assert match
    return match[1]


def test_the_key_reaches_no_process_list_and_no_log(first_up: subprocess.CompletedProcess[str],
                                                    up_env: dict[str, str]) -> None:
    key = _api_key(up_env)
    assert key not in first_up.stdout + first_up.stderr
    listing = subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True, check=True).stdout
    assert "vllm.entrypoints.openai.api_server" in listing and key not in listing
    logs = subprocess.run(["docker", "compose", "-p", PROJECT, "logs", "--no-color"], capture_output=True, text=True,
                          check=True)
    assert "Application startup complete" in logs.stdout and key not in logs.stdout + logs.stderr


def test_status_shows_acceptance_and_decode_speed(first_up: subprocess.CompletedProcess[str],
                                                  up_env: dict[str, str]) -> None:
    engine = f"http://127.0.0.1:{up_env['ORNITH_ENGINE_PORT']}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {_api_key(up_env)}"}
    body = {"model": "ornith", "max_tokens": 300, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": PROMPT}]}
    httpx.post(engine, json=body, headers=headers, timeout=300).raise_for_status()
    # Traffic until status has read the exporter twice, so decode tokens move between its reads (the tiny
    # model decodes about 300 tokens/s here: one request would be over before the first read).
    done = threading.Event()

    def traffic() -> None:
        while not done.is_set():
            httpx.post(engine, json=body, headers=headers, timeout=300)

    sender = threading.Thread(target=traffic)
    sender.start()
    try:
        result = cli(up_env, "status", "--project", PROJECT, "--interval", "4", timeout=120)
    finally:
        done.set()
        sender.join()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "requires the API key" in result.stdout
    row = next(line for line in result.stdout.splitlines() if "vllm" in line and "up" in line)
    # The table's cells: engine (its name carries the version, e.g. 0.32.0), health, acceptance, decode tok/s.
    cells = [cell.strip() for cell in row.strip().strip("│|").split("│")]
    acceptance, decode = float(cells[2]), float(cells[3])
    assert 1.0 <= acceptance <= 5.0, row  # 1 + accepted/steps, 4 drafted tokens at most
    assert decode > 0, row


def test_second_up_has_nothing_to_change(first_up: subprocess.CompletedProcess[str], up_env: dict[str, str]) -> None:
    result = cli(up_env, "up", "cpu-demo", "--project", PROJECT, "--env-file", up_env["ORNITH_TEST_ENV_FILE"],
                 "--start-timeout", "1500", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "nothing to change" in result.stdout and "changed:" not in result.stdout


def test_down_with_volumes_leaves_nothing_of_the_project(first_up: subprocess.CompletedProcess[str],
                                                         up_env: dict[str, str]) -> None:
    assert project_objects() != []
    result = cli(up_env, "down", "--project", PROJECT, "--volumes", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert project_objects() == []
