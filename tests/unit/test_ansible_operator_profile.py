"""An operator's profile (`ornith-stack profiles new`) deployed by Ansible to another host: the compose file it
wrote names the profile's path on the controller, which does not exist on the host (Docker would mount an empty
folder in its place). ornith_service copies the file beside the compose project and points the compose
variable at the copy; `docker compose config` (Compose v2's own parser) then mounts the copy, and the doctor's
`docker run` arguments mount it too. The role's tasks run here with ansible-playbook on localhost."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ornith_stack import deployment
from ornith_stack.cli import main

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = ROOT / "ansible"
BIN = Path(sys.executable).parent
NAME = "h100-sxmx2"


@pytest.fixture(scope="module")
def delivered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not (BIN / "ansible-playbook").exists():
        pytest.skip("ansible-playbook is not installed (pip install -e '.[dev]')")
    tmp = tmp_path_factory.mktemp("operator")
    with pytest.MonkeyPatch.context() as patch:  # the operator's folder of this module, never ~/.config
        (tmp / "controller-profiles").mkdir()
        patch.setenv("ORNITH_PROFILE_DIR", str(tmp / "controller-profiles"))
        yield _deliver(tmp)


def _deliver(tmp: Path) -> dict[str, Any]:
    checkout = tmp / "checkout"
    assert main(["profiles", "new", NAME, "--gpu", "h100-sxm", "--count", "2", "--out", str(checkout)]) == 0
    host = tmp / "host"
    play = [{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars_files": [str(checkout / "ansible" / "profiles" / f"{NAME}.yml")],
        "vars": {"ansible_python_interpreter": sys.executable, "ornith_service_project_dir": str(host),
                 "ornith_service_compose_src": str(checkout / "compose" / f"{NAME}.yml"),
                 "ornith_service_start": False, "ornith_service_offline": False},
        "tasks": [
            {"ansible.builtin.file": {"path": f"{host}/{d}", "state": "directory", "mode": "0755"}}
            for d in ("profiles", "compose")
        ] + [
            {"ansible.builtin.include_role": {"name": "ornith_service", "tasks_from": "profile.yml", "public": True}},
            {"ansible.builtin.template": {"src": str(ANSIBLE_DIR / "roles/ornith_service/templates/env.j2"),
                                          "dest": f"{host}/compose/.env", "mode": "0600"}},
            {"ansible.builtin.copy": {"content": "{{ __ornith_service_profile_args | to_json }}",
                                      "dest": f"{host}/doctor-args.json", "mode": "0644"}},
        ],
    }]
    (tmp / "play.yml").write_text(json.dumps(play))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ANSIBLE_DIR / "roles"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0", PATH=f"{BIN}:{os.environ['PATH']}")
    result = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(tmp / "play.yml")], env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    profile_vars = yaml.safe_load((checkout / "ansible" / "profiles" / f"{NAME}.yml").read_text())
    return {"checkout": checkout, "host": host, "vars": profile_vars}


def test_the_generated_variables_name_the_profile_file_and_how_compose_mounts_it(delivered: dict) -> None:
    names = delivered["vars"]
    assert names["ornith_profile_file"] == str(delivered["checkout"].parent / "controller-profiles" / f"{NAME}.yaml")
    assert names["ornith_profile_file_variable"] == deployment.PROFILE_FILE_VARIABLE
    assert names["ornith_container_profile_dir"] == deployment.CONTAINER_PROFILE_DIR


def test_the_host_gets_a_copy_and_the_env_file_points_compose_at_it(delivered: dict) -> None:
    host, controller_file = delivered["host"], Path(delivered["vars"]["ornith_profile_file"])
    copy = host / "profiles" / f"{NAME}.yaml"
    assert copy.read_bytes() == controller_file.read_bytes()
    env = (host / "compose" / ".env").read_text().splitlines()
    assert f"{deployment.PROFILE_FILE_VARIABLE}={copy}" in env


def test_compose_mounts_the_hosts_copy_and_so_does_the_doctor(delivered: dict) -> None:
    if shutil.which("docker") is None or subprocess.run(["docker", "compose", "version"], capture_output=True,
                                                        check=False).returncode != 0:
        pytest.skip("Compose v2 (`docker compose`) is not installed: run scripts/install-compose-v2.sh")
    host, checkout = delivered["host"], delivered["checkout"]
    copy = host / "profiles" / f"{NAME}.yaml"
    compose_file = host / "compose" / f"{NAME}.yml"
    shutil.copy(checkout / "compose" / f"{NAME}.yml", compose_file)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORNITH_")}
    config = subprocess.run(["docker", "compose", "--env-file", str(host / "compose" / ".env"), "-f", str(compose_file),
                             "config", "--format", "json"], env=env, capture_output=True, text=True, timeout=60,
                            check=True)  # fmt: skip
    services = json.loads(config.stdout)["services"]
    target = f"{deployment.CONTAINER_PROFILE_DIR}/{NAME}.yaml"
    mounted = {name: [v["source"] for v in svc.get("volumes", []) if v.get("target") == target]
               for name, svc in services.items() if name.startswith("engine") or name == "exporter"}
    assert mounted and all(sources == [str(copy)] for sources in mounted.values()), mounted
    args = json.loads((host / "doctor-args.json").read_text())
    assert args == ["--env", f"ORNITH_PROFILE_DIR={deployment.CONTAINER_PROFILE_DIR}", "--volume", f"{copy}:{target}:ro"]
