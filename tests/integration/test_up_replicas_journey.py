"""`ornith-stack up` of a two-replica layout for real: two vLLM-CPU engines (the cpu-demo image) behind the
real Model Gateway (docker/gateway.Dockerfile, sglang-router 0.3.2), through compose, along the README's
journey: `up`, the printed curl (200 with the key, 401 without), `status` per replica and for the gateway,
`logs engine-1`, `down`; and after `up` the checkout's `git status` is as it was (the key file compose/.env
is ignored).

Run: pytest -m integration tests/integration/test_up_replicas_journey.py
The layout is an operator profile, as `ornith-stack profiles new` makes one for GPUs: cpu-demo with
`serve.replicas: 2` in a profile folder of its own (ORNITH_PROFILE_DIR), its compose file written into the
checkout's compose/ by the same function `profiles new` uses (and removed afterwards). The images are those
test_up.py and test_compose.py build (the cpu-demo and exporter images FROM the local Python base, the local
Prometheus, a stand-in Grafana); only the gateway image is new. The engines float over the cores
(VLLM_CPU_OMP_THREADS_BIND=nobind: pinned, both would take the first core, see test_gateway.py) and keep a
small context (max-model-len 1024).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from up_env import up_environment

from ornith_stack.generate.core import render
from ornith_stack.generate.profile_files import operator_files
from ornith_stack.profiles import load_profile

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PROJECT = f"up-x2-{os.getpid()}"
NAME = f"it-replicas-{os.getpid()}"
COMPOSE_FILE = REPO / "compose" / f"{NAME}.yml"
ENV_FILE = REPO / "compose" / ".env"  # where `up` keeps the key unless told otherwise: the journey's file
REPLICAS = ("engine-0", "engine-1")


def ornith(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ornith_stack.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def git_status() -> str:
    """`git status` of compose/, the folder `up` writes into (the rest of the checkout may change meanwhile)."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "compose"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


def write_profile(folder: Path) -> Path:
    """cpu-demo as two replicas, in the operator's profile folder; its compose file in the checkout."""
    data = load_profile("cpu-demo").model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    data["name"] = NAME
    data["engine"] = {"kind": data["engine"]["kind"], "version": data["engine"]["version"]}
    data["serve"]["replicas"] = 2
    data["serve"]["args"]["max-model-len"] = 1024
    data["serve"]["env"]["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    path = folder / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    os.environ["ORNITH_PROFILE_DIR"] = str(folder)  # load_profile below and the CLI read the same folder
    try:
        files = [f for f in operator_files(load_profile(NAME), path, "test_up_replicas_journey.py")
                 if f.path == f"compose/{NAME}.yml"]
        render(REPO, files)
    finally:
        del os.environ["ORNITH_PROFILE_DIR"]
    return path


def project_objects() -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    return [line for kind in (["ps", "-aq"], ["volume", "ls", "-q"], ["network", "ls", "-q"])
            for line in subprocess.run(["docker", *kind, "--filter", label], capture_output=True, text=True,
                                       check=True).stdout.split()]


@pytest.fixture(scope="module")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    folder = tmp_path_factory.mktemp("profiles")
    kept = tmp_path_factory.mktemp("kept") / ".env"
    with up_environment(f"x2-{os.getpid()}") as env:
        if ENV_FILE.exists():  # a developer's own key: set aside, put back afterwards
            shutil.move(ENV_FILE, kept)
        write_profile(folder)
        env["ORNITH_PROFILE_DIR"] = str(folder)
        try:
            yield env
        finally:
            subprocess.run(["docker", "compose", "-p", PROJECT, "-f", str(COMPOSE_FILE), "down", "--volumes",
                            "--remove-orphans"], capture_output=True, check=False, timeout=300)
            COMPOSE_FILE.unlink(missing_ok=True)
            ENV_FILE.unlink(missing_ok=True)
            if kept.exists():
                shutil.move(kept, ENV_FILE)


@pytest.fixture(scope="module")
def status_before(stack_env: dict[str, str]) -> str:
    """The checkout's status once the test's compose file is written, before `up`."""
    return git_status()


@pytest.fixture(scope="module")
def first_up(stack_env: dict[str, str], status_before: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = ornith(stack_env, "up", NAME, "--project", PROJECT, "--start-timeout", "1500", timeout=3000)
    print(f"`up` of two replicas took {time.monotonic() - started:.0f} s")
    print(result.stderr[-3000:])
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def http_code(script: str, env: dict[str, str]) -> str:
    env = {k: v for k, v in env.items() if k != "ORNITH_API_KEY"}
    return subprocess.run(["bash", "-c", script + " -o /dev/null -w '%{http_code}'"], env=env, capture_output=True,
                          text=True, timeout=300, check=True, cwd=REPO).stdout


def test_the_printed_curl_reaches_the_gateway_200_with_the_key_and_401_without(
        first_up: subprocess.CompletedProcess[str], stack_env: dict[str, str]) -> None:
    lines = first_up.stdout.split("\ncurl:\n", 1)[1].splitlines()
    export, curl = lines[0], lines[1]
    assert f"http://127.0.0.1:{stack_env['ORNITH_ENGINE_PORT']}/v1/chat/completions" in curl
    assert http_code(f"{export}\n{curl}", stack_env) == "200"
    assert http_code(curl, stack_env) == "401"


def test_up_leaves_git_status_as_it_was(first_up: subprocess.CompletedProcess[str], status_before: str) -> None:
    assert ENV_FILE.stat().st_mode & 0o777 == 0o600 and "ORNITH_API_KEY=" in ENV_FILE.read_text()
    assert git_status() == status_before == f"?? compose/{NAME}.yml\n"  # the test's own file only


def test_status_shows_each_replica_and_the_gateway(first_up: subprocess.CompletedProcess[str],
                                                   stack_env: dict[str, str]) -> None:
    result = ornith(stack_env, "status", "--project", PROJECT, "--interval", "1", timeout=300)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^API http://127\.0\.0\.1:\d+/v1 \(gateway in front of engine-0, engine-1\): requires the API "
                     r"key$", result.stdout, re.MULTILINE), result.stdout
    # Keyed (its launcher reads ORNITH_API_KEY from its environment), the gateway's control plane refuses
    # callers without the key; `up` proved it too. Unkeyed, status says it is open.
    gateway = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["gateway"]
    keyed = "ORNITH_API_KEY" in (gateway.get("environment") or {})
    workers = "requires the API key" if keyed else "UNAUTHENTICATED"
    assert re.search(rf"^gateway /workers \(adds and removes replicas\): {workers}", result.stdout, re.MULTILINE)
    for replica in REPLICAS:
        row = next(line for line in result.stdout.splitlines() if f"//{replica}:" in line)
        cells = [cell.strip() for cell in row.strip().strip("│|").split("│")]
        assert cells[1] == "up" and cells[4] == "0" and cells[5] == "0", row  # health, running, waiting
    assert re.search(r"gateway \(Model Gateway, /readiness\)\s*│\s*up", result.stdout), result.stdout


def test_logs_take_a_replica_name(first_up: subprocess.CompletedProcess[str], stack_env: dict[str, str]) -> None:
    result = ornith(stack_env, "logs", "engine-1", "--project", PROJECT, "--tail", "all", timeout=120)
    assert result.returncode == 0, result.stderr
    # Compose starts each line with its service's container name (after a terminal erase-line sequence).
    assert re.search(r"^(\x1b\[2K)?engine-1-1\s+\|.*Application startup complete", result.stdout, re.MULTILINE)
    assert "engine-0-1 " not in result.stdout
    wrong = ornith(stack_env, "logs", "engine-7", "--project", PROJECT, timeout=120)
    assert wrong.returncode == 2 and "error: no service 'engine-7' in this stack" in wrong.stderr + wrong.stdout


def test_down_removes_the_whole_project(first_up: subprocess.CompletedProcess[str], stack_env: dict[str, str]) -> None:
    assert project_objects() != []
    result = ornith(stack_env, "down", "--project", PROJECT, "--volumes", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert project_objects() == []
