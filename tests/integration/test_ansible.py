"""The Ansible playbook against a real Debian host (a systemd container with no GPU), end to end.

The host starts with no checkout and no ornith-stack: the playbook brings everything. What runs for real:
the playbook over the community.docker connection; the preflight; apt installing Docker Engine and compose;
the real `hf` CLI downloading the tiny model from tests/integration/hf_server.py (the Hub's protocol) at a
pinned commit; the images delivered by `docker save` on the controller and `docker load` on the host; the
engine image's own `ornith-stack doctor --weights` on the snapshot; the compose project of profile cpu-demo
as a systemd unit, its containers (engine, exporter, Prometheus) running from the delivered images.

How the host reaches a Docker daemon: dockerd cannot run in this unprivileged container (this Docker cannot
grant --privileged), so the host gets this machine's daemon at /run/docker.sock, through
docker_gpu_stub.GpuStubSocket: every request passes through unchanged, except that a GPU request (`--gpus`,
compose's device reservations) is recorded and answered as NVIDIA's driver in the daemon answers it
(this daemon has none). The host's docker.service is a oneshot stand-in that checks that daemon answers (docker.socket is masked). The host
shares this machine's network (the exporter's and Hub's loopback ports are the same on both sides), and
its project and cache folders live under one temporary folder mounted at the same path, so the bind
mounts of the compose file mean the same on the host and on the daemon.

The engine image: the real cpu-demo image where this machine has it, else a stand-in built from
docker/engine.Dockerfile on the local Python base (ornith-stack and the entrypoint, no vLLM: its container
restarts after the entrypoint's checks). Either way the image is saved to an archive and removed from the
daemon before the play, so only the host's `docker load` can bring it back.
What cannot run without a GPU: the driver, the NVIDIA container toolkit and nvidia-ctk (see ansible/README.md).
The refusals that only read the host (no GPU, too little disk, the wrong architecture) run as local plays in the
fast tier (tests/unit/test_ansible_refusals.py); the ones here need this host's own apt sources, the Hub or Docker.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from containers import (
    exec_in,
    image_id,
    inspect,
    load_image,
    project_containers,
    remove_container,
    remove_image,
    run_detached,
    save_image,
)
from docker_gpu_stub import GpuStubSocket
from hf_server import HubServer
from images import SYSTEMD_HOST_RUN_OPTIONS, ensure_base_images, wait_for_systemd
from ports import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = ROOT / "ansible"
BIN = Path(sys.executable).parent
MODEL_REPO = "ornith-test/ornith-tiny"
DRAFT_REPO = "ornith-test/ornith-tiny-draft"
BIG_REPO = "ornith-test/big-blob"
PROFILE = "cpu-demo"
PROJECT = f"ornith-{PROFILE}"
ENGINE_IMAGE = "ornith-stack/vllm-cpu-demo:0.1.0"  # compose/cpu-demo.yml's engine
EXPORTER_IMAGE = "ornith-stack/exporter:0.1.0"
STANDIN_CACHE_TAG = "ornith-it/ansible-engine-standin:latest"
HF_PACKAGE = "huggingface_hub==2.4.0"  # the role's default model_weights_hf_package
SECRET = f"hf_ornithSecret{uuid.uuid4().hex}"  # HF_TOKEN of every run: must never show in output or ps
# The host installs hf offline from a wheelhouse made here: the same path an air-gapped host uses
# (model_weights_pip_env), and independent of the TLS interception in front of PyPI on this machine.
WHEELHOUSE = ROOT / ".cache" / "ansible-it" / "wheelhouse"
HOST_WHEELHOUSE = "/var/cache/ornith-wheelhouse"
# NVIDIA's own list file and keyring: a host set up by NVIDIA's guide (here with a local mirror).
NVIDIA_LIST = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
NVIDIA_LIST_LINE = (
    "deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg trusted=yes] "
    "file:/srv/nvidia-container-toolkit/$(ARCH) /\n"
)
# docker.service on the host: the machine's daemon answers through the mounted socket.
DOCKER_STANDIN_UNIT = """[Unit]
Description=Docker (this machine's daemon through /run/docker.sock; dockerd cannot run in this container)
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/docker version --format {{.Server.Version}}
[Install]
WantedBy=multi-user.target
"""


def _run(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess[str]:
    """Run argv; with `check`, a failure names the command and shows the end of what it printed."""
    done = subprocess.run(argv, check=False, text=True, capture_output=True, **kwargs)
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv[:4])} ... exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
        )
    return done


@pytest.fixture(scope="module")
def bases() -> dict[str, str]:
    return ensure_base_images("systemd-host", "python", "prometheus")


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
    with HubServer({MODEL_REPO: tiny_model, DRAFT_REPO: tiny_model, BIG_REPO: big_repo}, host="127.0.0.1") as server:
        yield server


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    """hf and its dependencies as wheels for the host's Python (3.11, same as this venv)."""
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    _run(
        str(BIN / "python"),
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "-d",
        str(WHEELHOUSE),
        HF_PACKAGE,
    )
    for stale in WHEELHOUSE.glob("ornith_stack-*.whl"):  # the host gets no ornith-stack at all
        stale.unlink()
    return WHEELHOUSE


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    """One folder mounted at the same path in the host: its bind mounts mean the same to the daemon."""
    path = Path(tempfile.mkdtemp(prefix="ornith-ansible-it-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def engine_archive(bases: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The engine image as a `docker save` archive, removed from the daemon: only the play can bring it back."""
    standin = not image_id(ENGINE_IMAGE)
    if standin:
        started = time.monotonic()
        _run(
            "docker",
            "build",
            "--quiet",
            "--file",
            "docker/engine.Dockerfile",
            "--tag",
            ENGINE_IMAGE,
            # A second tag keeps the layers (and so the build cache) when the test removes ENGINE_IMAGE.
            "--tag",
            STANDIN_CACHE_TAG,
            "--label",
            "org.ornith.standin=ansible-it",
            f"--build-arg=BASE_IMAGE={bases['python']}",
            "--build-arg=TRANSFORMERS_VERSION=",
            ".",
            cwd=ROOT,
            timeout=900,
        )
        print(f"stand-in engine image built in {time.monotonic() - started:.0f} s")
    archive = tmp_path_factory.mktemp("archives") / "engine.tar"
    save_image(ENGINE_IMAGE, archive)
    remove_image(ENGINE_IMAGE)  # untag only, also when a stopped container uses it
    try:
        yield archive
    finally:
        try:
            for container in project_containers(PROJECT):
                remove_container(container.id)
        finally:  # the image is put right even when a container could not be removed
            # The stand-in must not pass for the real cpu-demo image in other tests; a real one that another
            # run built meanwhile under the same tag stays.
            if standin and image_id(ENGINE_IMAGE) == image_id(STANDIN_CACHE_TAG):
                remove_image(ENGINE_IMAGE)
            elif not image_id(ENGINE_IMAGE):  # the real image: put it back if the play failed to
                load_image(archive)


@pytest.fixture(scope="module")
def gpu_stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuStubSocket]:
    """The host's Docker socket: this machine's daemon, with GPU requests answered (see the module doc)."""
    stub = GpuStubSocket(tmp_path_factory.mktemp("docker-gpu-stub") / "docker.sock")
    try:
        yield stub
    finally:
        stub.close()


@pytest.fixture(scope="module")
def host(bases: dict[str, str], wheelhouse: Path, shared: Path, gpu_stub: GpuStubSocket) -> Iterator[str]:
    name = f"ornith-it-{uuid.uuid4().hex[:8]}"
    # The flags scripts/make-base-images.sh documents for systemd as PID 1 here, plus the machine's network,
    # Docker socket and the shared folder (see the module doc).
    volumes = {
        **SYSTEMD_HOST_RUN_OPTIONS["volumes"],
        str(gpu_stub.path): {"bind": "/run/docker.sock", "mode": "rw"},
        str(shared): {"bind": str(shared), "mode": "rw"},
        str(wheelhouse): {"bind": HOST_WHEELHOUSE, "mode": "ro"},
    }
    run_detached(bases["systemd-host"], name, network_mode="host", **{**SYSTEMD_HOST_RUN_OPTIONS, "volumes": volumes})
    try:
        assert wait_for_systemd(name) in ("running", "degraded")
        setup = f"""set -e
            ln -s /dev/null /etc/systemd/system/docker.socket
            cat > /etc/systemd/system/docker.service <<'UNIT'
{DOCKER_STANDIN_UNIT}UNIT
            systemctl daemon-reload
            mkdir -p /srv/nvidia-container-toolkit/amd64 && cd /srv/nvidia-container-toolkit/amd64 && : > Packages
            printf 'Origin: mirror of NVIDIA libnvidia-container\\nDate: %s\\nSHA256:\\n %s 0 Packages\\n' \
              "$(date -Ru)" "$(sha256sum Packages | cut -d' ' -f1)" > Release
            : > /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
            printf '%s' '{NVIDIA_LIST_LINE}' > {NVIDIA_LIST}
        """
        exec_in(name, "bash", "-c", setup, check=True)
        yield name
    finally:
        remove_container(name)


@pytest.fixture(scope="module")
def ports() -> dict[str, int]:
    return {"engine": free_port(), "exporter": free_port(), "prometheus": free_port(), "alertmanager": free_port()}


@pytest.fixture(scope="module")
def inventory(
    host: str,
    hub: HubServer,
    shared: Path,
    ports: dict[str, int],
    bases: dict[str, str],
    engine_archive: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    path = tmp_path_factory.mktemp("inventory") / "hosts.yml"
    host_vars = {
        "ansible_connection": "community.docker.docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "nvidia_driver_gpu_expected": False,
        # Debian bookworm has no compose v2 package; compose v1 reads the generated cpu-demo file.
        "container_toolkit_docker_packages": ["docker.io", "docker-compose"],
        "ornith_service_compose_command": "/usr/bin/docker-compose",
        "ornith_service_project_dir": f"{shared}/opt",
        "ornith_service_hf_cache": f"{shared}/hf",
        "model_weights_hf_home": f"{shared}/hf",
        "model_weights_hf_endpoint": f"http://127.0.0.1:{hub.port}",
        "model_weights_pip_env": {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": HOST_WHEELHOUSE},
        # No GPU engine answers here: the unit starts, the health wait and the smoke test are skipped.
        "ornith_service_health_timeout": 0,
        "ornith_service_port": ports["engine"],
        "ornith_service_env": {
            "ORNITH_EXPORTER_PORT": ports["exporter"],
            "ORNITH_PROMETHEUS_PORT": ports["prometheus"],
            "ORNITH_PROMETHEUS_IMAGE": bases["prometheus"],
            # Debian's Alertmanager is in the same stand-in image (docker/base/prometheus.Dockerfile).
            "ORNITH_ALERTMANAGER_PORT": ports["alertmanager"],
            "ORNITH_ALERTMANAGER_IMAGE": bases["prometheus"],
            "ORNITH_MONITORING_UID": "990",  # the stand-in's prometheus user reads the login files
        },
        "ornith_service_image_cache_dir": str(tmp_path_factory.mktemp("image-cache")),
        "ornith_service_images": [EXPORTER_IMAGE, bases["prometheus"]],
        "ornith_service_image_archives": [str(engine_archive)],
        "monitoring_exporter_check_url": f"http://127.0.0.1:{ports['exporter']}/metrics",
    }
    path.write_text(json.dumps({"ornith": {"hosts": {host: host_vars}}}))
    return path


def _extra_vars(hub: HubServer, tmp: Path, **more: object) -> Path:
    """The profile and the tiny model with its stand-in draft, pinned to the served commit."""
    data = {
        "ornith_profile": PROFILE,
        "ornith_model_repo": MODEL_REPO,
        "ornith_model_revision": hub.repos[MODEL_REPO].commit,
        "ornith_draft_repo": DRAFT_REPO,
        "ornith_draft_revision": "main",
        # Engine, exporter, Prometheus and Alertmanager (no Grafana image on this machine).
        "ornith_service_compose_services": ["engine", "exporter", "prometheus", "alertmanager"],
        # This machine's free disk is not what these runs test (test_preflight_refuses_a_small_disk_... is):
        # 1 GB each for the weights (the tiny model, also where a test plays gpu96, whose 35B takes 73 GB),
        # the archives, the images and the headroom.
        "ornith_disk_weights_gb": 1,
        "ornith_disk_archives_gb": 1,
        "ornith_disk_images_gb": 1,
        "ornith_disk_headroom_gb": 1,
        **more,
    }
    path = tmp / f"extra-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(data))
    return path


def _playbook(
    inventory: Path,
    extra: Path,
    *args: str,
    playbook: str = "provision-gpu-host.yml",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    full_env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
        PATH=f"{BIN}:{os.environ['PATH']}",
        HF_TOKEN=SECRET,
        ORNITH_PYTHON_BASE_IMAGE=ensure_base_images("python")["python"],
        # The session's HOME is a folder of its own (tests/conftest.py); Ansible's async wrapper and its status
        # poll each expand `~/.ansible_async` their own way (the shell's $HOME, the user's passwd entry), so
        # the build started with `async` was then "could not find job". One absolute folder serves both.
        ANSIBLE_ASYNC_DIR=str(Path(os.environ["HOME"]) / ".ansible_async"),
        **(env or {}),
    )
    full_env.pop("ORNITH_ENGINE_BASE_IMAGE", None)
    return _run(
        str(BIN / "ansible-playbook"),
        "-i",
        str(inventory),
        playbook,
        "-e",
        f"@{extra}",
        *args,
        check=False,
        cwd=ANSIBLE_DIR,
        env=full_env,
        timeout=1500,
    )


def _recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    match = re.search(r"^\S+\s+:\s+(ok=.*)$", result.stdout, re.MULTILINE)
    assert match, result.stdout[-3000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


@pytest.fixture(scope="module")
def check_run_on_fresh_host(inventory: Path, hub: HubServer, host: str, tmp_path_factory: pytest.TempPathFactory):
    """--check before anything is installed: must get through without failing and change nothing."""
    result = _playbook(inventory, _extra_vars(hub, tmp_path_factory.mktemp("extra")), "--check")
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    for probe in (["dpkg-query", "-W", "docker.io"], ["test", "-e", "/opt/ornith-stack"]):
        assert exec_in(host, *probe)[0] != 0, f"--check changed the host: {probe}"
    assert not image_id(ENGINE_IMAGE), "--check loaded the engine image"
    return result


@pytest.fixture(scope="module")
def first_run(
    check_run_on_fresh_host, inventory: Path, hub: HubServer, host: str, tmp_path_factory: pytest.TempPathFactory
):
    # Nothing of ours on the host before: no checkout, no ornith-stack, no engine image on the daemon.
    assert exec_in(host, "python3", "-c", "import ornith_stack")[0] != 0
    assert not image_id(ENGINE_IMAGE)
    started = time.monotonic()
    result = _playbook(inventory, _extra_vars(hub, tmp_path_factory.mktemp("extra")))
    print(f"first run: {time.monotonic() - started:.0f} s")
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
    return result


@pytest.fixture(scope="module")
def testinfra_host(host: str, first_run):
    import testinfra

    return testinfra.get_host(f"docker://{host}")


def _container(service: str) -> dict:
    ids = [container.short_id for container in project_containers(PROJECT, service)]
    assert len(ids) == 1, (service, ids)
    return inspect(ids[0])


def test_check_mode_on_a_fresh_host_reports_changes_and_installs_nothing(check_run_on_fresh_host, first_run) -> None:
    # What would change is reported; the fixture checked right after the run that nothing was installed.
    assert _recap(check_run_on_fresh_host)["changed"] > 0


def test_the_stack_runs_from_the_images_the_play_delivered(
    first_run, engine_archive: Path, ports: dict[str, int], host: str, shared: Path
) -> None:
    """The engine image was only in the archive: the host's `docker load` brought it back, the unit ran it."""
    manifest = json.loads(_run("tar", "-xOf", str(engine_archive), "manifest.json").stdout)
    delivered = "sha256:" + manifest[0]["Config"].split("/")[-1].removesuffix(".json")
    engine = _container("engine")
    assert engine["Image"] == delivered
    assert image_id(ENGINE_IMAGE) == delivered
    assert re.search(r"changed: \[[^\]]+\] => \(item=\S*/images/engine\.tar\)", first_run.stdout), first_run.stdout[
        -6000:
    ]
    # Loaded, then removed from the host: only the record of what was loaded stays.
    assert sorted(p.name for p in (shared / "opt" / "images").iterdir()) == ["loaded.txt"]
    assert f"engine.tar {engine_archive.stat().st_size} " in (shared / "opt" / "images" / "loaded.txt").read_text()
    # The engine loads what was provisioned, offline.
    env = dict(item.partition("=")[::2] for item in engine["Config"]["Env"])  # "HF_TOKEN" alone: unset
    assert env["HF_HUB_OFFLINE"] == "1"
    for service, image in (("exporter", EXPORTER_IMAGE), ("prometheus", None)):
        state = _container(service)
        assert state["State"]["Running"], (service, state["State"])
        if image:
            assert state["Image"] == image_id(image)
    # The exporter (a delivered image) answers on the machine's loopback; the engine is not up (no vLLM/GPU).
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{ports['exporter']}/metrics", timeout=10).read().decode()
    assert re.search(r'^ornith_engine_up\{[^}]*profile="cpu-demo"[^}]*\} ', metrics, re.MULTILINE), metrics[:2000]
    # Prometheus started on the configuration the monitoring role placed, not on an empty folder.
    config = json.loads(
        urllib.request.urlopen(f"http://127.0.0.1:{ports['prometheus']}/api/v1/status/config", timeout=10).read()
    )["data"]["yaml"]
    assert "ornith" in config, config[:2000]


def test_the_host_has_no_checkout_and_no_ornith_stack(testinfra_host, shared: Path) -> None:
    assert testinfra_host.run("python3 -c 'import ornith_stack'").rc != 0
    assert not testinfra_host.exists("ornith-stack")
    assert not testinfra_host.file(f"{shared}/opt/src").exists
    assert not testinfra_host.file(f"{shared}/opt/docker").exists
    assert not testinfra_host.file(f"{shared}/opt/pyproject.toml").exists


def test_first_run_downloads_the_model_and_draft_through_the_hf_client(
    first_run, hub: HubServer, tiny_model: Path
) -> None:
    served = {p.name for p in tiny_model.iterdir() if p.is_file()}
    # Both repositories share the folder, so each file is sent once per repository.
    assert sorted(hub.downloads) == sorted([*served, *served])


def test_docker_is_installed_and_nvidia_s_apt_source_stays_healthy(testinfra_host) -> None:
    assert testinfra_host.package("docker.io").is_installed
    assert testinfra_host.service("docker").is_enabled
    assert testinfra_host.file(NVIDIA_LIST).content_string == NVIDIA_LIST_LINE
    lists = testinfra_host.check_output("grep -rl libnvidia-container /etc/apt/sources.list.d/ || true")
    assert lists.split() == []  # the local mirror is the only NVIDIA source; nothing was added
    update = testinfra_host.run("apt-get update")
    assert update.rc == 0, update.stderr
    assert "Conflicting values" not in update.stdout + update.stderr


def test_the_snapshot_holds_the_served_files_at_the_pinned_commit(
    testinfra_host, hub: HubServer, tiny_model: Path, shared: Path
) -> None:
    hf_home = f"{shared}/hf"
    commit = hub.repos[MODEL_REPO].commit
    snapshot = f"{hf_home}/hub/models--ornith-test--ornith-tiny/snapshots/{commit}"
    for path in tiny_model.iterdir():
        remote = testinfra_host.file(f"{snapshot}/{path.name}")
        assert remote.exists, path.name
        assert remote.size == path.stat().st_size
    # The draft's branch was resolved to the same content's commit and recorded as refs/main.
    ref = testinfra_host.file(f"{hf_home}/hub/models--ornith-test--ornith-tiny-draft/refs/main")
    assert ref.content_string.strip() == hub.repos[DRAFT_REPO].commit


def test_hf_cli_lives_in_its_own_virtualenv(testinfra_host) -> None:
    version = testinfra_host.check_output("/opt/ornith-stack/hf-venv/bin/hf version")
    assert "2.4.0" in version
    assert not testinfra_host.exists("hf")  # not on the system PATH


def test_the_engine_image_s_doctor_checked_the_model(testinfra_host, hub: HubServer, tiny_model: Path) -> None:
    commit = hub.repos[MODEL_REPO].commit
    report = testinfra_host.file(f"/var/lib/ornith/reports/ornith-test--ornith-tiny@{commit}.doctor.txt")
    assert report.exists
    tensors = len(json.loads((tiny_model / "model.safetensors.index.json").read_text())["weight_map"])
    assert f"ok  checkpoint: {tensors} tensors" in report.content_string
    assert report.content_string.rstrip().endswith("ready: profile cpu-demo")


def test_compose_project_is_a_systemd_unit_pinned_to_the_downloaded_commit(
    testinfra_host, hub: HubServer, shared: Path
) -> None:
    unit = testinfra_host.check_output(f"systemctl cat {PROJECT}.service")
    assert "Requires=docker.service" in unit
    assert (
        f"ExecStart=/usr/bin/docker-compose --project-name {PROJECT} --file {shared}/opt/compose/cpu-demo.yml "
        "up --detach --remove-orphans engine exporter prometheus alertmanager"
    ) in unit
    assert testinfra_host.service(PROJECT).is_enabled
    compose = testinfra_host.file(f"{shared}/opt/compose/cpu-demo.yml").content_string
    assert compose == (ROOT / "compose/cpu-demo.yml").read_text()
    env = testinfra_host.file(f"{shared}/opt/compose/.env")
    assert env.mode == 0o600
    assert f"ORNITH_HF_CACHE={shared}/hf" in env.content_string
    assert "HF_HUB_OFFLINE=1" in env.content_string.splitlines()
    assert f"ORNITH_EXTRA_ARGS=--revision {hub.repos[MODEL_REPO].commit}" in env.content_string.splitlines()
    assert SECRET not in env.content_string


def test_second_run_changes_nothing_and_never_shows_the_token(
    first_run, inventory: Path, hub: HubServer, host: str, testinfra_host, tmp_path: Path
) -> None:
    """-vvv output and every process's command line, on the host and here, polled during the whole run."""
    seen: list[str] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            seen.append(exec_in(host, "ps", "-eo", "args")[1])
            seen.append(_run("ps", "-eo", "args", check=False).stdout)
            time.sleep(0.2)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    downloads_before = len(hub.downloads)
    try:
        result = _playbook(inventory, _extra_vars(hub, tmp_path), "-vvv")
    finally:
        done.set()
        watcher.join()
    assert result.returncode == 0, result.stdout[-4000:]
    assert _recap(result)["changed"] == 0, result.stdout[-6000:]
    assert len(hub.downloads) == downloads_before
    assert len(seen) > 20 and any("ansible" in snapshot.lower() for snapshot in seen)
    assert SECRET not in result.stdout + result.stderr
    assert not [snapshot for snapshot in seen if SECRET in snapshot]
    token = testinfra_host.file("/etc/ornith/hf-token")
    assert token.mode == 0o600 and token.user == "root"


def test_check_mode_on_the_provisioned_host_reports_no_change(
    first_run, inventory: Path, hub: HubServer, tmp_path: Path
) -> None:
    result = _playbook(inventory, _extra_vars(hub, tmp_path), "--check")
    assert result.returncode == 0, result.stdout[-4000:]
    assert _recap(result)["changed"] == 0, result.stdout[-6000:]


def test_too_little_disk_fails_before_downloading(
    first_run, inventory: Path, hub: HubServer, host: str, shared: Path, tmp_path: Path
) -> None:
    downloads_before = len(hub.downloads)
    extra = _extra_vars(
        hub, tmp_path, model_weights_hf_home=f"{shared}/hf-small", model_weights_free_disk_margin_gb=10_000_000
    )
    result = _playbook(inventory, extra, "--tags", "weights")
    assert result.returncode != 0
    assert "Not enough free disk" in result.stdout
    # The message carries the numbers: what is missing, the margin, what is needed and what is free.
    assert re.search(
        r"GB still to download .* \+ 10000000(\.0)? GB margin = [\d.]+ GB needed, [\d.]+ GB free",
        result.stdout.replace("\n", " "),
    ), result.stdout[-3000:]
    assert len(hub.downloads) == downloads_before
    assert not (shared / "hf-small").exists() or not list((shared / "hf-small").rglob("blobs/*"))


def test_a_conflicting_nvidia_apt_source_is_refused_before_any_change(
    first_run, inventory: Path, hub: HubServer, host: str, tmp_path: Path
) -> None:
    extra_list = "/etc/apt/sources.list.d/libnvidia-container.list"
    exec_in(
        host,
        "sh",
        "-c",
        f"echo 'deb [signed-by=/etc/apt/keyrings/other.asc] https://nvidia.github.io/libnvidia-container/stable/deb/amd64 /'"
        f" > {extra_list}",
        check=True,
    )
    try:
        result = _playbook(inventory, _extra_vars(hub, tmp_path), "--tags", "docker")
    finally:
        exec_in(host, "rm", "-f", extra_list, check=True)
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert f"outside NVIDIA's own list file {NVIDIA_LIST}: {extra_list}" in text, text[-3000:]
    assert "Remove those files" in text
    assert _recap(result)["changed"] == 0


def test_an_unpullable_base_image_fails_with_the_tag_to_set(
    first_run, inventory: Path, hub: HubServer, tmp_path: Path
) -> None:
    """gpu96's engine image is built from lmsysorg/sglang:v0.5.17-cu129, which cannot be pulled here."""
    engine = "ornith-stack/sglang:0.5.17"
    if image_id(engine):
        pytest.skip(f"{engine} exists on this machine: nothing to build")
    extra = _extra_vars(
        hub,
        tmp_path,
        ornith_profile="gpu96",
        ornith_service_images=[engine],
        ornith_service_image_archives=[],
        ornith_service_image_pull_timeout=120,
    )
    result = _playbook(inventory, extra, "--tags", "service")
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert "Cannot pull the base image lmsysorg/sglang:v0.5.17-cu129" in text, text[-3000:]
    assert "set ORNITH_ENGINE_BASE_IMAGE=lmsysorg/sglang:v0.5.17 on the controller" in text


def test_an_interrupted_download_resumes_where_it_stopped(
    first_run, inventory: Path, hub: HubServer, host: str, big_repo: Path, shared: Path, tmp_path: Path
) -> None:
    """The connection drops halfway through a file: the client asks for the rest with a Range request.

    huggingface_hub 2.4 resumes within a run from the last full 10 MiB chunk it received; across runs the
    unit is the file (finished files stay in the cache, a rerun fetches only the missing ones, as
    test_second_run_changes_nothing_and_never_shows_the_token shows).
    """
    blob = big_repo / "blob.bin"
    hub.interrupt_next(blob.name)
    hf_home = f"{shared}/hf-resume"
    extra = _extra_vars(
        hub, tmp_path, model_weights_hf_home=hf_home, model_weights_repos=[{"repo": BIG_REPO, "revision": "main"}]
    )
    result = _playbook(inventory, extra, "--tags", "weights")
    assert result.returncode == 0, result.stdout[-4000:]
    assert (blob.name, 10 * 1024 * 1024) in hub.ranges  # resumed after the first full chunk
    cached = f"{hf_home}/hub/models--ornith-test--big-blob/blobs/{hub.repos[BIG_REPO].blob_ids[blob.name]}"
    done = exec_in(host, "sha256sum", cached, check=True)[1].split()[0]
    assert done == hashlib.sha256(blob.read_bytes()).hexdigest()


def test_the_doctor_step_asks_for_the_gpus_the_service_reserves(
    first_run, inventory: Path, hub: HubServer, host: str, gpu_stub: GpuStubSocket, tmp_path: Path
) -> None:
    """gpu96's doctor step as a GPU host runs it: the daemon gets the engine service's own device request.

    The doctor runs from the delivered cpu-demo image (gpu96's image cannot be built here) on the tiny model;
    what matters is the `docker run` the host sends. Without the request NVML would be missing in the doctor.
    """
    compose = yaml.safe_load((ROOT / "compose" / "gpu96.yml").read_text())
    reserved = compose["services"]["engine"]["deploy"]["resources"]["reservations"]["devices"]
    before = len(gpu_stub.requests)
    report_dir = f"/var/lib/ornith/reports-gpu-{uuid.uuid4().hex[:6]}"  # a new report: the doctor runs again
    extra = _extra_vars(
        hub,
        tmp_path,
        ornith_profile="gpu96",
        ornith_service_engine_image=ENGINE_IMAGE,
        ornith_service_report_dir=report_dir,
    )
    result = _playbook(inventory, extra, "--tags", "weights,doctor")
    assert result.returncode == 0, result.stdout[-6000:]
    assert "ready: profile gpu96" in result.stdout, result.stdout[-6000:]
    asked = gpu_stub.requests[before:]
    assert [image for image, _ in asked] == [ENGINE_IMAGE], result.stdout[-6000:]
    expected = [(d["driver"], d["count"], set(d["capabilities"])) for d in reserved]
    assert [(r["Driver"], r["Count"], set(r["Capabilities"][0])) for r in asked[0][1]] == expected
    assert (
        exec_in(
            host,
            "test",
            "-s",
            f"{report_dir}/{MODEL_REPO.replace('/', '--')}@{hub.repos[MODEL_REPO].commit}.doctor.txt",
        )[0]
        == 0
    )


def test_an_exporter_only_change_leaves_the_engine_running(
    first_run, inventory: Path, hub: HubServer, ports: dict[str, int], bases: dict[str, str], tmp_path: Path
) -> None:
    """A new exporter port in .env, and on the controller an exporter image left by an older checkout: the play
    builds the image again from this checkout and delivers it, compose recreates the exporter from it, and
    the engine container is the same one."""
    engine_before = _container("engine")["Id"]
    exporter_before = _container("exporter")["Id"]
    current = image_id(EXPORTER_IMAGE)
    _run("docker", "tag", bases["python"], EXPORTER_IMAGE)  # what an older checkout built, under the same tag
    port = free_port()
    env = {
        "ORNITH_EXPORTER_PORT": port,
        "ORNITH_PROMETHEUS_PORT": ports["prometheus"],
        "ORNITH_PROMETHEUS_IMAGE": bases["prometheus"],
        "ORNITH_ALERTMANAGER_PORT": ports["alertmanager"],
        "ORNITH_ALERTMANAGER_IMAGE": bases["prometheus"],
        "ORNITH_MONITORING_UID": "990",
    }
    extra = _extra_vars(
        hub,
        tmp_path,
        ornith_service_env=env,
        monitoring_exporter_check_url=f"http://127.0.0.1:{port}/metrics",
    )
    result = _playbook(inventory, extra)
    assert result.returncode == 0, result.stdout[-6000:]
    assert "RUNNING HANDLER [ornith_service : Apply the change to the Ornith compose project]" in result.stdout
    assert _container("engine")["Id"] == engine_before
    assert _container("exporter")["Id"] != exporter_before
    # Built again (every layer from the cache, so the very image this checkout made before), and running.
    assert image_id(EXPORTER_IMAGE) == current and _container("exporter")["Image"] == current
    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
