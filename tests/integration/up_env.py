"""The environment `ornith-stack up` runs in for the integration tests: the local images in place of those
that cannot be pulled here, free loopback ports, none of the caller's ORNITH_* settings; and the two-replica
layout those tests start (cpu-demo with `serve.replicas: 2` as an operator profile, its compose file in the
checkout's compose/)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from containers import remove_image
from images import ensure_base_images
from ports import free_port

from ornith_stack.generate.core import render
from ornith_stack.generate.profile_files import operator_files
from ornith_stack.profiles import load_profile
from ornith_stack.stack.compose import Stack
from ornith_stack.stack.rolling import state_path

PUBLISHED = ("ENGINE", "EXPORTER", "PROMETHEUS", "GRAFANA", "ALERTMANAGER")
REPO = Path(__file__).resolve().parents[2]
ENV_FILE = REPO / "compose" / ".env"  # where `up` keeps the key unless told otherwise


@contextmanager
def up_environment(tag: str) -> Iterator[dict[str, str]]:
    """The variables for `up` (the local Python base and Prometheus, a stand-in Grafana tagged `tag`, each
    published port free); the stand-in is removed afterwards. Skips without Compose v2."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode != 0:
        pytest.skip("Compose v2 (`docker compose`) is not installed: run scripts/install-compose-v2.sh")
    bases = ensure_base_images("python", "prometheus")
    # Grafana cannot be pulled here and Debian has none: a page on :3000 lets every service start.
    grafana = f"ornith-it/grafana-standin:{tag}"
    subprocess.run(["docker", "build", "-q", "-t", grafana, "-"], check=True, capture_output=True, text=True,
                   input=f'FROM {bases["python"]}\nCMD ["python3", "-m", "http.server", "3000", "-d", "/tmp"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORNITH_", "GRAFANA_", "HF_TOKEN"))}
    env.update(ORNITH_PYTHON_BASE_IMAGE=bases["python"], ORNITH_PROMETHEUS_IMAGE=bases["prometheus"],
               ORNITH_ALERTMANAGER_IMAGE=bases["prometheus"], ORNITH_GRAFANA_IMAGE=grafana,
               ORNITH_MONITORING_UID="990")  # the stand-in's prometheus user reads the login files
    env.update({f"ORNITH_{name}_PORT": str(free_port()) for name in PUBLISHED})
    try:
        yield env
    finally:
        remove_image(grafana)


def ornith(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ornith_stack.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def write_replica_profile(folder: Path, name: str, made_by: str, args: dict[str, Any] | None = None) -> Path:
    """cpu-demo as two replicas in the operator's profile folder `folder` (with `args` over its flags); its
    compose file written into the checkout's compose/ by the same function `profiles new` uses. The engines
    float over the cores (VLLM_CPU_OMP_THREADS_BIND=nobind: pinned, both would take the first core, see
    test_gateway.py) and keep a small context (max-model-len 1024)."""
    data = load_profile("cpu-demo").model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    data["name"] = name
    data["engine"] = {"kind": data["engine"]["kind"], "version": data["engine"]["version"]}
    data["serve"]["replicas"] = 2
    data["serve"]["args"]["max-model-len"] = 1024
    data["serve"]["args"].update(args or {})
    data["serve"]["env"]["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    os.environ["ORNITH_PROFILE_DIR"] = str(folder)  # load_profile below and the CLI read the same folder
    try:
        files = [f for f in operator_files(load_profile(name), path, made_by) if f.path == f"compose/{name}.yml"]
        render(REPO, files)
    finally:
        del os.environ["ORNITH_PROFILE_DIR"]
    return path


@contextmanager
def replica_stack(name: str, project: str, made_by: str, folder: Path, kept: Path) -> Iterator[dict[str, str]]:
    """The environment of `up` for the two-replica profile `name` (written into `folder`) under `project`; a
    developer's own compose/.env is set aside in `kept` meanwhile. Afterwards the project is down with its
    volumes, and the compose file and the test's env file are gone."""
    compose_file = REPO / "compose" / f"{name}.yml"
    with up_environment(f"{project}") as env, env_file_set_aside(kept):
        write_replica_profile(folder, name, made_by)
        env["ORNITH_PROFILE_DIR"] = str(folder)
        try:
            yield env
        finally:
            subprocess.run(["docker", "compose", "-p", project, "-f", str(compose_file), "down", "--volumes",
                            "--remove-orphans"], capture_output=True, check=False, timeout=300)
            compose_file.unlink(missing_ok=True)
            state_path(Stack(name, project, compose_file, ENV_FILE)).unlink(missing_ok=True)


@contextmanager
def env_file_set_aside(kept: Path) -> Iterator[None]:
    """A developer's own compose/.env moved to `kept` meanwhile, and put back; the test's own removed."""
    if ENV_FILE.exists():
        shutil.move(ENV_FILE, kept)
    try:
        yield
    finally:
        ENV_FILE.unlink(missing_ok=True)
        if kept.exists():
            shutil.move(kept, ENV_FILE)
