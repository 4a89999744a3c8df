"""The Ansible playbook against a real Debian host (a systemd container with no GPU), end to end.

What runs for real: the playbook over the community.docker connection; apt installing Docker Engine
and the merged daemon.json (dockerd itself cannot start: the host container is unprivileged); the real `hf` CLI downloading the tiny
model from tests/integration/hf_server.py (the Hub's protocol) at a pinned commit; `ornith-stack doctor
--weights` on the snapshot; the systemd unit of the compose project (installed and enabled, not started:
the GPU engine cannot run here); the exporter as a systemd unit answering /metrics with the engine down.
What cannot run without a GPU: the driver install (the host declares nvidia_driver_gpu_expected: false),
NVIDIA's container toolkit package (its repository is off the network here), the engine start, health
wait and smoke test (ornith_service_start: false). See ansible/README.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from hf_server import HubServer
from images import SYSTEMD_HOST_RUN_ARGS, ensure_base_images

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = ROOT / "ansible"
BIN = Path(sys.executable).parent
HOST_IMAGE = "ornith-local/systemd-host:bookworm"
MODEL_REPO = "ornith-test/ornith-tiny"
DRAFT_REPO = "ornith-test/ornith-tiny-draft"
BIG_REPO = "ornith-test/big-blob"
PROFILE = "gpu96"
HF_HOME = "/var/lib/ornith/hf"
HF_PACKAGE = "huggingface_hub==2.4.0"  # the role's default model_weights_hf_package
# The host installs its Python packages offline from a wheelhouse made here: containers on this machine
# do not trust the TLS interception in front of PyPI that this machine's pip is configured for, and an
# offline wheelhouse is also how air-gapped GPU hosts are served (model_weights_pip_env).
WHEELHOUSE = ROOT / ".cache" / "ansible-it" / "wheelhouse"
HOST_WHEELHOUSE = "/var/cache/ornith-wheelhouse"


def _run(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=check, text=True, capture_output=True, **kwargs)


@pytest.fixture(scope="module")
def host_image() -> str:
    return ensure_base_images("systemd-host")["systemd-host"]


@pytest.fixture(scope="module")
def tiny_model(tiny_models) -> Path:
    """The session's tiny hybrid (`ornith-stack tiny-model`, conftest.py): config, sharded safetensors, index."""
    return tiny_models.hybrid


@pytest.fixture(scope="module")
def big_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 24 MiB file: more than the client's 10 MiB read chunk, so a cut-off transfer has bytes to resume."""
    root = tmp_path_factory.mktemp("big-repo")
    (root / "blob.bin").write_bytes(os.urandom(24 * 1024 * 1024))
    return root


@pytest.fixture(scope="module")
def hub(tiny_model: Path, big_repo: Path):
    with HubServer({MODEL_REPO: tiny_model, DRAFT_REPO: tiny_model, BIG_REPO: big_repo}) as server:
        yield server


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run(str(BIN / "python"), "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT))
    return next(out.glob("ornith_stack-*.whl"))


@pytest.fixture(scope="module")
def wheelhouse(wheel: Path) -> Path:
    """hf and ornith-stack's dependencies as wheels for the host's Python (3.11, same as this venv)."""
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    _run(str(BIN / "python"), "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", str(WHEELHOUSE),
         HF_PACKAGE, str(wheel))
    # Only the dependencies stay: the wheel of this checkout reaches the host through the role (its version
    # does not change with the code, so a cached copy here could shadow the fresh one).
    for stale in WHEELHOUSE.glob("ornith_stack-*.whl"):
        stale.unlink()
    return WHEELHOUSE


@pytest.fixture(scope="module")
def host(host_image: str, wheelhouse: Path):
    name = f"ornith-it-{uuid.uuid4().hex[:8]}"
    # The flags scripts/make-base-images.sh documents for systemd as PID 1 here (not privileged: this
    # Docker cannot grant all capabilities, so dockerd cannot run inside the host; see the module doc).
    _run("docker", "run", "-d", "--name", name, "--hostname", name, *SYSTEMD_HOST_RUN_ARGS,
         "-v", f"{wheelhouse}:{HOST_WHEELHOUSE}:ro", host_image)
    try:
        # Right after `docker run` systemd's bus socket may not exist yet ("Failed to connect to bus").
        for _ in range(30):
            state = _run("docker", "exec", name, "systemctl", "is-system-running", "--wait", check=False)
            if state.stdout.strip():
                break
            time.sleep(1)
        assert state.stdout.strip() in ("running", "degraded"), state.stdout + state.stderr
        yield name
    finally:
        _run("docker", "rm", "-f", "-v", name, check=False)


def _gateway(container: str) -> str:
    """The address the container reaches this machine at (where the Hub stand-in listens)."""
    return _run("docker", "inspect", "-f", "{{ .NetworkSettings.Gateway }}", container).stdout.strip()


@pytest.fixture(scope="module")
def inventory(host: str, hub: HubServer, wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inventory") / "hosts.yml"
    host_vars = {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "nvidia_driver_gpu_expected": False,
        "ornith_service_start": False,
        "ornith_monitoring": "host",
        # The distribution's Prometheus adds ~330 MB to the host; the exporter is what is checked here.
        "monitoring_prometheus_install": False,
        # dockerd needs privileges this container cannot have: installed and enabled, left stopped.
        "container_toolkit_docker_service_state": "stopped",
        "container_toolkit_daemon_options": {"log-driver": "json-file", "log-opts": {"max-size": "100m"}},
        # systemd sandboxing needs mount namespaces, which an unprivileged container cannot make.
        "monitoring_exporter_hardening": False,
        "model_weights_hf_endpoint": f"http://{_gateway(host)}:{hub.port}",
        "model_weights_pip_env": {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": HOST_WHEELHOUSE},
        "model_weights_hf_home": HF_HOME,
        "model_weights_ornith_stack_package": str(wheel),
    }
    path.write_text(json.dumps({"ornith": {"hosts": {host: host_vars}}}))
    return path


def _extra_vars(hub: HubServer, tmp: Path, **more: object) -> Path:
    """The profile overrides: the tiny model and its stand-in draft, pinned to the served commit."""
    data = {
        "ornith_profile": PROFILE,
        "ornith_model_repo": MODEL_REPO,
        "ornith_model_revision": hub.repos[MODEL_REPO].commit,
        "ornith_draft_repo": DRAFT_REPO,
        "ornith_draft_revision": "main",
        **more,
    }
    path = tmp / f"extra-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(data))
    return path


def _playbook(inventory: Path, extra: Path, *args: str,
              playbook: str = "provision-gpu-host.yml") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_NOCOLOR="1", PATH=f"{BIN}:{os.environ['PATH']}")
    return _run(str(BIN / "ansible-playbook"), "-i", str(inventory), playbook,
                "-e", f"@{extra}", *args, check=False, cwd=ANSIBLE_DIR, env=env, timeout=1500)


def _recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    match = re.search(r"^\S+\s+:\s+(ok=.*)$", result.stdout, re.MULTILINE)
    assert match, result.stdout[-3000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


@pytest.fixture(scope="module")
def check_run_on_fresh_host(inventory: Path, hub: HubServer, tmp_path_factory: pytest.TempPathFactory):
    """--check before anything is installed: must get through without failing and change nothing."""
    result = _playbook(inventory, _extra_vars(hub, tmp_path_factory.mktemp("extra")), "--check")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    host = next(iter(json.loads(inventory.read_text())["ornith"]["hosts"]))
    for probe in (["dpkg-query", "-W", "docker.io"], ["test", "-e", "/opt/ornith-stack"]):
        assert _run("docker", "exec", host, *probe, check=False).returncode != 0, f"--check changed the host: {probe}"
    return result


@pytest.fixture(scope="module")
def first_run(check_run_on_fresh_host, inventory: Path, hub: HubServer,
              tmp_path_factory: pytest.TempPathFactory):
    started = time.monotonic()
    result = _playbook(inventory, _extra_vars(hub, tmp_path_factory.mktemp("extra")))
    print(f"first run: {time.monotonic() - started:.0f} s")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    return result


@pytest.fixture(scope="module")
def testinfra_host(host: str, first_run):
    import testinfra

    return testinfra.get_host(f"docker://{host}")


def test_check_mode_on_a_fresh_host_reports_changes_and_installs_nothing(check_run_on_fresh_host, host: str,
                                                                          first_run) -> None:
    # What would change is reported; the fixture checked right after the run that nothing was installed.
    assert _recap(check_run_on_fresh_host)["changed"] > 0


def test_first_run_downloads_the_model_and_draft_through_the_hf_client(first_run, hub: HubServer,
                                                                       tiny_model: Path) -> None:
    served = {p.name for p in tiny_model.iterdir() if p.is_file()}
    # Both repositories share the folder, so each file is sent once per repository.
    assert sorted(hub.downloads) == sorted([*served, *served])


def test_docker_is_installed_with_the_nvidia_runtime_in_daemon_json(testinfra_host) -> None:
    assert testinfra_host.package("docker.io").is_installed
    assert testinfra_host.service("docker").is_enabled
    config = json.loads(testinfra_host.file("/etc/docker/daemon.json").content_string)
    assert config["runtimes"]["nvidia"] == {"path": "nvidia-container-runtime", "args": []}
    assert config["log-opts"] == {"max-size": "100m"}


def test_the_snapshot_holds_the_served_files_at_the_pinned_commit(testinfra_host, hub: HubServer,
                                                                   tiny_model: Path) -> None:
    commit = hub.repos[MODEL_REPO].commit
    snapshot = f"{HF_HOME}/hub/models--ornith-test--ornith-tiny/snapshots/{commit}"
    for path in tiny_model.iterdir():
        remote = testinfra_host.file(f"{snapshot}/{path.name}")
        assert remote.exists, path.name
        assert remote.size == path.stat().st_size
    index = testinfra_host.file(f"{snapshot}/model.safetensors.index.json").content_string
    assert json.loads(index) == json.loads((tiny_model / "model.safetensors.index.json").read_text())
    # The draft's branch was resolved to the same content's commit and recorded as refs/main.
    ref = testinfra_host.file(f"{HF_HOME}/hub/models--ornith-test--ornith-tiny-draft/refs/main")
    assert ref.content_string.strip() == hub.repos[DRAFT_REPO].commit


def test_hf_cli_lives_in_its_own_virtualenv(testinfra_host) -> None:
    version = testinfra_host.check_output("/opt/ornith-stack/hf-venv/bin/hf version")
    assert "2.4.0" in version
    assert not testinfra_host.exists("hf")  # not on the system PATH


def test_doctor_report_is_kept_for_the_model(testinfra_host, hub: HubServer, tiny_model: Path) -> None:
    commit = hub.repos[MODEL_REPO].commit
    report = testinfra_host.file(f"/var/lib/ornith/reports/ornith-test--ornith-tiny@{commit}.doctor.txt")
    assert report.exists
    # doctor read the downloaded index and planned for the profile's GPU (--allow-no-gpu on this host).
    tensors = len(json.loads((tiny_model / "model.safetensors.index.json").read_text())["weight_map"])
    assert f"ok  checkpoint: {tensors} tensors" in report.content_string
    assert report.content_string.rstrip().endswith("ready: profile gpu96")


def test_compose_project_is_a_systemd_unit(testinfra_host) -> None:
    unit = testinfra_host.check_output("systemctl cat ornith-gpu96.service")
    assert "Requires=docker.service" in unit
    assert ("ExecStart=/usr/bin/docker compose --project-name ornith-gpu96 "
            "--file /opt/ornith-stack/compose/gpu96.yml up --detach --remove-orphans engine") in unit
    assert testinfra_host.service("ornith-gpu96").is_enabled
    compose = testinfra_host.file("/opt/ornith-stack/compose/gpu96.yml").content_string
    assert compose == (ROOT / "compose/gpu96.yml").read_text()
    env = testinfra_host.file("/opt/ornith-stack/compose/.env")
    assert env.mode == 0o600
    assert f"ORNITH_HF_CACHE={HF_HOME}" in env.content_string


def test_exporter_answers_with_the_engine_down(testinfra_host) -> None:
    assert testinfra_host.service("ornith-exporter").is_running
    metrics = testinfra_host.check_output("curl -sf http://127.0.0.1:9400/metrics")
    # The engine is not started (no GPU): the exporter says so instead of failing.
    assert re.search(r'^ornith_engine_up\{[^}]*profile="gpu96"[^}]*\} 0\.0$', metrics, re.MULTILINE), metrics


def test_second_run_changes_nothing(first_run, inventory: Path, hub: HubServer, tmp_path: Path) -> None:
    downloads_before = len(hub.downloads)
    result = _playbook(inventory, _extra_vars(hub, tmp_path))
    assert result.returncode == 0, result.stdout[-4000:]
    assert _recap(result)["changed"] == 0, result.stdout[-6000:]
    assert len(hub.downloads) == downloads_before


def test_check_mode_on_the_provisioned_host_reports_no_change(first_run, inventory: Path, hub: HubServer,
                                                              tmp_path: Path) -> None:
    result = _playbook(inventory, _extra_vars(hub, tmp_path), "--check")
    assert result.returncode == 0, result.stdout[-4000:]
    assert _recap(result)["changed"] == 0, result.stdout[-6000:]


def test_too_little_disk_fails_before_downloading(first_run, inventory: Path, hub: HubServer, host: str,
                                                  tmp_path: Path) -> None:
    downloads_before = len(hub.downloads)
    extra = _extra_vars(hub, tmp_path, model_weights_hf_home="/var/lib/ornith/hf-small",
                        model_weights_free_disk_margin_gb=10_000_000)
    result = _playbook(inventory, extra, "--tags", "weights")
    assert result.returncode != 0
    assert "Not enough free disk" in result.stdout
    # The message carries the numbers: what is missing, the margin, what is needed and what is free.
    assert re.search(r"GB still to download .* \+ 10000000(\.0)? GB margin = [\d.]+ GB needed, [\d.]+ GB free",
                     result.stdout.replace("\n", " ")), result.stdout[-3000:]
    assert len(hub.downloads) == downloads_before
    blobs = _run("docker", "exec", host, "find", "/var/lib/ornith/hf-small", "-path", "*blobs*", check=False)
    assert blobs.stdout.strip() == ""


def test_a_host_without_a_gpu_fails_clearly_unless_it_says_so(first_run, inventory: Path, hub: HubServer,
                                                               tmp_path: Path) -> None:
    result = _playbook(inventory, _extra_vars(hub, tmp_path, nvidia_driver_gpu_expected=True), "--tags", "driver")
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert "has no NVIDIA GPU (no PCI device of vendor 0x10de, nvidia-smi finds none)" in text, text[-3000:]
    assert "but profile gpu96 needs 1 GPU(s)" in text
    assert "set nvidia_driver_gpu_expected: false in its inventory" in text


def test_spark_playbook_refuses_a_host_of_the_wrong_architecture(first_run, inventory: Path, hub: HubServer,
                                                                 tmp_path: Path) -> None:
    extra = tmp_path / "spark.json"  # the spark profile's own variables, only the repository supplied
    extra.write_text(json.dumps({"ornith_hosts": "ornith", "ornith_model_repo": MODEL_REPO}))
    result = _playbook(inventory, extra, "--tags", "driver", playbook="provision-spark.yml")
    assert result.returncode != 0
    assert "Profile spark runs on aarch64" in " ".join(result.stdout.split()), result.stdout[-3000:]


def test_an_interrupted_download_resumes_where_it_stopped(first_run, inventory: Path, hub: HubServer, host: str,
                                                          big_repo: Path, tmp_path: Path) -> None:
    """The connection drops halfway through a file: the client asks for the rest with a Range request.

    huggingface_hub 2.4 resumes within a run from the last full 10 MiB chunk it received; across runs the
    unit is the file (finished files stay in the cache, a rerun fetches only the missing ones, as
    test_second_run_changes_nothing shows).
    """
    blob = big_repo / "blob.bin"
    hub.interrupt_next(blob.name)
    hf_home = "/var/lib/ornith/hf-resume"
    extra = _extra_vars(hub, tmp_path, model_weights_hf_home=hf_home, model_weights_doctor_repos=[],
                        model_weights_repos=[{"repo": BIG_REPO, "revision": "main"}])
    result = _playbook(inventory, extra, "--tags", "weights")
    assert result.returncode == 0, result.stdout[-4000:]
    assert (blob.name, 10 * 1024 * 1024) in hub.ranges  # resumed after the first full chunk
    cached = f"{hf_home}/hub/models--ornith-test--big-blob/blobs/{hub.repos[BIG_REPO].blob_ids[blob.name]}"
    done = _run("docker", "exec", host, "sha256sum", cached).stdout.split()[0]
    assert done == hashlib.sha256(blob.read_bytes()).hexdigest()
