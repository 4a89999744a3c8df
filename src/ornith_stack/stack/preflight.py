"""What must hold before `up` changes anything: each failure is one UserError line naming the fix.

Checks, in order: the doctor (it picks the profile for `auto` and plans it on the GPUs it finds), the
API's exposure (no key, no address beyond loopback), Docker reachable, Compose v2, the NVIDIA runtime
for GPU profiles, free disk for the weights and the images (planner/disk.py, the estimate the Ansible
preflight checks too).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ornith_stack.deployment import GRAFANA_PORT
from ornith_stack.doctor import Options, diagnose
from ornith_stack.errors import UserError
from ornith_stack.generate.core import find_root
from ornith_stack.generate.profile_files import save_computed
from ornith_stack.planner.disk import DISK_MARGIN, GIB, disk_need
from ornith_stack.profiles import load_profile, user_profile_dir
from ornith_stack.profiles.model import Profile
from ornith_stack.stack.shell import Runner, first_line
from ornith_stack.urls import is_loopback

DiskUsage = Callable[[Path], Any]  # shutil.disk_usage: .free in bytes


@dataclass(frozen=True)
class Ready:
    """What preflight found: the profile to start (and why, for `auto`) and the Docker facts later steps use."""

    profile: Profile
    reason: str | None
    docker_root: Path
    compose_version: str


def choose_profile(name: str, root: Path | None = None) -> tuple[Profile, str | None]:
    """The doctor's verdict on this machine; a problem is the first FAIL line with how to see the rest."""
    report = diagnose(Options(profile=name))
    if report.profile is None:
        raise UserError(f"no profile fits this machine ({report.profile_reason}); `ornith-stack profiles` "
                        "lists them, `ornith-stack up NAME` picks one")
    if report.computed is not None and report.ready:
        # auto computed the profile for this host: save it as `profiles new` would, then start it.
        layout = report.computed
        folder = user_profile_dir(to_write=True)
        folder.mkdir(parents=True, exist_ok=True)
        command = f"ornith-stack profiles new {layout.profile.name} --gpu {layout.gpu.key} --count {layout.count}"
        save_computed(layout, folder, root or find_root(), command)
        return load_profile(layout.profile.name), report.profile_reason
    if not report.ready:
        problem = report.problems[0]
        fix = ("run it on a machine with the GPUs it names, or `ornith-stack up cpu-demo` to try the stack "
               "without a GPU" if problem.topic == "gpu" else f"`ornith-stack doctor --profile {report.profile}` "
               "shows every check")
        raise UserError(f"preflight: {report.profile}: {problem.topic}: {problem.message}. Fix: {fix}")
    return load_profile(report.profile), report.profile_reason


def check_exposure(bind: str, has_key: bool) -> None:
    """No key, no network: without ORNITH_API_KEY the API may only be published on loopback."""
    if not has_key and not is_loopback(bind):
        raise UserError(f"ORNITH_BIND={bind} would publish an unauthenticated API beyond this machine: keep "
                        "ORNITH_BIND=127.0.0.1, or drop --no-api-key so that `up` sets ORNITH_API_KEY")


def check_monitoring_exposure(bind: str, has_password: bool) -> None:
    """No password, no network: Prometheus, Alertmanager and Grafana leave loopback only behind their login
    (ORNITH_MONITORING_PASSWORD); the exporter never does."""
    if not has_password and not is_loopback(bind):
        raise UserError(f"ORNITH_MONITORING_BIND={bind} would publish Prometheus, Alertmanager and Grafana without "
                        "a login (anyone could silence alerts): set ORNITH_MONITORING_PASSWORD, or keep it 127.0.0.1 "
                        f"and reach them through an SSH tunnel (ssh -L {GRAFANA_PORT}:127.0.0.1:{GRAFANA_PORT} HOST)")


def docker_info(run: Runner) -> dict[str, Any]:
    """`docker info` as JSON; an unreachable daemon or a missing CLI is the error."""
    result = run(["docker", "info", "--format", "{{json .}}"])
    if result.returncode == 127:
        raise UserError("docker is not installed: install Docker Engine (https://docs.docker.com/engine/install/), "
                        "then run `ornith-stack up` again")
    if result.returncode != 0 or "Cannot connect to the Docker daemon" in result.stderr:
        line = first_line(result)
        fix = ("add your user to the docker group (`sudo usermod -aG docker $USER`, then log in again)"
               if "permission denied" in line.lower() else
               "start it (`sudo systemctl start docker`) or point DOCKER_HOST at a running daemon")
        raise UserError(f"Docker is not reachable ({line}): {fix}")
    try:
        info = json.loads(result.stdout)
    except ValueError:
        raise UserError(f"`docker info` did not answer JSON ({first_line(result)}): is `docker` Docker's CLI?") from None
    if not isinstance(info, dict):
        raise UserError("`docker info` did not answer a JSON object: is `docker` Docker's CLI?")
    return info


def compose_version(run: Runner) -> str:
    """The Compose v2 plugin's version (`docker compose version`); v1 (`docker-compose`) is not enough."""
    result = run(["docker", "compose", "version"])
    match = re.search(r"version v?(\d+)\.(\d+)\S*", result.stdout)
    if result.returncode == 0 and match and int(match[1]) >= 2:
        return match[0].split()[-1]
    v1 = run(["docker-compose", "version"])
    found = re.search(r"docker-compose version (\S+?),", v1.stdout) if v1.returncode == 0 else None
    have = f"only docker-compose {found[1]} (Compose v1) is installed" if found else (
        f"`docker compose version` failed ({first_line(result)})")
    raise UserError(f"Compose v2 is needed and {have}: install Docker's docker-compose-plugin package, or put the "
                    "Compose v2 binary at /usr/libexec/docker/cli-plugins/docker-compose")


def check_nvidia_runtime(profile: Profile, info: dict[str, Any]) -> None:
    """GPU profiles reserve GPUs through the NVIDIA container runtime; Docker must list it."""
    if profile.hardware.gpu is None:
        return
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    if "nvidia" not in runtimes:
        raise UserError(f"Docker has no NVIDIA runtime (runtimes: {', '.join(runtimes) or 'none'}), so profile "
                        f"{profile.name!r} cannot reach its GPUs: install nvidia-container-toolkit, then "
                        "`sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker`")


def check_disk(needs: dict[Path, int], usage: DiskUsage = shutil.disk_usage) -> None:
    """Each folder's filesystem must hold what goes there plus DISK_MARGIN (folders on one filesystem add up)."""
    by_device: dict[int, tuple[Path, int, int]] = {}
    for folder, need in needs.items():
        where = _existing(folder)
        device = where.stat().st_dev
        _, total, _ = by_device.get(device, (where, 0, 0))
        by_device[device] = (where, total + need, 0)
    for where, need, _ in by_device.values():
        free = int(usage(where).free)
        if free < need + DISK_MARGIN:
            raise UserError(f"{where} has {free / GIB:.1f} GiB free; the weights and images need {need / GIB:.1f} "
                            f"GiB plus {DISK_MARGIN / GIB:.0f} GiB to spare: free space there (`docker system prune`"
                            " removes unused images), or set ORNITH_HF_CACHE to a larger disk")


def _existing(folder: Path) -> Path:
    """The folder, or its nearest existing parent (where it will be created)."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return candidate
    return Path("/")


def preflight(name: str, run: Runner, bind: str, has_key: bool, hf_cache: Path,
              usage: DiskUsage = shutil.disk_usage, root: Path | None = None,
              monitoring_bind: str = "127.0.0.1", monitoring_password: bool = False) -> Ready:
    """Every check, before anything is written, pulled, built or started. `monitoring_password`: the
    monitoring services will ask for one (`up` makes one beyond loopback)."""
    profile, reason = choose_profile(name, root)
    check_exposure(bind, has_key)
    check_monitoring_exposure(monitoring_bind, monitoring_password)
    info = docker_info(run)
    version = compose_version(run)
    check_nvidia_runtime(profile, info)
    docker_root = Path(str(info.get("DockerRootDir") or "/var/lib/docker"))
    need = disk_need(profile)
    check_disk({hf_cache: need.weights, docker_root: need.images}, usage)
    return Ready(profile, reason, docker_root, version)
