"""One cpu-demo stack per test session, the user's two ways: `ornith-stack up cpu-demo` and the README's
`docker compose -f compose/cpu-demo.yml up --build`, then `status`, a second `up` and `down --volumes`; and the GPU
engine images built on a stand-in base. On a machine with Docker and no registry.

Run: pytest -m integration tests/integration/test_compose.py
(needs Docker, Compose v2 as `docker compose` (scripts/install-compose-v2.sh), docker-compose v1, PyPI)

- The images come from local bases (scripts/make-base-images.sh): the exporter and cpu-demo Dockerfiles build
  FROM the local Debian + Python base (ORNITH_PYTHON_BASE_IMAGE), Prometheus and Alertmanager are Debian's
  (ORNITH_PROMETHEUS_IMAGE, ORNITH_ALERTMANAGER_IMAGE). Grafana's image cannot be pulled here and Debian has no
  Grafana package: ORNITH_GRAFANA_IMAGE points at a stand-in (the Python base serving an empty page on :3000) so
  that every service starts. Nothing about Grafana itself is asserted; its settings are checked in
  tests/unit/test_docker.py.
- `ornith-stack up cpu-demo` starts the stack (it builds the images through `docker compose build`, makes the
  API key and keeps it in its env file); the engine then starts in about 1.5-3 minutes. One stack serves every
  test of this module: a second engine of the same image and profile would prove nothing more and cost its
  start (2-10 minutes on two loaded cores).
- The README's own command, read from README.md, is then run as printed, with Compose v2, in the foreground, on
  the same project with the env file's values in its environment (as a user who exported them): it builds
  (every layer from the cache) and keeps the engine `up` started. A second `up` before it has nothing to change.
  (Compose labels each image it builds with the service: the README's command builds the exporter image for
  both services that name it, `up` once, so the command makes the monitoring containers anew, not the engine.)
- docker-compose v1 still works, checked more cheaply than a second full start: v1 resolves
  compose/cpu-demo.yml to the same services, images, commands and ports as v2, and lists the containers of the
  stack v2 started (both select by compose's labels); every profile's file passes `docker-compose config` in
  tests/unit/test_docker.py, and the GPU engine stand-ins below are built from what v1 resolves.
- Inside the running containers (testinfra, docker:// backend): every process runs as a non-root user and
  the ports listen; from outside: the engine answers a chat completion, published ports are on loopback,
  and Prometheus has the exporter's target up with acceptance-length and throughput series.
- The GPU engine Dockerfiles are built against the same local Python base as a stand-in (Debian with
  Python, no engine, no GPU), after the stack is down: inside them the entrypoint's argv (ORNITH_DRY_RUN=1) must
  be the compose command plus $ORNITH_EXTRA_ARGS, and without a GPU the doctor must refuse with its reason.

Measured on the 2-core machine with a cold Docker: the stack is up about 9 minutes after `up` (the cpu-demo
build, torch and vLLM, is most of it; docker/README.md has the build times), the GPU stand-ins take 75 s + 40 s.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import testinfra
import yaml
from containers import client, published_ports, remove_image, run_once
from images import ensure_base_images
from ports import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "compose" / "cpu-demo.yml"
COMPOSE = shutil.which("docker-compose")
README_COMMAND = re.compile(r"^docker compose -p ornith-cpu-demo -f compose/cpu-demo\.yml up\b.*$", re.MULTILINE)
PROJECT = f"ornith-it-{os.getpid()}"
PORTS = ("ENGINE", "EXPORTER", "PROMETHEUS", "GRAFANA", "ALERTMANAGER")
BUILD_TIMEOUT_S = 2400
# Engine start in the container: about 1-3 minutes on two cores (first start compiles); the compose
# healthcheck allows 300 s.
START_TIMEOUT_S = 420
# Repetition gives the ngram proposer matches, so drafts are made and some accepted.
PROMPT = "one two three four five one two three four five one two three four five one two three"
# Grafana is the only service not started: see the module docstring.
SERVICES = ("engine", "exporter", "prometheus")




def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 600,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, check=False, capture_output=True, text=True, env=env, timeout=timeout,
                            cwd=REPO)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(argv[:6])}... exited {result.returncode}:\n{result.stderr[-3000:]}")
    return result


def compose_v2_available() -> bool:
    return subprocess.run(["docker", "compose", "version"], check=False, capture_output=True).returncode == 0


def readme_command() -> list[str]:
    """The README's first command for the cpu-demo stack, split as a shell would, on the test's own project (the
    one `up` started), so that it never touches a user's ornith-cpu-demo on the same daemon."""
    match = README_COMMAND.search((REPO / "README.md").read_text())
    assert match, "README.md no longer prints `docker compose -p ornith-cpu-demo -f compose/cpu-demo.yml up`"
    argv = shlex.split(match[0])
    argv[argv.index("-p") + 1] = PROJECT
    return argv


@pytest.fixture(scope="module")
def bases() -> dict[str, str]:
    if COMPOSE is None:
        pytest.skip("docker-compose (v1) is not installed")
    if not compose_v2_available():
        pytest.skip("Compose v2 (`docker compose`) is not installed: run scripts/install-compose-v2.sh")
    return ensure_base_images("python", "prometheus")


@pytest.fixture(scope="module")
def grafana_standin(bases: dict[str, str]) -> Iterator[str]:
    tag = f"ornith-it/grafana-standin:{os.getpid()}"
    dockerfile = f'FROM {bases["python"]}\nCMD ["python3", "-m", "http.server", "3000", "-d", "/tmp"]\n'
    subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=dockerfile, text=True, check=True,
                   capture_output=True, timeout=300)
    yield tag
    remove_image(tag)


@pytest.fixture(scope="module")
def demo_env(bases: dict[str, str], grafana_standin: str, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[dict[str, str]]:
    """The environment compose and `ornith-stack` run in: local bases, free loopback ports, nothing else set.
    ORNITH_TEST_ENV_FILE: where `up` keeps the API key (--env-file). The project is removed at the end, whatever
    the tests did."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORNITH_", "GRAFANA_", "HF_TOKEN"))}
    env.update(
        ORNITH_PYTHON_BASE_IMAGE=bases["python"],
        ORNITH_PROMETHEUS_IMAGE=bases["prometheus"],
        ORNITH_ALERTMANAGER_IMAGE=bases["prometheus"],  # the same Debian image carries Alertmanager
        ORNITH_MONITORING_UID="990",  # its prometheus user, who reads the login files
        ORNITH_GRAFANA_IMAGE=grafana_standin,
        COMPOSE_PROJECT_NAME=PROJECT,
        ORNITH_TEST_ENV_FILE=str(tmp_path_factory.mktemp("up") / "compose.env"),
        **{f"ORNITH_{name}_PORT": str(free_port()) for name in PORTS},
    )
    yield env
    subprocess.run(["docker", "compose", "-p", PROJECT, "down", "--volumes", "--remove-orphans"],
                   capture_output=True, check=False, timeout=300)


def cli(env: dict[str, str], *args: str, timeout: float = 2400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ornith_stack.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def up(env: dict[str, str], timeout: float = 2400) -> subprocess.CompletedProcess[str]:
    # Under load here the engine took 9.5 minutes to answer /health (its compile); the default allows 10.
    return cli(env, "up", "cpu-demo", "--project", PROJECT, "--env-file", env["ORNITH_TEST_ENV_FILE"],
               "--start-timeout", "1500", timeout=timeout)


@pytest.fixture(scope="module")
def first_up(demo_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`ornith-stack up cpu-demo` on a machine without the stack: it builds the images and starts it."""
    started = time.monotonic()
    result = up(demo_env)
    print(result.stderr[-3000:])
    assert result.returncode == 0, result.stderr[-4000:]
    print(f"`ornith-stack up` built the images and started the stack in {time.monotonic() - started:.0f} s")
    return result


def api_key(env: dict[str, str]) -> str:
    text = Path(env["ORNITH_TEST_ENV_FILE"]).read_text()
    match = re.search(r"^ORNITH_API_KEY=(\S+)$", text, re.MULTILINE)
    assert match
    return match[1]


def compose(env: dict[str, str], *args: str, timeout: float = 600, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
    """Compose v2 (`docker compose`), the README's command, on compose/cpu-demo.yml."""
    return run(["docker", "compose", "-f", str(DEMO), *args], env=env, timeout=timeout, check=check)


def compose_v1(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run([COMPOSE, "-f", str(DEMO), *args], env=env)


def container_id(env: dict[str, str], service: str) -> str:
    cid = compose(env, "ps", "-q", service).stdout.strip()
    assert cid, f"no container for service {service}"
    return cid


def wait_for(what: str, probe, timeout_s: float, env: dict[str, str]):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = probe()
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            value = None
        if value:
            return value
        time.sleep(2)
    logs = compose(env, "logs", "--tail", "40", check=False).stdout
    raise AssertionError(f"{what} within {timeout_s:.0f} s; last logs:\n{logs[-6000:]}")


@pytest.fixture(scope="module")
def stack(first_up: subprocess.CompletedProcess[str], demo_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The README's `docker compose -p ornith-cpu-demo -f compose/cpu-demo.yml up --build`, run as printed (foreground), on the project
    `up` started, with the values of `up`'s env file in its environment. Yields the URLs, the API key and the
    engine container's id before and after the command."""
    # What `up` kept in its env file (the API key, the operator's credential), as compose reads compose/.env for a
    # user of the README's command: this test's `up` kept them in a file of its own.
    kept = dict(line.split("=", 1) for line in Path(demo_env["ORNITH_TEST_ENV_FILE"]).read_text().splitlines()
                if "=" in line and not line.startswith("#"))
    env = {**demo_env, **kept}
    argv = readme_command()
    engine_before = container_id(env, "engine")
    print(f"running the README's command: {shlex.join(argv)}")
    log = open(f"/tmp/{PROJECT}-up.log", "w")  # noqa: SIM115 - closed in finally
    readme_up = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    urls = {
        "engine": f"http://127.0.0.1:{env['ORNITH_ENGINE_PORT']}",
        "exporter": f"http://127.0.0.1:{env['ORNITH_EXPORTER_PORT']}",
        "prometheus": f"http://127.0.0.1:{env['ORNITH_PROMETHEUS_PORT']}",
    }
    try:
        started = time.monotonic()

        def attached_and_healthy() -> bool:
            assert readme_up.poll() is None, (f"`{shlex.join(argv)}` exited {readme_up.returncode}:\n"
                                              + Path(log.name).read_text()[-4000:])
            # Compose prints "Attaching to ..." once every container is up and it follows their logs.
            attached = "Attaching to" in Path(log.name).read_text()
            return attached and httpx.get(urls["engine"] + "/health", timeout=5).status_code == 200

        wait_for("the README's command attached and the engine answered /health", attached_and_healthy,
                 BUILD_TIMEOUT_S + START_TIMEOUT_S, env)
        # Compose attaches before the one-shots it starts again (the key check, the monitoring logins) have run:
        # wait until every long-running service runs and the one-shots are done.
        services = yaml.safe_load(DEMO.read_text())["services"]
        long_running = {name for name, service in services.items() if service.get("restart") != "no"}
        wait_for("every long-running service of the README's command running, its one-shots done",
                 lambda: long_running == set(compose(env, "ps", "--status", "running", "--services").stdout.split()),
                 START_TIMEOUT_S, env)
        print(f"the README's command was attached to a healthy stack after {time.monotonic() - started:.0f} s")
        key = env["ORNITH_API_KEY"]
        # Traffic the ngram proposer can draft from, so the acceptance series move.
        for _ in range(3):
            chat(urls["engine"], PROMPT, 48, key)
        yield {**urls, "key": key, "engine_before": engine_before, "engine_after": container_id(env, "engine")}
    finally:
        # Killed, not interrupted: Ctrl-C (or SIGTERM) would stop the containers, and the tests after this one
        # (a second `up`, `down`) act on the running stack; once `down` has removed it the command has exited.
        readme_up.kill()
        readme_up.wait(timeout=60)
        log.close()


def chat(base_url: str, prompt: str, max_tokens: int, key: str) -> dict:
    response = httpx.post(base_url + "/v1/chat/completions", timeout=120, headers={"Authorization": f"Bearer {key}"},
                          json={
        "model": "ornith", "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": prompt}],
    })
    assert response.status_code == 200, response.text
    return response.json()


def prom_query(base_url: str, expr: str) -> list[dict]:
    body = httpx.get(base_url + "/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", body
    return body["data"]["result"]


def _listening_ports(host) -> set[int]:
    """TCP ports in LISTEN state (0A) from /proc/net/tcp{,6}: the images have no ss or netstat."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in host.run(f"cat {table}").stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


# -- `ornith-stack up cpu-demo`: the user's whole path -------------------------------------------------


def project_objects() -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    found = []
    for kind in (["ps", "-aq"], ["volume", "ls", "-q"], ["network", "ls", "-q"]):
        found += subprocess.run(["docker", *kind, "--filter", label], capture_output=True, text=True,
                                check=True).stdout.split()
    return found


def printed_curl(output: str) -> tuple[str, str]:
    """The `export ...` line and the `curl ...` line that `up` printed under "curl:"."""
    lines = output.split("\ncurl:\n", 1)[1].splitlines()
    return lines[0], lines[1]


def http_code(script: str, env: dict[str, str]) -> str:
    env = {k: v for k, v in env.items() if k != "ORNITH_API_KEY"}
    return subprocess.run(["bash", "-c", script + " -o /dev/null -w '%{http_code}'"], env=env, capture_output=True,
                          text=True, timeout=300, check=True).stdout


def test_printed_curl_answers_200_with_the_key_and_401_without(first_up: subprocess.CompletedProcess[str],
                                                               demo_env: dict[str, str]) -> None:
    assert "changed: built" in first_up.stdout or "changed: started" in first_up.stdout
    export, curl = printed_curl(first_up.stdout)
    assert export.startswith("export $(grep ^ORNITH_API_KEY=") and "$ORNITH_API_KEY" in curl
    assert http_code(f"{export}\n{curl}", demo_env) == "200"
    assert http_code(curl, demo_env) == "401"
    env_file = Path(demo_env["ORNITH_TEST_ENV_FILE"])
    assert env_file.stat().st_mode & 0o777 == 0o600
    for name in ("Grafana", "Prometheus", "Alertmanager"):
        assert re.search(rf"^{name}: http://127\.0\.0\.1:\d+$", first_up.stdout, re.MULTILINE), name


def test_the_key_reaches_no_process_list_and_no_log(first_up: subprocess.CompletedProcess[str],
                                                    demo_env: dict[str, str]) -> None:
    key = api_key(demo_env)
    assert key not in first_up.stdout + first_up.stderr
    listing = subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True, check=True).stdout
    assert "vllm.entrypoints.openai.api_server" in listing and key not in listing
    logs = subprocess.run(["docker", "compose", "-p", PROJECT, "logs", "--no-color"], capture_output=True, text=True,
                          check=True)
    assert "Application startup complete" in logs.stdout and key not in logs.stdout + logs.stderr


def test_the_real_vllm_refuses_its_non_v1_routes_without_the_key(first_up: subprocess.CompletedProcess[str],
                                                                  demo_env: dict[str, str]) -> None:
    """vLLM guards only /v1 upstream (POST /invocations answered without the key); the entrypoint adds the
    project's guard through vLLM's --middleware. `up` proved it (its roles step); here each route directly."""
    assert "no key: 401 on POST /invocations, POST /tokenize" in first_up.stdout + first_up.stderr
    base = f"http://127.0.0.1:{demo_env['ORNITH_ENGINE_PORT']}"
    key = {"Authorization": f"Bearer {api_key(demo_env)}"}
    model = {"model": "ornith", "prompt": "hi"}
    for path, body in (("/invocations", {**model, "max_tokens": 1}), ("/tokenize", model),
                       ("/detokenize", {"model": "ornith", "tokens": [1]}), ("/server_info", None)):
        method = "GET" if body is None else "POST"
        assert httpx.request(method, base + path, json=body, timeout=60).status_code == 401, path
        assert httpx.request(method, base + path, json=body, headers=key, timeout=60).status_code != 401, path
    for path in ("/health", "/metrics"):
        assert httpx.get(base + path, timeout=30).status_code == 200, path


def test_status_shows_acceptance_and_decode_speed(first_up: subprocess.CompletedProcess[str],
                                                  demo_env: dict[str, str]) -> None:
    engine = f"http://127.0.0.1:{demo_env['ORNITH_ENGINE_PORT']}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {api_key(demo_env)}"}
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
        result = cli(demo_env, "status", "--project", PROJECT, "--interval", "4", timeout=120)
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


def test_second_up_has_nothing_to_change(first_up: subprocess.CompletedProcess[str], demo_env: dict[str, str]) -> None:
    result = up(demo_env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "nothing to change" in result.stdout and "changed:" not in result.stdout


def test_the_exporter_image_is_the_lightest_and_carries_no_bench(first_up: subprocess.CompletedProcess[str]) -> None:
    """The sizes of the images `up` built, printed for the CI log; the exporter's has no grader and no plots."""
    services = yaml.safe_load(DEMO.read_text())["services"]
    images = {name: services[name]["image"] for name in ("engine", "exporter")}
    sizes = {name: client().images.get(tag).attrs["Size"] / 1e6 for name, tag in images.items()}
    print("image sizes: " + ", ".join(f"{name} {images[name]} {size:.0f} MB" for name, size in sorted(sizes.items())))
    probe = "import importlib.util as u; print([m for m in ('sympy', 'math_verify', 'matplotlib', 'numpy') if u.find_spec(m)])"
    found = run_once(images["exporter"], ["-c", probe], entrypoint="python3")
    assert found.exit_code == 0, found.stderr
    assert found.stdout.strip() == "[]"
    assert sizes["exporter"] < sizes["engine"]


def test_monitoring_beyond_loopback_asks_for_the_password(first_up: subprocess.CompletedProcess[str],
                                                          demo_env: dict[str, str]) -> None:
    """ORNITH_MONITORING_BIND=0.0.0.0 with ORNITH_MONITORING_PASSWORD: Prometheus and Alertmanager (Debian's,
    with the web config monitoring-auth wrote) answer 401 without it and 200 with it, and Prometheus still
    gets its alerts through (the always-firing watchdog arrives in Alertmanager); without a password the
    one-shot refuses in one line and nothing is published. A project of its own, the images `up` built,
    no engine (--no-deps)."""
    password = "pa:ss@w/rd%"
    ports = {name: str(free_port()) for name in ("PROMETHEUS", "ALERTMANAGER")}
    env = {**demo_env, "COMPOSE_PROJECT_NAME": f"{PROJECT}-auth", "ORNITH_MONITORING_BIND": "0.0.0.0",
           **{f"ORNITH_{name}_PORT": port for name, port in ports.items()}}
    project = ["-p", f"{PROJECT}-auth", "--env-file", os.devnull]
    try:
        refused = compose(env, *project, "up", "--no-deps", "--no-build", "monitoring-auth", timeout=300, check=False)
        assert "error: ORNITH_MONITORING_BIND=0.0.0.0 would publish Prometheus" in refused.stdout + refused.stderr
        assert '"ExitCode":1' in compose(env, *project, "ps", "--all", "--format", "json",
                                         "monitoring-auth").stdout.replace(" ", "")
        env["ORNITH_MONITORING_PASSWORD"] = password
        compose(env, *project, "up", "--no-deps", "--no-build", "monitoring-auth", "alertmanager-config", timeout=300)
        compose(env, *project, "up", "--detach", "--no-deps", "--no-build", "alertmanager", "prometheus", timeout=300)
        prometheus, alertmanager = (f"http://127.0.0.1:{ports[name]}" for name in ("PROMETHEUS", "ALERTMANAGER"))
        login = ("ornith", password)
        wait_for("Prometheus ready with the password",
                 lambda: httpx.get(f"{prometheus}/-/ready", auth=login, timeout=5).status_code == 200, 120, env)
        for base in (prometheus, alertmanager):
            assert httpx.get(f"{base}/-/ready", timeout=5).status_code == 401, base
            assert httpx.get(f"{base}/-/ready", auth=("ornith", "wrong"), timeout=5).status_code == 401, base
            assert httpx.get(f"{base}/-/ready", auth=login, timeout=5).status_code == 200, base
        assert httpx.get(f"{alertmanager}/api/v2/silences", timeout=5).status_code == 401
        wait_for("the watchdog in Alertmanager (Prometheus sends with the password)",
                 lambda: any(a["labels"]["alertname"] == "OrnithWatchdog"
                             for a in httpx.get(f"{alertmanager}/api/v2/alerts", auth=login, timeout=5).json()),
                 120, env)
        # Its healthcheck fetches the readiness URL with the credentials monitoring-auth wrote.
        wait_for("Prometheus' healthcheck healthy",
                 lambda: '"Health":"healthy"' in compose(env, *project, "ps", "--format", "json",
                                                        "prometheus").stdout.replace(" ", ""), 120, env)
    finally:
        compose(env, *project, "down", "--volumes", "--remove-orphans", timeout=300, check=False)


# -- the cpu-demo stack ---------------------------------------------------------------------------------


class TestCpuDemoStack:
    """The README's `docker compose -p ornith-cpu-demo -f compose/cpu-demo.yml up --build` (engine, exporter, Prometheus and the
    Grafana stand-in), run on the stack `up` started."""

    def test_the_readme_command_keeps_the_engine_up_started(self, stack: dict[str, str]) -> None:
        # `up` keeps its variables in its env file so that a plain `docker compose` starts the same stack.
        assert stack["engine_after"] == stack["engine_before"]

    def test_every_service_of_the_readme_command_is_running(self, stack: dict[str, str],
                                                            demo_env: dict[str, str]) -> None:
        services = yaml.safe_load(DEMO.read_text())["services"]
        # One-shot services (restart: "no": alertmanager-config, monitoring-auth) run to completion before the others.
        one_shot = {name for name, service in services.items() if service.get("restart") == "no"}
        running = set(compose(demo_env, "ps", "--status", "running", "--services").stdout.split())
        assert running - one_shot == set(services) - one_shot, running
        # The README's command runs the one-shots again (the key check, the logins): each exits once done.
        wait_for("the one-shots of the README's command exited",
                 lambda: one_shot <= set(compose(demo_env, "ps", "--all", "--status", "exited", "--services"
                                                 ).stdout.split()), START_TIMEOUT_S, demo_env)
        for name in one_shot:  # finished, and successfully: a failed one-shot holds its dependants back
            state = compose(demo_env, "ps", "--all", "--format", "json", name).stdout
            assert '"ExitCode":0' in state.replace(" ", ""), state

    def test_docker_compose_v1_resolves_the_same_stack_and_sees_its_containers(
        self, stack: dict[str, str], demo_env: dict[str, str]
    ) -> None:
        v1 = yaml.safe_load(compose_v1(demo_env, "config").stdout)["services"]
        v2 = yaml.safe_load(compose(demo_env, "config").stdout)["services"]
        assert v1.keys() == v2.keys()
        for name in v1:
            assert v1[name].get("image") == v2[name].get("image"), name
            assert v1[name].get("command") == v2[name].get("command"), name
            v2_ports = {f"{p['host_ip']}:{p['published']}:{p['target']}/{p['protocol']}" for p in v2[name].get("ports", [])}
            assert set(v1[name].get("ports", [])) == v2_ports, name
        for service in SERVICES:
            assert compose_v1(demo_env, "ps", "-q", service).stdout.strip() == container_id(demo_env, service)

    def test_engine_answers_a_chat_completion(self, stack: dict[str, str]) -> None:
        answer = chat(stack["engine"], "Say hello.", 16, stack["key"])
        assert answer["model"] == "ornith"
        assert answer["usage"]["completion_tokens"] > 0
        assert isinstance(answer["choices"][0]["message"]["content"], str)

    @pytest.mark.parametrize("service", SERVICES)
    def test_every_process_in_the_container_runs_as_non_root(
        self, stack: dict[str, str], demo_env: dict[str, str], service: str
    ) -> None:
        host = testinfra.get_host(f"docker://{container_id(demo_env, service)}")
        # /proc, not `ps`: the slim images have no procps. Fields: name, real uid, effective uid.
        table = host.check_output("for s in /proc/[0-9]*/status; do "
                                  "awk '/^Name:/{n=$2} /^Uid:/{print n, $2, $3}' \"$s\" 2>/dev/null; done")
        processes = [line.split() for line in table.splitlines() if line.strip()]
        assert processes, "no process found"
        root = [p for p in processes if p[1] == "0" or p[2] == "0"]
        assert root == [], f"{service}: processes running as root: {root}"
        assert host.user().uid != 0

    @pytest.mark.parametrize(("service", "port"),
                             [("engine", 8000), ("exporter", 9400), ("prometheus", 9090)])
    def test_ports_listen_inside_and_publish_on_loopback(
        self, stack: dict[str, str], demo_env: dict[str, str], service: str, port: int
    ) -> None:
        cid = container_id(demo_env, service)
        assert port in _listening_ports(testinfra.get_host(f"docker://{cid}"))
        published = published_ports(cid, port)
        assert published and all(address == "127.0.0.1" for address, _ in published), published

    def test_prometheus_has_the_exporter_target_up(
        self, stack: dict[str, str], demo_env: dict[str, str]
    ) -> None:
        def exporter_up() -> list[dict]:
            answer = httpx.get(stack["prometheus"] + "/api/v1/targets", timeout=10).json()
            targets = answer["data"]["activeTargets"]
            return [t for t in targets if t["labels"]["job"] == "ornith-exporter" and t["health"] == "up"]

        up = wait_for("Prometheus saw the exporter's target up", exporter_up, 90, demo_env)
        assert up[0]["labels"]["instance"] == "exporter:9400"

    def test_prometheus_has_acceptance_and_throughput_series(
        self, stack: dict[str, str], demo_env: dict[str, str]
    ) -> None:
        # Prometheus scrapes every 15 s (monitoring/prometheus/prometheus.yml); the recording rules' rate()
        # needs two scrapes of the exporter's counters, so allow several intervals.
        # Traffic while waiting: the counters must move between two of Prometheus' scrapes, and the fixture's
        # requests may all have been served before its first.
        query = 'ornith:spec_acceptance_length:rate5m{profile="cpu-demo"}'

        def acceptance_with_traffic() -> list[dict]:
            chat(stack["engine"], PROMPT, 48, stack["key"])
            return prom_query(stack["prometheus"], query)

        acceptance = wait_for("an ornith:spec_acceptance_length:rate5m series", acceptance_with_traffic, 120, demo_env)
        # 1 + accepted/steps: at least 1 (the bonus token), at most 1 + num_speculative_tokens (4, cpu-demo).
        value = float(acceptance[0]["value"][1])
        assert 1.0 <= value <= 5.0, acceptance
        assert acceptance[0]["metric"]["engine"] == "vllm"
        throughput = wait_for("an ornith:decode_tokens:rate1m series",
                              lambda: prom_query(stack["prometheus"], "ornith:decode_tokens:rate1m"),
                              120, demo_env)
        assert float(throughput[0]["value"][1]) >= 0.0


# -- `down` ----------------------------------------------------------------------


def test_down_with_volumes_leaves_nothing_of_the_project(stack: dict[str, str], demo_env: dict[str, str]) -> None:
    """Last of the stack's tests: the GPU stand-ins below build without the stack holding the CPU."""
    assert project_objects() != []
    result = cli(demo_env, "down", "--project", PROJECT, "--volumes", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert project_objects() == []


# -- the GPU engine images, built on a stand-in base --------------------------------------------------------


def _compose_engine(profile: str, env: dict[str, str]) -> dict:
    """The engine service of compose/<profile>.yml as docker-compose v1 resolves it (variables filled)."""
    out = run([COMPOSE, "-f", str(REPO / "compose" / f"{profile}.yml"), "config"], env=env).stdout
    return yaml.safe_load(out)["services"]["engine"]


# Profile per GPU Dockerfile: the build args and command come from its compose file.
STANDINS = {"sglang": "a100x2", "vllm": "spark"}
STANDIN_CACHE_TAG = "ornith-it/{}-standin:build-cache"


@pytest.fixture(scope="module")
def standins(bases: dict[str, str]) -> Iterator[dict[str, dict]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORNITH_")}
    env["ORNITH_MODEL_REPO"] = "example-org/Ornith-1.0-35B"  # spark's required value
    def build(kind: str, profile: str) -> dict:
        engine = _compose_engine(profile, env)
        args = {**engine["build"]["args"], "BASE_IMAGE": bases["python"]}
        tag = f"ornith-it/{kind}-standin:{os.getpid()}"
        start = time.monotonic()
        # A second tag keeps the layers, and so the build cache, once the test removes its own: the next run on
        # this daemon builds in seconds what took 95 s cold (CI's daemon outlives its runs).
        run(["docker", "build", "-q", "-f", engine["build"]["dockerfile"], "-t", tag, "-t", STANDIN_CACHE_TAG.format(kind),
             *[f"--build-arg={k}={v}" for k, v in args.items()], "."], timeout=BUILD_TIMEOUT_S)
        print(f"{kind} stand-in built in {time.monotonic() - start:.0f} s")
        return {"tag": tag, "profile": profile, "engine": engine}

    # Both at once: most of a build is pip downloading and unpacking, which the two share the machine for better
    # than they would one after the other (75 s + 40 s in turn on two cores).
    with ThreadPoolExecutor(len(STANDINS)) as pool:
        futures = {kind: pool.submit(build, kind, profile) for kind, profile in STANDINS.items()}
        built = {kind: future.result() for kind, future in futures.items()}
    yield built
    for item in built.values():
        remove_image(item["tag"])


@pytest.mark.parametrize("kind", STANDINS)
def test_entrypoint_execs_the_compose_command_with_extra_args_appended(standins: dict, kind: str) -> None:
    item = standins[kind]
    command = item["engine"]["command"]
    env = {"ORNITH_PROFILE": item["profile"], "ORNITH_DOCTOR_WARN_ONLY": "1", "ORNITH_DRY_RUN": "1",
           "ORNITH_EXTRA_ARGS": "--log-level debug"}
    result = run_once(item["tag"], command, environment=env)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == [*command, "--log-level", "debug"]


@pytest.mark.parametrize("kind", STANDINS)
def test_entrypoint_refuses_without_a_gpu_and_says_why(standins: dict, kind: str) -> None:
    item = standins[kind]
    result = run_once(item["tag"], item["engine"]["command"], environment={"ORNITH_PROFILE": item["profile"]})
    assert result.exit_code == 1
    assert re.search(r"FAIL\s+gpu: no GPU detected", result.stderr), result.stderr
    assert f"refusing to start: 'ornith-stack doctor --profile {item['profile']}'" in result.stderr
    # It refused before exec: the engine module (absent from the stand-in) was never started.
    assert "No module named" not in result.stderr


def test_entrypoint_refuses_an_unknown_profile(standins: dict) -> None:
    result = run_once(standins["sglang"]["tag"], ["true"],
                      environment={"ORNITH_PROFILE": "a100x3", "ORNITH_SKIP_DOCTOR": "1"})
    assert result.exit_code == 2
    assert "refusing to start: unknown profile 'a100x3'" in result.stderr


def test_sglang_image_pins_the_seeds_transformers(standins: dict) -> None:
    # Seed 000: "Keep transformers at 5.12.1 with SGLang 0.5.17." (a100x2 passes TRANSFORMERS_VERSION).
    result = run_once(standins["sglang"]["tag"], ["-c", "import transformers; print(transformers.__version__)"],
                      entrypoint="python3")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "5.12.1"
