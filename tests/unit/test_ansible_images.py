"""ornith_service's image delivery (tasks/images.yml) on this machine: archives saved on the controller are copied,
loaded, then removed from the host; the controller keeps each image's current archive only; a second run copies
and loads nothing. `docker` is a script first on PATH that answers `image inspect` and records `save` and `load`
(tests/integration/test_ansible.py runs the same tasks against a real Docker)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = ROOT / "ansible"
BIN = Path(sys.executable).parent
IMAGE_ID = "sha256:0123456789abcdef0123456789abcdef"

FAKE_DOCKER = """#!/bin/bash
case "$1 $2" in
  "image inspect")
    if [[ "$4" == *Architecture* ]]; then echo linux/{arch}; exit 0; fi
    [ "$5" = img/a:1 ] && echo {image_id} && exit 0
    exit 1 ;;
  "save --output") echo "layers of $4" > "$3" ;;
  "load --input") echo "$3" >> {loads} ;;
esac
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if not (BIN / "ansible-playbook").exists():
        pytest.skip("ansible-playbook is not installed (pip install -e '.[dev]')")
    (tmp_path / "compose.yml").write_text("services:\n  engine:\n    image: img/a:1\n")
    play = [{
        "hosts": "localhost", "connection": "local", "gather_facts": True, "gather_subset": ["min"],
        "vars": {"ansible_python_interpreter": sys.executable, "ornith_profile": "cpu-demo",
                 "ornith_service_compose_src": str(tmp_path / "compose.yml"),
                 "ornith_service_project_dir": str(tmp_path / "host"),
                 "ornith_service_image_cache_dir": str(tmp_path / "cache"),
                 "ornith_service_images": ["img/a:1"],
                 "ornith_service_image_archives": [str(tmp_path / "made-elsewhere.tar")],
                 "ornith_service_start": False},
        "tasks": [
            {"ansible.builtin.file": {"path": str(tmp_path / "host" / "images"), "state": "directory", "mode": "0755"}},
            {"ansible.builtin.include_role": {"name": "ornith_service", "tasks_from": "images.yml"}},
        ],
    }]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ANSIBLE_DIR / "roles"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0",
               PATH=f"{tmp_path / 'bin'}:{BIN}:{os.environ['PATH']}")
    result = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(tmp_path / "play.yml"), *args],
                            env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result


def _changed(result: subprocess.CompletedProcess[str]) -> int:
    return int(re.findall(r"changed=(\d+)", result.stdout)[-1])


def test_archives_are_removed_from_the_host_after_docker_load_and_kept_on_the_controller_while_current(
    tmp_path: Path,
) -> None:
    (tmp_path / "bin").mkdir()
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    docker = tmp_path / "bin" / "docker"
    docker.write_text(FAKE_DOCKER.format(arch=arch, image_id=IMAGE_ID, loads=tmp_path / "loads.log"))
    docker.chmod(0o755)
    (tmp_path / "made-elsewhere.tar").write_text("layers\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "img_a_1-aaaaaaaaaaaa.tar").write_text("an older build of img/a:1\n")
    (cache / "img_b_1-bbbbbbbbbbbb.tar").write_text("another image\n")
    current = "img_a_1-0123456789ab.tar"

    _run(tmp_path)
    host = tmp_path / "host" / "images"
    assert sorted(p.name for p in host.iterdir()) == ["loaded.txt"]
    assert (tmp_path / "loads.log").read_text().split() == [str(host / current), str(host / "made-elsewhere.tar")]
    assert sorted(p.name for p in cache.iterdir()) == [current, "img_b_1-bbbbbbbbbbbb.tar"]
    record = (host / "loaded.txt").read_text().splitlines()
    assert [line.split()[:2] for line in record] == [[current, str((cache / current).stat().st_size)],
                                                      ["made-elsewhere.tar", "7"]]

    again = _run(tmp_path)
    assert _changed(again) == 0 and len((tmp_path / "loads.log").read_text().split()) == 2
    assert _changed(_run(tmp_path, "--check")) == 0

    (tmp_path / "made-elsewhere.tar").write_text("a new archive\n")  # another size: delivered again, alone
    _run(tmp_path)
    assert (tmp_path / "loads.log").read_text().split()[2:] == [str(host / "made-elsewhere.tar")]
    assert sorted(p.name for p in host.iterdir()) == ["loaded.txt"]
