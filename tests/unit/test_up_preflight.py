"""`ornith-stack up` preflight: each refusal comes from the real output of its condition.

The Docker CLI's answers are replayed from tests/fixtures/docker/ (recorded on the build machine; its
README says how each was made). A missing `docker` program and the disk figures are real on this machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from docker_replay import Replay, recorded

from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError
from ornith_stack.profiles import load_profile
from ornith_stack.stack import preflight as P
from ornith_stack.stack.bringup import hf_cache, hf_mount
from ornith_stack.stack.envfile import api_key, monitoring_password, operator_key, read_env, set_env
from ornith_stack.stack.shell import Result, run

REPO = Path(__file__).resolve().parents[2]
ENGINE_LOGS = REPO / "tests" / "fixtures" / "engines"


INFO = ("docker", "info")
COMPOSE = ("docker", "compose", "version")
V1 = ("docker-compose", "version")


def test_an_unreachable_daemon_is_one_error_naming_the_fix() -> None:
    replay = Replay({INFO: recorded("docker-info-no-daemon", 1)})
    with pytest.raises(UserError) as caught:
        P.docker_info(replay)
    message = str(caught.value)
    assert message.startswith("Docker is not reachable (Cannot connect to the Docker daemon at "
                              "unix:///run/ornith-no-docker.sock. Is the docker daemon running?)")
    assert "sudo systemctl start docker" in message and "\n" not in message


def test_a_missing_docker_program_says_install_docker(tmp_path: Path) -> None:
    # The real condition: no `docker` on PATH.
    def without_docker(argv: Sequence[str], timeout: float = 600.0, on_line: object = None) -> Result:
        return run(argv, timeout, env={"PATH": str(tmp_path)})

    with pytest.raises(UserError, match=r"^docker is not installed: install Docker Engine"):
        P.docker_info(without_docker)


def test_compose_v1_only_is_refused_with_the_plugin_to_install() -> None:
    replay = Replay({COMPOSE: recorded("compose-version-without-plugin", 1), V1: recorded("docker-compose-v1-version")})
    with pytest.raises(UserError) as caught:
        P.compose_version(replay)
    assert str(caught.value).startswith("Compose v2 is needed and only docker-compose 1.29.2 (Compose v1) is installed")
    assert "docker-compose-plugin" in str(caught.value)


def test_compose_v2_passes_with_its_version() -> None:
    assert P.compose_version(Replay({COMPOSE: recorded("compose-version-v2")})) == "2.26.1-4"


def test_a_gpu_profile_needs_dockers_nvidia_runtime() -> None:
    info = json.loads(recorded("docker-info-no-nvidia").stdout)
    with pytest.raises(UserError) as caught:
        P.check_nvidia_runtime(load_profile("gpu96"), info)
    assert "Docker has no NVIDIA runtime (runtimes: io.containerd.runc.v2, io.containerd.runtime.v1.linux, runc)" in str(
        caught.value)
    assert "nvidia-ctk runtime configure --runtime=docker" in str(caught.value)
    P.check_nvidia_runtime(load_profile("cpu-demo"), info)  # no GPU, no runtime needed


def test_too_little_disk_names_the_folder_and_the_shortfall(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    P.check_disk({tmp_path: max(free - P.DISK_MARGIN - P.GIB, 0)})  # fits with the margin
    with pytest.raises(UserError, match=rf"^{tmp_path} has [\d.]+ GiB free; the weights and images need"):
        P.check_disk({tmp_path / "not-yet" / "hf": free})  # a folder to be created: its parent's disk


def test_two_folders_on_one_filesystem_add_up(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    half = (shutil.disk_usage(tmp_path).free - P.DISK_MARGIN) // 2 + P.GIB
    P.check_disk({tmp_path / "a": half})
    with pytest.raises(UserError):
        P.check_disk({tmp_path / "a": half, tmp_path / "b": half})


@pytest.mark.parametrize(("bind", "has_key", "refused"), [
    ("0.0.0.0", False, True), ("192.168.1.5", False, True), ("0.0.0.0", True, False),
    ("127.0.0.1", False, False), ("::1", False, False), ("[::1]", False, False)])
def test_no_key_no_network(bind: str, has_key: bool, refused: bool) -> None:
    if refused:
        with pytest.raises(UserError, match=rf"^ORNITH_BIND={bind} would publish an unauthenticated API"):
            P.check_exposure(bind, has_key)
    else:
        P.check_exposure(bind, has_key)


def test_the_doctor_picks_cpu_demo_without_gpus_and_refuses_gpu96() -> None:
    profile, reason = P.choose_profile("auto")
    assert profile.name == "cpu-demo" and reason and "no GPU detected" in reason
    with pytest.raises(UserError, match=r"^preflight: gpu96: gpu: no GPU detected.*`ornith-stack up cpu-demo`"):
        P.choose_profile("gpu96")


# -- the env file and the key ---------------------------------------------------------------------


def test_up_writes_a_new_key_0600_and_keeps_the_other_lines(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("# mine\nORNITH_BIND=127.0.0.1\n")
    env.chmod(0o644)
    first = api_key(env, {}, wanted=True)
    assert first.created and len(first.value) >= 40
    assert env.stat().st_mode & 0o777 == 0o600
    assert env.read_text().startswith("# mine\nORNITH_BIND=127.0.0.1\n")
    again = api_key(env, {}, wanted=True)
    assert again.value == first.value and not again.created
    given = api_key(env, {"ORNITH_API_KEY": "from-env"}, wanted=True)
    assert given.value == "from-env" and read_env(env)["ORNITH_API_KEY"] == "from-env"
    assert "from-env" not in given.where


def test_no_key_writes_nothing(tmp_path: Path) -> None:
    assert api_key(tmp_path / ".env", {}, wanted=False).value == ""
    assert not (tmp_path / ".env").exists()


def test_set_env_replaces_one_variable(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    set_env(env, "A", "1")
    set_env(env, "B", "2")
    set_env(env, "A", "3")
    assert read_env(env) == {"B": "2", "A": "3"}


# -- start phases from real engine logs -----------------------------------------------------------


@pytest.mark.parametrize(("kind", "log"), [("sglang", "sglang-0.5.17/tp1/engine.log"),
                                           ("vllm", "vllm-0.24.0/dflash/engine.log")])
def test_start_phases_appear_in_a_real_engine_log_in_order(kind: str, log: str) -> None:
    text = (ENGINE_LOGS / log).read_text()
    positions = [re.search(pattern, text) for _, pattern in adapter_for(kind).start_phases]
    assert all(positions), [phase for (phase, _), m in zip(adapter_for(kind).start_phases, positions, strict=True)
                            if m is None]
    offsets = [m.start() for m in positions if m]
    assert offsets == sorted(offsets)


# -- the command on this GPU-less machine ---------------------------------------------------------


def _project_objects(project: str) -> list[str]:
    label = f"label=com.docker.compose.project={project}"
    found = []
    for argv in (["docker", "ps", "-aq", "--filter", label], ["docker", "volume", "ls", "-q", "--filter", label],
                 ["docker", "network", "ls", "-q", "--filter", label]):
        found += subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
    return found


@pytest.mark.skipif(shutil.which("docker") is None, reason="docker is not installed")
def test_up_gpu96_without_a_gpu_stops_at_preflight_and_creates_nothing(tmp_path: Path) -> None:
    project = f"up-test-{os.getpid()}"
    env_file, hf_home = tmp_path / "compose.env", tmp_path / "hf"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("ORNITH_", "HF_"))}
    environ["HF_HOME"] = str(hf_home)
    result = subprocess.run([sys.executable, "-m", "ornith_stack.cli", "up", "gpu96", "--project", project,
                             "--env-file", str(env_file)], cwd=REPO, capture_output=True, text=True, env=environ,
                            timeout=300, check=False)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "no GPU detected" in errors[0] and "ornith-stack up cpu-demo" in errors[0]
    assert result.stdout == ""
    assert not env_file.exists() and not hf_home.exists()  # no key written, no download begun
    assert _project_objects(project) == []  # no container, volume or network


# -- what `up` exposes ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["k\nORNITH_BIND=0.0.0.0", "k\rey", "k\tey", "k ey", "k\x00ey", "kéy"])
def test_up_refuses_a_key_that_would_break_the_env_file_or_the_header(tmp_path: Path, key: str) -> None:
    # A newline would end the key's line in compose/.env and make the rest a setting of its own.
    env = tmp_path / ".env"
    with pytest.raises(UserError) as caught:
        api_key(env, {"ORNITH_API_KEY": key}, wanted=True)
    assert "visible ASCII" in str(caught.value) and key not in str(caught.value)
    assert "\n" not in str(caught.value) and not env.exists()


@pytest.mark.parametrize("key", ["Zq8$HOSTNAME", "k${ORNITH_BIND}", "'quoted'", '"quoted"'])
def test_up_refuses_a_key_compose_would_change(tmp_path: Path, key: str) -> None:
    env = tmp_path / ".env"
    with pytest.raises(UserError) as caught:
        api_key(env, {"ORNITH_API_KEY": key}, wanted=True)
    assert "compose would change" in str(caught.value) and key not in str(caught.value) and not env.exists()


def test_compose_reads_the_keys_up_writes_as_written(tmp_path: Path) -> None:
    """`docker compose config` (v2) on the env file `up` wrote: every accepted key reaches the service intact
    (every visible ASCII character but the ones check_key refuses: $ ' " \\ and the backquote)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("docker compose (v2) is not installed")
    env = tmp_path / ".env"
    user = api_key(env, {"ORNITH_API_KEY": "a#b!c%d&e*f(g)h;i|j<k>l?m~n^o=p{q}r[s]t,u/v@w"}, wanted=True).value
    operator = operator_key(env, {}, wanted=True).value
    (tmp_path / "c.yml").write_text("services:\n  a:\n    image: busybox\n    environment:\n"
                                    "      ORNITH_API_KEY: ${ORNITH_API_KEY:-}\n"
                                    "      ORNITH_OPERATOR_KEY: ${ORNITH_OPERATOR_KEY:-}\n")
    done = subprocess.run(["docker", "compose", "-f", str(tmp_path / "c.yml"), "--env-file", str(env), "config",
                           "--format", "json"], capture_output=True, text=True, check=True)
    environment = json.loads(done.stdout)["services"]["a"]["environment"]
    assert environment == {"ORNITH_API_KEY": user, "ORNITH_OPERATOR_KEY": operator}


def test_the_operator_key_is_kept_like_the_api_key_and_differs_from_it(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    user = api_key(env, {}, wanted=True)
    operator = operator_key(env, {}, wanted=True)
    assert operator.created and len(operator.value) >= 40 and operator.value != user.value
    assert read_env(env) == {"ORNITH_API_KEY": user.value, "ORNITH_OPERATOR_KEY": operator.value}
    assert env.stat().st_mode & 0o777 == 0o600
    assert operator_key(env, {}, wanted=True).value == operator.value
    with pytest.raises(UserError, match="^ORNITH_OPERATOR_KEY equals ORNITH_API_KEY") as caught:
        operator_key(env, {"ORNITH_OPERATOR_KEY": user.value}, wanted=True)
    assert user.value not in str(caught.value) and read_env(env)["ORNITH_OPERATOR_KEY"] == operator.value
    assert operator_key(tmp_path / "none.env", {}, wanted=False).value == ""


@pytest.mark.parametrize(("bind", "refused"), [("0.0.0.0", True), ("10.0.0.7", True), ("[::]", True),
                                               ("127.0.0.1", False), ("::1", False), ("localhost", False)])
def test_monitoring_leaves_loopback_only_with_a_password(bind: str, refused: bool) -> None:
    if refused:
        with pytest.raises(UserError, match=rf"^ORNITH_MONITORING_BIND={re.escape(bind)} would publish Prometheus, "
                           r"Alertmanager and Grafana without a login .*set ORNITH_MONITORING_PASSWORD"):
            P.check_monitoring_exposure(bind, has_password=False)
    else:
        P.check_monitoring_exposure(bind, has_password=False)
    P.check_monitoring_exposure(bind, has_password=True)


def test_up_makes_a_monitoring_password_only_beyond_loopback(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    assert monitoring_password(env, {}, "127.0.0.1").value == "" and not env.exists()
    made = monitoring_password(env, {}, "0.0.0.0")
    assert made.created and len(made.value) >= 40 and env.stat().st_mode & 0o777 == 0o600
    assert read_env(env)["ORNITH_MONITORING_PASSWORD"] == made.value and made.value not in made.where
    # Kept: a later `up`, on loopback or not, runs with the same one (compose reads it from the file too).
    assert monitoring_password(env, {}, "127.0.0.1").value == made.value
    again = monitoring_password(env, {}, "0.0.0.0")
    assert again.value == made.value and not again.created
    given = monitoring_password(env, {"ORNITH_MONITORING_PASSWORD": "mine"}, "0.0.0.0")
    assert given.value == "mine" and read_env(env)["ORNITH_MONITORING_PASSWORD"] == "mine"


def test_a_monitoring_password_with_a_line_break_is_refused_unechoed(tmp_path: Path) -> None:
    with pytest.raises(UserError) as caught:
        monitoring_password(tmp_path / ".env", {"ORNITH_MONITORING_PASSWORD": "p\nORNITH_BIND=0.0.0.0"}, "0.0.0.0")
    assert str(caught.value).startswith("$ORNITH_MONITORING_PASSWORD holds a line break")
    assert "ORNITH_BIND=0.0.0.0" not in str(caught.value) and not (tmp_path / ".env").exists()


def test_a_monitoring_password_past_bcrypts_72_bytes_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    with pytest.raises(UserError) as caught:
        monitoring_password(env, {"ORNITH_MONITORING_PASSWORD": "p" * 73}, "0.0.0.0")
    assert "longer than bcrypt's 72 bytes" in str(caught.value) and "p" * 73 not in str(caught.value)
    assert not env.exists()
    assert monitoring_password(env, {"ORNITH_MONITORING_PASSWORD": "p" * 72}, "0.0.0.0").value == "p" * 72


def test_up_mounts_only_the_hub_folder_read_only(tmp_path: Path) -> None:
    home = tmp_path / "huggingface"
    mount = hf_mount(home)
    assert mount == {"ORNITH_HF_CACHE": str(home / "hub"), "ORNITH_HF_CACHE_MOUNT": "/data/hf/hub:ro"}
    # What `up` wrote is read back as the same HF folder (an older env file's folder too).
    assert hf_cache(mount) == home and hf_cache({"ORNITH_HF_CACHE": str(home)}) == home
    compose = shutil.which("docker-compose")
    if compose is None:
        pytest.skip("docker-compose (v1) is not installed")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ORNITH_", "HF_"))}
    resolved = subprocess.run([compose, "-f", str(REPO / "compose" / "gpu96.yml"), "config"], check=True,
                              capture_output=True, text=True, env={**clean, **mount}, cwd=REPO).stdout
    volumes = yaml.safe_load(resolved)["services"]["engine"]["volumes"]
    assert [v for v in volumes if str(v).startswith(str(tmp_path))] == [f"{home / 'hub'}:/data/hf/hub:ro"]


def test_the_key_file_is_ignored_by_git() -> None:
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "compose/.env"], cwd=REPO, capture_output=True,
                             text=True, check=False)
    assert ignored.stdout.strip() == "compose/.env"
