"""The Dockerfiles, the entrypoint and the compose files agree with the profiles and pins.

Image builds and running stacks are in tests/integration/test_compose.py; here: lint, pins, variables,
and the entrypoint's decisions (run on this machine with the real `ornith-stack`, no container).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ornith_stack.engines import launch_args
from ornith_stack.profiles import images, load_profile, profile_names

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
# The engine images' entrypoint, as their Dockerfiles name it (the venv's ornith-stack here).
ENTRYPOINT = [str(Path(sys.executable).parent / "ornith-stack"), "entrypoint"]
DOCKERFILES = sorted(DOCKER.glob("*.Dockerfile"))
BIN = Path(sys.executable).parent
COMPOSE_V1 = shutil.which("docker-compose")


def _compose(name: str) -> dict:
    return yaml.safe_load((REPO / "compose" / f"{name}.yml").read_text())


# Computed profiles' compose files (tests/unit/test_layout.py keeps them current): replicas and the gateway.
COMPUTED = sorted((REPO / "tests" / "fixtures" / "computed").glob("compose-*.yml"))


def _all_composes() -> list[dict]:
    return [_compose(n) for n in profile_names()] + [yaml.safe_load(p.read_text()) for p in COMPUTED]


def _default(value: str) -> str:
    """The default of a `${VAR:-default}` reference (the value itself when it is not one)."""
    match = re.fullmatch(r"\$\{\w+:-(.*)\}", value)
    return match[1] if match else value


def _arg_defaults(dockerfile: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(.*)$", dockerfile.read_text(), flags=re.MULTILINE))


def test_one_engine_dockerfile_serves_every_gpu_profile() -> None:
    # SGLang and vLLM differ only in build args: one engine Dockerfile, no near-copies.
    assert {p.name for p in DOCKERFILES} == {"engine.Dockerfile", "exporter.Dockerfile", "cpu-demo.Dockerfile",
                                             "gateway.Dockerfile"}
    gpu = [n for n in profile_names() if "dockerfile" not in _engine_pin(n)]
    assert {_compose(n)["services"]["engine"]["build"]["dockerfile"] for n in gpu} == {"docker/engine.Dockerfile"}
    assert {load_profile(n).engine.kind for n in gpu} == {"sglang", "vllm"}


def _engine_pin(name: str) -> dict:
    engine = load_profile(name).engine
    return images()["engines"][engine.kind][engine.version]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_is_hadolint_clean(dockerfile: Path) -> None:
    result = subprocess.run([BIN / "hadolint", str(dockerfile)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def _build_args_by_dockerfile() -> dict[str, list[dict[str, str]]]:
    """For each Dockerfile, the build args (their defaults) that the compose files pass to it."""
    found: dict[str, list[dict[str, str]]] = {}
    for compose in _all_composes():
        for service in compose["services"].values():
            build = service.get("build")
            if build:
                args = {k: _default(str(v)) for k, v in build.get("args", {}).items()}
                found.setdefault(Path(build["dockerfile"]).name, []).append(args)
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_defaults_are_the_pins_compose_passes(dockerfile: Path) -> None:
    # A plain `docker build` without --build-arg must give what compose builds for one of its profiles,
    # so the Dockerfile defaults cannot drift from src/ornith_stack/images.yaml.
    defaults = _arg_defaults(dockerfile)
    passed = _build_args_by_dockerfile()[dockerfile.name]
    assert {k: defaults.get(k) for k in passed[0]} in passed


@pytest.mark.parametrize("name", profile_names())
def test_compose_builds_each_engine_from_its_profile_pins(name: str) -> None:
    profile = load_profile(name)
    build = _compose(name)["services"]["engine"]["build"]
    args = {k: _default(str(v)) for k, v in build["args"].items()}
    pin = images()["engines"][profile.engine.kind][profile.engine.version]
    if "dockerfile" in pin:  # an image this project builds, FROM the Debian + Python base
        assert (build["dockerfile"], args) == (pin["dockerfile"], {"BASE_IMAGE": images()["bases"]["python"]})
    else:
        assert args == {"BASE_IMAGE": profile.engine.image,
                        "TRANSFORMERS_VERSION": profile.engine.python_pins.get("transformers", "")}


def test_sglang_0_5_17_keeps_the_seeds_transformers() -> None:
    # Seed 000: "Keep transformers at 5.12.1 with SGLang 0.5.17."
    args = _compose("a100x2")["services"]["engine"]["build"]["args"]
    assert args["TRANSFORMERS_VERSION"] == "5.12.1"
    assert _arg_defaults(DOCKER / "engine.Dockerfile")["TRANSFORMERS_VERSION"] == "5.12.1"


SGLANG_CU129 = "lmsysorg/sglang:v0.5.17-cu129"
SGLANG_FALLBACK = "ORNITH_ENGINE_BASE_IMAGE=lmsysorg/sglang:v0.5.17"


def test_the_seeds_sglang_pin_is_kept_and_its_plain_tag_fallback_is_named_everywhere() -> None:
    # Seed 000 pins the -cu129 tag; SGLang's releases name CUDA 12.9 images plain v0.5.17. Where the pull
    # fails, the user must find the exact setting: in the compose file, .env.example, the Dockerfile,
    # docker/README.md and the README.
    assert images()["engines"]["sglang"]["0.5.17"]["image"] == SGLANG_CU129
    assert _arg_defaults(DOCKER / "engine.Dockerfile")["BASE_IMAGE"] == SGLANG_CU129
    for name in profile_names():
        text = (REPO / "compose" / f"{name}.yml").read_text()
        assert (SGLANG_FALLBACK in text) == (load_profile(name).engine.image == SGLANG_CU129), name
    for path in ("compose/.env.example", "docker/engine.Dockerfile", "docker/README.md", "README.md"):
        text = (REPO / path).read_text().replace("--build-arg BASE_IMAGE=", "ORNITH_ENGINE_BASE_IMAGE=")
        assert SGLANG_FALLBACK in text, path


@pytest.mark.parametrize("dockerfile", ["exporter.Dockerfile", "cpu-demo.Dockerfile", "gateway.Dockerfile"])
def test_project_images_run_as_a_non_root_user_with_a_healthcheck(dockerfile: str) -> None:
    text = (DOCKER / dockerfile).read_text()
    final_stage = text.rsplit("\nFROM ", 1)[1]
    users = re.findall(r"^USER (\S+)", final_stage, flags=re.MULTILINE)
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    assert re.search(r"^HEALTHCHECK ", final_stage, flags=re.MULTILINE)


def test_env_example_documents_every_compose_variable() -> None:
    used = set()
    for path in [*(REPO / "compose").glob("*.yml"), *COMPUTED]:
        used |= set(re.findall(r"\$\{(\w+)", path.read_text()))
    example = (REPO / "compose" / ".env.example").read_text()
    documented = set(re.findall(r"^#? ?(\w+)=", example, flags=re.MULTILINE))
    assert used - documented == set()
    assert "HF_TOKEN" in documented


@pytest.mark.parametrize("compose", _all_composes(), ids=[*profile_names(), *(p.stem for p in COMPUTED)])
def test_ports_bind_to_loopback_unless_the_operator_says_otherwise(compose: dict) -> None:
    # ORNITH_BIND opens the API alone (engine or gateway); monitoring has a setting of its own, and the
    # exporter, which has no login, follows neither.
    api = {"gateway"} if "gateway" in compose["services"] else {"engine"}
    for service, spec in compose["services"].items():
        for port in spec.get("ports", []):
            bind = "ORNITH_BIND" if service in api else "ORNITH_MONITORING_BIND"
            start = "127.0.0.1:" if service == "exporter" else f"${{{bind}:-127.0.0.1}}:"
            assert port.startswith(start), (service, port)


@pytest.mark.parametrize("name", profile_names())
def test_hf_token_comes_from_the_environment_only(name: str) -> None:
    environment = _compose(name)["services"]["engine"]["environment"]
    assert "HF_TOKEN" in environment and environment["HF_TOKEN"] is None  # pass-through, no value


def test_cpu_demo_needs_no_variable() -> None:
    # The README's first command (docker compose -p ornith-cpu-demo -f compose/cpu-demo.yml up --build) starts as is.
    assert ":?" not in (REPO / "compose" / "cpu-demo.yml").read_text()


def test_grafana_home_dashboard_exists() -> None:
    env = _compose("cpu-demo")["services"]["grafana"]["environment"]
    home = env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (REPO / "monitoring" / "grafana" / "dashboards" / Path(home).name).is_file()


def _compose_config(name: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ORNITH_", "GRAFANA_", "HF_"))}
    return subprocess.run([COMPOSE_V1, "-f", str(REPO / "compose" / f"{name}.yml"), "config", "-q"],
                          check=False, capture_output=True, text=True, env={**clean, **env}, cwd=REPO)


@pytest.mark.skipif(COMPOSE_V1 is None, reason="docker-compose (v1) is not installed")
@pytest.mark.parametrize("name", profile_names())
def test_docker_compose_v1_accepts_the_file(name: str) -> None:
    result = _compose_config(name, ORNITH_MODEL_REPO="org/model")
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(COMPOSE_V1 is None, reason="docker-compose (v1) is not installed")
def test_a_missing_required_value_fails_compose_naming_it() -> None:
    result = _compose_config("spark")
    assert result.returncode != 0
    assert "set ORNITH_MODEL_REPO in compose/.env" in result.stderr


@pytest.mark.parametrize("compose", _all_composes(), ids=[*profile_names(), *(p.stem for p in COMPUTED)])
def test_the_key_check_guards_the_engines_without_their_waiting_for_it(compose: dict) -> None:
    # Compose recreates a service whose dependency it recreates (tests/integration/test_ansible.py: an exporter-only
    # change leaves the engine running): an engine depends on no one-shot, and checks the key in its entrypoint,
    # with ORNITH_BIND where it is published; the gateway's launcher checks it too.
    services = compose["services"]
    check = services["api-key-check"]
    assert check["restart"] == "no" and check["network_mode"] == "none"
    serving = [name for name, spec in services.items() if name.startswith(("engine", "gateway"))]
    assert serving
    for name in serving:
        depends = services[name].get("depends_on") or {}
        assert all(services[d].get("restart") != "no" for d in depends), (name, depends)
        environment = services[name]["environment"]
        assert environment["ORNITH_OPERATOR_KEY"] == "${ORNITH_OPERATOR_KEY:-}", name
        if name.startswith("engine") and services[name].get("ports"):
            assert environment["ORNITH_BIND"] == "${ORNITH_BIND:-127.0.0.1}", name
    # The exporter and the monitoring logins still wait for it.
    for name in ("exporter", "monitoring-auth", "alertmanager-config"):
        assert services[name]["depends_on"]["api-key-check"]["condition"] == "service_completed_successfully"


@pytest.mark.skipif(COMPOSE_V1 is None, reason="docker-compose (v1) is not installed")
@pytest.mark.parametrize(("env", "refused"), [
    ({"ORNITH_BIND": "0.0.0.0"}, "ORNITH_BIND=0.0.0.0 publishes the API beyond loopback without ORNITH_API_KEY"),
    ({"ORNITH_BIND": "10.1.2.3", "ORNITH_API_KEY": "k1", "ORNITH_OPERATOR_KEY": "k1"},
     "ORNITH_OPERATOR_KEY equals ORNITH_API_KEY"),
    ({"ORNITH_BIND": "0.0.0.0", "ORNITH_API_KEY": "k1", "ORNITH_OPERATOR_KEY": "k2"}, None),
    ({}, None),
], ids=["open beyond loopback", "one key for both roles", "keyed", "loopback"])
def test_a_plain_compose_up_refuses_an_open_api_beyond_loopback(env: dict[str, str], refused: str | None) -> None:
    """The api-key-check one-shot as compose resolves it (its command and environment), run here."""
    result = subprocess.run([COMPOSE_V1, "-f", str(REPO / "compose" / "gpu96.yml"), "config"], check=True,
                            capture_output=True, text=True, cwd=REPO,
                            env={**{k: v for k, v in os.environ.items() if not k.startswith("ORNITH_")}, **env})
    check = yaml.safe_load(result.stdout)["services"]["api-key-check"]
    assert check["entrypoint"][0] == "python"
    done = subprocess.run([sys.executable, *check["entrypoint"][1:]], capture_output=True, text=True,
                          env={**os.environ, **check["environment"]})
    if refused is None:
        assert done.returncode == 0 and done.stderr == "", done.stderr
    else:
        assert done.returncode == 1 and done.stderr.startswith(f"error: {refused}")
        assert done.stderr.count("\n") == 1 and "k1" not in done.stderr


# -- the entrypoint -------------------------------------------------------------------------------------


def _entrypoint(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORNITH_")}
    base["PATH"] = f"{BIN}{os.pathsep}{base.get('PATH', '')}"  # ornith-stack and python3 of this venv
    return subprocess.run([*ENTRYPOINT, *argv], check=False, capture_output=True, text=True,
                          env={**base, **env}, timeout=120)


def test_entrypoint_refuses_an_unknown_profile_even_with_the_doctor_skipped() -> None:
    result = _entrypoint("true", ORNITH_PROFILE="a100x3", ORNITH_SKIP_DOCTOR="1")
    assert result.returncode == 2
    assert "refusing to start: unknown profile 'a100x3'" in result.stderr and "a100x2" in result.stderr


def test_entrypoint_refuses_when_the_doctor_finds_no_gpu() -> None:
    # The CI machines have no GPU, so the doctor fails a GPU profile.
    result = _entrypoint("touch", "/tmp/should-not-run", ORNITH_PROFILE="gpu96")
    assert result.returncode == 1
    assert "FAIL  gpu: no GPU detected" in result.stderr
    assert "refusing to start" in result.stderr and "ORNITH_DOCTOR_WARN_ONLY=1" in result.stderr


def test_entrypoint_appends_extra_args_to_the_command() -> None:
    command = launch_args(load_profile("gpu96"))
    result = _entrypoint(*command, ORNITH_PROFILE="gpu96", ORNITH_DOCTOR_WARN_ONLY="1", ORNITH_DRY_RUN="1",
                         ORNITH_EXTRA_ARGS="--log-level debug --served-model-name 'my model'")
    assert result.returncode == 0, result.stderr
    assert "FAIL  gpu" in result.stderr  # warn-only still reports the problem
    assert json.loads(result.stdout) == [*command, "--log-level", "debug", "--served-model-name", "my model"]


def test_entrypoint_passes_every_word_of_the_command_as_given() -> None:
    command = ["sh", "-c", 'echo "$@"', "--", "--help", "-h", "--x=1", "-abc", "--"]
    result = _entrypoint(*command, ORNITH_PROFILE="cpu-demo", ORNITH_SKIP_DOCTOR="1", ORNITH_DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == command


def test_entrypoint_refuses_extra_args_it_cannot_split() -> None:
    result = _entrypoint("true", ORNITH_PROFILE="gpu96", ORNITH_SKIP_DOCTOR="1", ORNITH_DRY_RUN="1",
                         ORNITH_EXTRA_ARGS="--served-model-name 'my model")
    assert result.returncode == 2
    assert "ORNITH_EXTRA_ARGS has unbalanced quotes" in result.stderr and result.stdout == ""


SECRETS = ("sk-live-0123456789", "hf_AbCdEfGhIjKlMnOpQrStUv", "adm1n-s3cret", "pa ss")


def test_entrypoint_log_redacts_secrets_in_the_command() -> None:
    # The entrypoint logs the argv it execs; ORNITH_EXTRA_ARGS may carry an API key. `echo` stands in for
    # the engine: its stdout proves the real argv still holds the secrets, the log (stderr) must not.
    extra = (f"--api-key {SECRETS[0]} --hf-token={SECRETS[1]} --admin-api-key {SECRETS[2]} "
             f"--max-num-batched-tokens 8 --ssl-keyfile-password '{SECRETS[3]}'")
    result = _entrypoint("echo", "--model", "org/model", ORNITH_PROFILE="gpu96", ORNITH_SKIP_DOCTOR="1",
                         ORNITH_EXTRA_ARGS=extra)
    assert result.returncode == 0, result.stderr
    assert all(s in result.stdout for s in SECRETS)
    assert [s for s in SECRETS if s in result.stderr] == []
    log = next(line for line in result.stderr.splitlines() if ": exec " in line)
    # Everything else stays readable, including flags that merely contain "token".
    assert "exec echo --model org/model --api-key '<redacted>' '--hf-token=<redacted>'" in log
    assert "--max-num-batched-tokens 8" in log


def test_entrypoint_log_redacts_every_key_of_vllms_list_form() -> None:
    # vLLM's --api-key takes several keys: `--api-key a b` hides both, and the next flag stays readable.
    result = _entrypoint("echo", ORNITH_PROFILE="cpu-demo", ORNITH_SKIP_DOCTOR="1",
                         ORNITH_EXTRA_ARGS=f"--api-key {SECRETS[0]} {SECRETS[2]} --port 8001")
    assert result.returncode == 0, result.stderr
    assert SECRETS[0] in result.stdout and SECRETS[2] in result.stdout
    log = next(line for line in result.stderr.splitlines() if ": exec " in line)
    assert log.endswith("exec echo --api-key '<redacted>' '<redacted>' --port 8001"), log


# A stand-in for the engine process: it reports what it received (argv, the key's hash as it found it in
# its environment or its --config file, that file's mode) and then prints the key itself on stdout and
# stderr, as SGLang does when it logs `server_args=ServerArgs(... api_key='...')`, once it has read a line on
# stdin, so that a test can look at the process list while it runs.
ENGINE_STANDIN = """
import hashlib, json, os, sys, yaml
argv = sys.argv[1:]
digest = lambda text: hashlib.sha256(text.encode()).hexdigest() if text else None
config = argv[argv.index("--config") + 1] if "--config" in argv else None
report = {"argv": argv, "env_key": digest(os.environ.get("VLLM_API_KEY", "")),
          "ornith_key_in_env": "ORNITH_API_KEY" in os.environ,
          "config_key": digest(yaml.safe_load(open(config))["api-key"]) if config else None,
          "config_mode": oct(os.stat(config).st_mode & 0o777) if config else None}
print(json.dumps(report), flush=True)
sys.stdin.readline()
key = os.environ.get("VLLM_API_KEY") or yaml.safe_load(open(config))["api-key"]
print(f"server_args=ServerArgs(api_key={key!r})", flush=True)
print(f"warning: key {key}", file=sys.stderr, flush=True)
"""
API_KEY = "ornith-k3y-0123456789abcdef"


def _entrypoint_running(profile: str) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORNITH_")}
    base["PATH"] = f"{BIN}{os.pathsep}{base.get('PATH', '')}"
    env = {**base, "ORNITH_PROFILE": profile, "ORNITH_SKIP_DOCTOR": "1", "ORNITH_API_KEY": API_KEY}
    return subprocess.Popen([*ENTRYPOINT, sys.executable, "-c", ENGINE_STANDIN, "--port", "8000"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


@pytest.mark.parametrize(("profile", "where"), [("cpu-demo", "env_key"), ("gpu96", "config_key")])
def test_entrypoint_hands_the_key_to_the_engine_off_its_command_line_and_out_of_its_logs(
    profile: str, where: str
) -> None:
    # vLLM (cpu-demo) reads $VLLM_API_KEY; SGLang 0.5.17 (gpu96) has no such variable and gets a 0600
    # --config YAML file instead. Either way the key is in no argv, in no `ps` line, in no log line.
    proc = _entrypoint_running(profile)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        report = json.loads(proc.stdout.readline())
        listing = subprocess.run(["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True,
                                 check=True).stdout
        proc.stdin.write("\n")
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    expected = hashlib.sha256(API_KEY.encode()).hexdigest()
    assert report[where] == expected
    assert report["ornith_key_in_env"] is False
    if where == "config_key":
        assert report["config_mode"] == "0o600"
    assert API_KEY not in " ".join(report["argv"])
    assert str(proc.pid) in listing and API_KEY not in listing
    # The engine printed the key on both streams; what leaves the container is redacted.
    assert "server_args=ServerArgs(api_key='<redacted>')" in out and "warning: key <redacted>" in err
    assert API_KEY not in out + err


# An engine that dies: 2,000 lines on stdout (the key in some, as SGLang's server_args line has it), then why,
# on stderr, and a non-zero status, all within milliseconds, as a crashing engine does.
DYING_ENGINE = """
import os, sys
key = os.environ.get("VLLM_API_KEY", "")
for i in range(2000):
    sys.stdout.write(f"line {i} api_key={key!r}\\n" if i % 500 == 0 else f"line {i}\\n")
sys.stdout.flush()
sys.stderr.write("CUDA error: an illegal memory access was encountered\\n")
os._exit(3)
"""


def _in_pid_namespace(*argv: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    """`argv` as the first process of a new PID namespace (PID 1, as in a container without an init)."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                                                     capture_output=True, check=False).returncode != 0:
        pytest.skip("unshare --pid needs root (or user namespaces) here")
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORNITH_")}
    return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", *argv], capture_output=True,
                          check=False, env={**base, **env}, timeout=120)


@pytest.mark.parametrize("run", range(3))
def test_with_a_key_the_entrypoint_keeps_every_line_of_an_engine_that_dies(run: int) -> None:
    # The filters beside an exec'd engine died with it: 1,116, 0 and 0 of these 2,001 lines survived in three
    # runs, the CUDA error never. The supervisor reads both pipes to the end and exits with the engine's status.
    result = _in_pid_namespace(*ENTRYPOINT, sys.executable, "-c", DYING_ENGINE, ORNITH_PROFILE="cpu-demo",
                               ORNITH_SKIP_DOCTOR="1", ORNITH_API_KEY=API_KEY)
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 3, err
    assert out.splitlines() == [f"line {i} api_key='<redacted>'" if i % 500 == 0 else f"line {i}"
                                for i in range(2000)]
    assert err.splitlines()[-1] == "CUDA error: an illegal memory access was encountered"
    assert API_KEY not in out + err


def test_the_supervisor_forwards_the_stop_signal_and_keeps_the_engines_goodbye() -> None:
    # `docker stop` signals PID 1, the supervisor: the engine must get it, and its last words must come out.
    graceful = ("import signal, sys, time\n"
                "def stop(*_):\n    print('engine: stopping cleanly', flush=True); sys.exit(0)\n"
                "signal.signal(signal.SIGTERM, stop)\nprint('engine: up', flush=True)\ntime.sleep(60)\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORNITH_")}
    proc = subprocess.Popen([*ENTRYPOINT, sys.executable, "-c", graceful], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**base, "ORNITH_PROFILE": "cpu-demo",
                                                                   "ORNITH_SKIP_DOCTOR": "1", "ORNITH_API_KEY": API_KEY})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "engine: up\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == "engine: stopping cleanly\n"


def test_the_key_is_redacted_in_its_escaped_forms_too() -> None:
    # A key with a slash, a percent and a plus sign is written differently by URLs; each form leaves the container
    # as <redacted>. (Quotes, a backslash, `$` and a backquote are refused: test_the_entrypoint_refuses_a_key...)
    key = "k/ey%with+odd/chars&="
    printer = ("import json, os, urllib.parse as u\nk = os.environ['VLLM_API_KEY']\n"
               "print(repr(k)); print(json.dumps(k)); print(u.quote(k, safe='')); print(u.quote_plus(k)); print(k)")
    result = _entrypoint(sys.executable, "-c", printer, ORNITH_PROFILE="cpu-demo", ORNITH_SKIP_DOCTOR="1",
                         ORNITH_API_KEY=key)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["'<redacted>'", '"<redacted>"', "<redacted>", "<redacted>", "<redacted>"]


@pytest.mark.parametrize("key", ["k\nORNITH_BIND=0.0.0.0", "k\x1b[2Jey", "k ey", "kéy", "k$HOME", "k'ey", 'k"ey',
                                 "k\\ey", "k`id`"])
def test_the_entrypoint_refuses_a_key_that_cannot_be_a_bearer_token(key: str) -> None:
    result = _entrypoint("true", ORNITH_PROFILE="cpu-demo", ORNITH_SKIP_DOCTOR="1", ORNITH_API_KEY=key)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error:")  # before the doctor's line
    said = result.stderr
    assert ("visible ASCII" in said or "control character" in said) and key not in said


def test_engine_images_start_through_the_python_entrypoint() -> None:
    for dockerfile in ("engine.Dockerfile", "cpu-demo.Dockerfile"):
        entry = re.findall(r"^ENTRYPOINT (.*)$", (DOCKER / dockerfile).read_text(), flags=re.MULTILINE)
        assert [json.loads(e) for e in entry] == [["ornith-stack", "entrypoint"]], dockerfile


def test_entrypoint_dry_run_shows_the_handoff_without_the_key() -> None:
    result = _entrypoint("python3", "-m", "sglang.launch_server", ORNITH_PROFILE="gpu96", ORNITH_SKIP_DOCTOR="1",
                         ORNITH_DRY_RUN="1", ORNITH_API_KEY=API_KEY)
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"] and argv[3] == "--config"
    assert argv[4].endswith("/sglang-api-key.yaml") and API_KEY not in result.stdout + result.stderr


def test_entrypoint_does_not_echo_extra_args_it_refuses() -> None:
    result = _entrypoint("true", ORNITH_PROFILE="gpu96", ORNITH_SKIP_DOCTOR="1",
                         ORNITH_EXTRA_ARGS=f"--api-key '{SECRETS[0]}")
    assert result.returncode == 2
    assert SECRETS[0] not in result.stderr + result.stdout


def test_entrypoint_without_a_command_runs_the_profiles_launch_args() -> None:
    result = _entrypoint(ORNITH_PROFILE="gb300x2", ORNITH_SKIP_DOCTOR="1", ORNITH_DRY_RUN="1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == launch_args(load_profile("gb300x2"))


def test_host_mode_exporter_listens_on_loopback_unless_told_otherwise() -> None:
    # `ornith-stack exporter` run on a host (no container) must not expose /metrics to the network by
    # default; the images pass --listen :9400 explicitly (the port is published on loopback by compose).
    proc = subprocess.Popen([BIN / "ornith-stack", "exporter", "--target", "http://127.0.0.1:9"],
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline() if proc.stderr else ""
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert first.startswith("ornith-stack exporter on 127.0.0.1:9400/metrics"), first
    image_cmd = (DOCKER / "exporter.Dockerfile").read_text().rsplit("\nCMD ", 1)[1].split("\n", 1)[0]
    assert json.loads(image_cmd)[-2:] == ["--listen", ":9400"]


def _hf_cache_with(tmp_path: Path, repo: str, revision: str = "main") -> Path:
    """A Hugging Face cache (HF_HOME) holding `repo` at `revision`, laid out as huggingface_hub writes it."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = tmp_path / "hub" / f"models--{repo.replace('/', '--')}"
    (folder / "snapshots" / commit).mkdir(parents=True)
    (folder / "snapshots" / commit / "config.json").write_text("{}")
    (folder / "refs").mkdir()
    (folder / "refs" / revision).write_text(commit)
    return tmp_path


PRINT_OFFLINE = ("sh", "-c", 'echo "offline=$HF_HUB_OFFLINE"', "engine")


@pytest.mark.parametrize(("command", "offline"), [
    (["--model", "org/model"], "1"),
    (["serve", "org/model"], "1"),
    (["--model-path", "org/model", "--revision", "v2"], ""),  # another revision: not in the cache
    (["--model-path", "org/model", "--speculative-draft-model-path", "org/draft"], ""),  # draft missing
    (["--model", "org/other"], ""),
])
def test_entrypoint_loads_offline_once_the_model_is_in_the_cache(
    tmp_path: Path, command: list[str], offline: str
) -> None:
    # A restart must load exactly what the first start downloaded, without re-resolving `main` on the Hub.
    home = _hf_cache_with(tmp_path, "org/model")
    result = _entrypoint(*PRINT_OFFLINE, *command, ORNITH_PROFILE="gpu96", ORNITH_SKIP_DOCTOR="1",
                         HF_HOME=str(home))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"offline={offline}"
    assert ("HF_HUB_OFFLINE=1" in result.stderr) == (offline == "1")


@pytest.mark.parametrize("setting", ["0", "1"])
def test_entrypoint_keeps_an_explicit_hf_hub_offline(tmp_path: Path, setting: str) -> None:
    result = _entrypoint(*PRINT_OFFLINE, "--model", "org/model", ORNITH_PROFILE="gpu96", ORNITH_SKIP_DOCTOR="1",
                         HF_HOME=str(_hf_cache_with(tmp_path, "org/model")), HF_HUB_OFFLINE=setting)
    assert result.stdout.strip() == f"offline={setting}"


@pytest.mark.parametrize("name", profile_names())
def test_compose_passes_hf_hub_offline_and_the_profiles_revision(name: str) -> None:
    engine = _compose(name)["services"]["engine"]
    profile = load_profile(name)
    # A profile that fixes it (cpu-demo: the model is baked into the image) keeps its value.
    expected = str(profile.serve.env.get("HF_HUB_OFFLINE", "${HF_HUB_OFFLINE:-}"))
    assert engine["environment"]["HF_HUB_OFFLINE"] == expected
    if profile.model.revision != "main":
        assert engine["command"][engine["command"].index("--revision") + 1] == profile.model.revision


def test_every_plain_compose_command_names_its_own_project() -> None:
    # Without -p every profile lands in project `compose` (the folder's name), so `down --volumes` of one
    # deleted the weights volume every profile shared; `ornith-stack up` uses the same ornith-<profile>.
    from ornith_stack.stack.compose import PROJECT_PREFIX

    for path in ("README.md", "docker/README.md", *(f"compose/{n}.yml" for n in profile_names())):
        text = (REPO / path).read_text()
        commands = re.findall(r"docker compose (.*?)-f compose/([\w<>.-]+)\.yml", text)
        assert commands, path
        for options, profile in commands:
            assert options == f"-p {PROJECT_PREFIX}{profile} ", (path, options, profile)


def test_a_dry_run_prints_no_secret_of_extra_args() -> None:
    result = _entrypoint("python3", "-m", "vllm.entrypoints.openai.api_server", ORNITH_PROFILE="cpu-demo",
                         ORNITH_SKIP_DOCTOR="1", ORNITH_DRY_RUN="1",
                         ORNITH_EXTRA_ARGS=f"--api-key {SECRETS[0]} --hf-token={SECRETS[1]} --port 8001")
    assert result.returncode == 0, result.stderr
    argv = json.loads(result.stdout)
    assert argv[-5:] == ["--api-key", "<redacted>", "--hf-token=<redacted>", "--port", "8001"]
    assert SECRETS[0] not in result.stdout + result.stderr and SECRETS[1] not in result.stdout + result.stderr


# Prints where the engine's key file is, then exits: the file must be gone once the entrypoint has returned.
KEY_FILE_REPORTER = "import sys; argv = sys.argv; print(argv[argv.index('--config') + 1])"


@pytest.mark.parametrize("exit_code", [0, 3])
def test_the_key_file_is_removed_when_the_engine_exits(exit_code: int) -> None:
    result = _entrypoint(sys.executable, "-c", f"{KEY_FILE_REPORTER}; sys.exit({exit_code})", ORNITH_PROFILE="gpu96",
                         ORNITH_SKIP_DOCTOR="1", ORNITH_API_KEY=API_KEY)
    assert result.returncode == exit_code, result.stderr
    key_file = Path(result.stdout.strip())
    assert key_file.name == "sglang-api-key.yaml" and not key_file.exists() and not key_file.parent.exists()


OPERATOR_KEY = "ornith-0p3rator-fedcba9876543210"


def test_sglang_gets_the_operators_credential_as_its_admin_key_in_the_same_file() -> None:
    reader = ("import json, os, sys; argv = sys.argv; path = argv[argv.index('--config') + 1]\n"
              "print(json.dumps({'mode': oct(os.stat(path).st_mode & 0o777), 'config': json.load(open(path)),"
              " 'env': sorted(k for k in os.environ if 'OPERATOR' in k)}))")
    result = _entrypoint(sys.executable, "-c", reader, ORNITH_PROFILE="gpu96", ORNITH_SKIP_DOCTOR="1",
                         ORNITH_API_KEY=API_KEY, ORNITH_OPERATOR_KEY=OPERATOR_KEY)
    assert result.returncode == 0, result.stderr
    # The standin printed both keys: what leaves the entrypoint is redacted, so parse the shape only.
    assert result.stdout.strip() == json.dumps({"mode": "0o600", "config": {"api-key": "<redacted>",
                                                                           "admin-api-key": "<redacted>"},
                                                "env": []})


def test_the_entrypoint_refuses_one_key_for_both_roles() -> None:
    result = _entrypoint("true", ORNITH_PROFILE="gpu96", ORNITH_SKIP_DOCTOR="1", ORNITH_API_KEY=API_KEY,
                         ORNITH_OPERATOR_KEY=API_KEY)
    assert result.returncode == 2 and API_KEY not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: refusing to start: ORNITH_OPERATOR_KEY equals ORNITH_API_KEY: the users' key would unlock the admin "
        "and worker routes (give the operator a credential of its own)"]


def test_the_key_is_redacted_encoded_double_escaped_and_wrapped_across_lines() -> None:
    # Base64 of the key alone and inside `user:key` (a Basic header), hex, a JSON string inside a JSON string,
    # and the key wrapped at a line's end (as a log formatter wraps at 80 columns), with and without indent.
    key = 'k3y/with/slash-0123456789abcdef'
    printer = (
        "import base64, json, os\nk = os.environ['VLLM_API_KEY']\n"
        "print(base64.b64encode(k.encode()).decode())\n"
        "print('Authorization: Basic ' + base64.b64encode(('ornith:' + k).encode()).decode())\n"
        "print(base64.urlsafe_b64encode(('xy' + k).encode()).decode())\n"
        "print(k.encode().hex()); print(k.encode().hex().upper())\n"
        "print(json.dumps(json.dumps({'api_key': k})))\n"
        "print('token=' + k[:9]); print(k[9:] + ' end')\n"
        "print('token=' + k[:20]); print('    ' + k[20:])\n")
    result = _entrypoint(sys.executable, "-c", printer, ORNITH_PROFILE="cpu-demo", ORNITH_SKIP_DOCTOR="1",
                         ORNITH_API_KEY=key)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all("<redacted>" in line for line in lines), lines
    import base64

    raw = key.encode()
    for form in (raw.hex(), raw.hex().upper(), base64.b64encode(raw).decode()[:-4], key[4:12], key[12:20],
                 key[20:28]):
        assert form not in result.stdout, form
    assert lines[-4] == "token=<redacted>" and lines[-3] == "<redacted> end"
    assert lines[-2] == "token=<redacted>" and lines[-1] == "    <redacted>"


def _starts_after(services: dict, name: str, first: str) -> bool:
    """Whether service `name` starts after `first` (depends_on, followed through)."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        depends = services[current].get("depends_on") or {}
        for dependency in depends if isinstance(depends, list) else depends.keys():
            if dependency == first:
                return True
            if dependency not in seen:
                seen.add(dependency)
                todo.append(dependency)
    return False


@pytest.mark.parametrize("compose", _all_composes(), ids=[*profile_names(), *(p.stem for p in COMPUTED)])
def test_each_built_image_is_built_by_one_service_the_others_start_after(compose: dict) -> None:
    # Compose labels a built image with the service that built it: a build in each service of one image gives
    # each its own image ID, and the README's `up --build` after `up` recreated the whole stack (engine too).
    # docker-compose v1 makes each service's image just before the service, so a service of an image built
    # elsewhere must start after its builder (the engines' replicas: after the first, in the file's order).
    services = compose["services"]
    builders: dict[str, str] = {}
    for name, spec in services.items():
        if spec.get("build"):
            assert spec["image"] not in builders, f"{name} and {builders[spec['image']]} both build {spec['image']}"
            builders[spec["image"]] = name
    names = list(services)
    for name, spec in services.items():
        builder = builders.get(spec.get("image", ""))
        if builder is None or builder == name:
            continue
        same_dependencies = spec.get("depends_on") == services[builder].get("depends_on")
        assert _starts_after(services, name, builder) or (same_dependencies and names.index(builder) < names.index(name)), (
            f"{name} runs {spec['image']}, built by {builder}, and may start before it")


def test_the_entrypoint_refuses_a_published_engine_without_a_key_as_the_one_shot_does() -> None:
    # The engines no longer wait for api-key-check: the entrypoint is their guard where compose publishes them.
    result = _entrypoint("true", ORNITH_PROFILE="gpu96", ORNITH_SKIP_DOCTOR="1", ORNITH_BIND="0.0.0.0")
    assert result.returncode == 2
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        "error: refusing to start: ORNITH_BIND=0.0.0.0 publishes the API beyond loopback without ORNITH_API_KEY: set "
        "ORNITH_API_KEY in compose/.env (`ornith-stack up` makes one), or ORNITH_BIND=127.0.0.1"]
    allowed = _entrypoint("true", ORNITH_PROFILE="gpu96", ORNITH_SKIP_DOCTOR="1", ORNITH_BIND="127.0.0.1")
    assert "refusing to start" not in allowed.stderr, allowed.stderr
