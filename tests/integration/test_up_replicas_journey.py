"""`ornith-stack up` of a two-replica layout for real: two vLLM-CPU engines (the cpu-demo image) behind the
real Model Gateway (docker/gateway.Dockerfile, sglang-router 0.3.2), through compose, along the README's
journey: `up`, the printed curl (200 with the key, 401 without), `status` per replica and for the gateway,
`logs engine-1`, a flag change rolled through the replicas by `up` under `ornith-stack load` with 0 failed requests
(issue 43: each replica out of the gateway's rotation, drained, recreated, proved and put back, one after the
other; the gateway not restarted; the roll interrupted by Ctrl-C once engine-1 is recreated, `status` showing it out of
rotation, and the next `up` putting it back), `down`; and after `up` the checkout's `git status` is as it was (the key file
compose/.env is ignored). The change is one engine flag (max-num-seqs, which the gateway's argv does not carry for
vLLM): one more boot per replica, on the stack the journey started.

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

import calendar
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
import yaml
from up_env import ENV_FILE, REPO, ornith, replica_stack, write_replica_profile

from ornith_stack import deployment
from ornith_stack.stack.compose import Stack
from ornith_stack.stack.envfile import read_env
from ornith_stack.stack.rolling import read_state

pytestmark = pytest.mark.integration

PROJECT = f"up-x2-{os.getpid()}"
NAME = f"it-replicas-{os.getpid()}"
COMPOSE_FILE = REPO / "compose" / f"{NAME}.yml"
REPLICAS = ("engine-0", "engine-1")
MODEL = "ornith"  # cpu-demo's served name (in front of vLLM the gateway's /v1/models lists "unknown")
# The rolling `up`'s load: steady streams through the gateway, a bound in count, stopped AFTER_S after the change.
RATE, MAX_TOKENS, CONCURRENCY, REQUESTS_BOUND, AFTER_S = 1.0, 16, 4, 3000, 20.0
BEFORE_S = 10.0  # the load runs this long before the change


def git_status() -> str:
    """`git status` of compose/, the folder `up` writes into (the rest of the checkout may change meanwhile)."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", "compose"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


def project_objects() -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    return [line for kind in (["ps", "-aq"], ["volume", "ls", "-q"], ["network", "ls", "-q"])
            for line in subprocess.run(["docker", *kind, "--filter", label], capture_output=True, text=True,
                                       check=True).stdout.split()]


@pytest.fixture(scope="module")
def stack_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with replica_stack(NAME, PROJECT, "test_up_replicas_journey.py", tmp_path_factory.mktemp("profiles"),
                       tmp_path_factory.mktemp("kept") / ".env") as env:
        yield env


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
        assert cells[7] == "in", row  # in the gateway's rotation (its worker list, the operator's credential)
    assert re.search(r"gateway \(Model Gateway, /readiness\)\s*│\s*up", result.stdout), result.stdout


def test_logs_take_a_replica_name(first_up: subprocess.CompletedProcess[str], stack_env: dict[str, str]) -> None:
    result = ornith(stack_env, "logs", "engine-1", "--project", PROJECT, "--tail", "all", timeout=120)
    assert result.returncode == 0, result.stderr
    # Compose starts each line with its service's container name (after a terminal erase-line sequence).
    assert re.search(r"^(\x1b\[2K)?engine-1-1\s+\|.*Application startup complete", result.stdout, re.MULTILINE)
    assert "engine-0-1 " not in result.stdout
    wrong = ornith(stack_env, "logs", "engine-7", "--project", PROJECT, timeout=120)
    assert wrong.returncode == 2 and "error: no service 'engine-7' in this stack" in wrong.stderr + wrong.stdout


def project_containers() -> dict[str, dict[str, Any]]:
    """`docker inspect` of the project's running containers, by service."""
    ids = subprocess.run(["docker", "ps", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"],
                         capture_output=True, text=True, check=True).stdout.split()
    found = json.loads(subprocess.run(["docker", "inspect", *ids], capture_output=True, text=True, check=True).stdout)
    return {c["Config"]["Labels"]["com.docker.compose.service"]: c for c in found}


def docker_time(value: str) -> float:
    """Docker's RFC 3339 time in UTC (nanoseconds) as seconds since the epoch."""
    whole, _, fraction = value.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{fraction or '0'}")


def start_load(env: dict[str, str], gateway: str, key: str, requests: int, out: Path) -> subprocess.Popen[str]:
    """`ornith-stack load` through the gateway; returns once it streams (its SIGUSR1 handler is in place)."""
    load = subprocess.Popen(
        [sys.executable, "-m", "ornith_stack.cli", "load", "--url", gateway, "--model", MODEL, "--requests",
         str(requests), "--rate", str(RATE), "--max-concurrency", str(CONCURRENCY), "--max-tokens", str(MAX_TOKENS),
         "--timeout", "300", "--after", str(AFTER_S), "--json", str(out)],
        cwd=REPO, env={**env, "ORNITH_API_KEY": key}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert load.stdout is not None
    header = load.stdout.readline()
    assert header, load.communicate(timeout=60)
    print(header.strip())
    return load


def ctrl_c_reaches_it() -> None:
    """SIGINT's default action in the child, as in a terminal: a shell's background job (a CI runner's may be one)
    starts with SIGINT ignored, the ignoring is inherited, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def up_interrupted(env: dict[str, str], marker: str, out: Path) -> tuple[int, str]:
    """`up` until a progress note contains `marker`, then Ctrl-C (SIGINT to `up` alone, as a terminal's would
    reach it); its exit status and what it wrote to stderr."""
    seen, lines = threading.Event(), []

    def read(stream: IO[str]) -> None:
        for line in stream:
            lines.append(line)
            if marker in line:
                seen.set()

    with (out / "up-stdout.txt").open("w") as stdout:
        up = subprocess.Popen([sys.executable, "-m", "ornith_stack.cli", "up", NAME, "--project", PROJECT,
                               "--start-timeout", "1500"], cwd=REPO, env=env, stdout=stdout,
                              stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_reaches_it)  # fmt: skip
        assert up.stderr is not None
        reader = threading.Thread(target=read, args=(up.stderr,), daemon=True)
        reader.start()
        try:
            reached = seen.wait(timeout=1500)
            up.send_signal(signal.SIGINT)
            rc = up.wait(timeout=300)
        finally:
            if up.poll() is None:
                up.kill()
                up.wait(timeout=60)
        reader.join(timeout=60)
    text = "".join(lines)
    assert reached, f"`up` never wrote {marker!r}:\n{text[-4000:]}"
    return rc, text


def test_a_flag_change_rolls_the_replicas_under_load_and_an_interrupted_roll_resumes_with_no_failed_request(
        first_up: subprocess.CompletedProcess[str], stack_env: dict[str, str], tmp_path: Path) -> None:
    before = project_containers()
    secrets = read_env(ENV_FILE)
    gateway = f"http://127.0.0.1:{stack_env['ORNITH_ENGINE_PORT']}"
    wide = {**stack_env, "COLUMNS": "400"}  # a wide console: each progress note on one line
    stack = Stack(NAME, PROJECT, COMPOSE_FILE, ENV_FILE)

    # The change: one engine flag, in the profile and so in the compose file.
    write_replica_profile(Path(stack_env["ORNITH_PROFILE_DIR"]), NAME, "test_up_replicas_journey.py",
                          {"max-num-seqs": 8})
    # A bound only: the load stops sending AFTER_S after the change window ends.
    load = start_load(stack_env, gateway, secrets["ORNITH_API_KEY"], REQUESTS_BOUND, tmp_path / "load.json")
    time.sleep(BEFORE_S)
    load.send_signal(signal.SIGUSR1)  # the change window begins
    began = time.monotonic()
    # The operator presses Ctrl-C once engine-1 is recreated, while `up` waits for it to be healthy: engine-1
    # stays out of rotation, recorded, and `status` says so; the next `up` puts it back and rolls nothing again.
    code, interrupted = up_interrupted(wide, "engine-1: recreated", tmp_path)
    left_out = read_state(stack).out
    shown_out = ornith(stack_env, "status", "--project", PROJECT, "--interval", "1", timeout=300).stdout
    rolled = ornith(wide, "up", NAME, "--project", PROJECT, "--start-timeout", "1500", timeout=3000)
    roll_s = time.monotonic() - began
    load.send_signal(signal.SIGUSR1)  # ... and ends
    out, err = load.communicate(timeout=AFTER_S + 600)
    print(interrupted[-6000:])
    print(rolled.stderr[-6000:])
    print(out)
    assert code == 130 and "engine-1: interrupted: out of rotation until `ornith-stack up` runs again" in \
        " ".join(interrupted.split()), interrupted[-4000:]
    assert left_out == ["engine-1"], left_out
    assert re.search(r"out of the gateway's rotation: \S*engine-1\b", shown_out), shown_out
    assert rolled.returncode == 0, rolled.stdout[-2000:] + rolled.stderr[-4000:]
    resumed = " ".join(rolled.stderr.split())
    assert "engine-1: recorded out of rotation by an interrupted `up`" in resumed, resumed
    assert "engine-0: out of rotation" not in resumed, resumed  # rolled once, not again
    report = json.loads((tmp_path / "load.json").read_text())
    total, phases = report["total"], report["phases"]
    notes = " ".join(interrupted.split()) + " " + resumed
    per_replica = {r: (re.search(rf"{r}: drained in ([0-9.]+) s \((\d+) in flight", notes),
                       re.search(rf"{r}: healthy after (\d+) s", notes)) for r in REPLICAS}
    print(f"`up` with the change: {roll_s:.0f} s; requests sent {total['sent']}, completed {total['completed']}, "
          f"failed {total['failed_before_first_token'] + total['failed_streaming']}; " + "; ".join(
              f"{r}: drained in {d[1]} s ({d[2]} in flight), healthy after {h[1]} s"
              for r, (d, h) in per_replica.items() if d and h))

    # Not a request failed, before, during or after the change, and the load covered all of it.
    assert total["sent"] == total["completed"] and 0 < total["sent"] < REQUESTS_BOUND, out + err
    assert phases["during"]["sent"] > 0 and phases["after"]["sent"] > 0, out
    assert "engine-0: back in rotation" in " ".join(interrupted.split()), notes  # engine-0 rolled before the Ctrl-C
    # One replica after the other: engine-1 left the rotation only once engine-0 was back in it, ...
    order = [notes.index(f"{r}: {what}") for r in REPLICAS for what in ("out of rotation", "back in rotation")]
    assert order == sorted(order), notes
    assert all(d and h for d, h in per_replica.values()), notes
    after = project_containers()
    for replica in REPLICAS:
        assert after[replica]["Id"] != before[replica]["Id"], replica  # recreated
        assert "--max-num-seqs" in after[replica]["Config"]["Cmd"], after[replica]["Config"]["Cmd"]  # the change
    # ... and Docker agrees: engine-1's new container was created once engine-0's had started and become healthy.
    created = {r: docker_time(after[r]["Created"]) for r in REPLICAS}
    healthy_0 = float(per_replica["engine-0"][1][1])  # type: ignore[index]
    assert created["engine-1"] - created["engine-0"] >= healthy_0 - 1, created
    assert after["gateway"]["Id"] == before["gateway"]["Id"]  # the gateway was not restarted
    # Both in rotation afterwards, and nothing recorded out.
    listed = httpx.get(f"{gateway}{deployment.GATEWAY_WORKERS_PATH}", timeout=30,
                       headers={"Authorization": f"Bearer {secrets['ORNITH_OPERATOR_KEY']}"}).json()["workers"]
    assert sorted(w["url"] for w in listed) == [deployment.worker_url(r, 8000) for r in REPLICAS]
    assert read_state(stack).out == []
    shown = ornith(stack_env, "status", "--project", PROJECT, "--interval", "1", timeout=300).stdout
    assert "out of the gateway's rotation" not in shown and "rotation unknown" not in shown, shown


def test_down_removes_the_whole_project(first_up: subprocess.CompletedProcess[str], stack_env: dict[str, str]) -> None:
    assert project_objects() != []
    result = ornith(stack_env, "down", "--project", PROJECT, "--volumes", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert project_objects() == []
