"""The disk a profile needs (planner/disk.py): one estimate, checked by `ornith-stack up` and, through the
generated ansible/profiles/<profile>.yml, by the playbooks' preflight (ansible/tasks/disk.yml, run here with
ansible-playbook on this machine, `docker` answering its data root from a script first on PATH)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ornith_stack.planner.disk import DISK_MARGIN, IMAGE_ROOM_CPU, IMAGE_ROOM_GPU, disk_need, weights_bytes
from ornith_stack.profiles import load_profile, shipped_profile_names
from ornith_stack.stack import preflight as P

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = ROOT / "ansible"
BIN = Path(sys.executable).parent

# GB (1e9 bytes) of each profile's checkpoints, from the shipped shapes (sizing/configs/): BF16 parameters x 2
# bytes of the model plus its draft. gb300x2: Ornith-1.5-122B, 125,086,497,008 parameters, is 250.2 GB alone.
WEIGHTS_GB = {"gb300x2": (250.1, 256.0), "gpu96": (71.9, 73.5), "a100x2": (71.9, 73.5), "spark": (70.0, 74.0),
              "cpu-demo": (0.0, 0.0)}


def test_every_shipped_profile_has_an_expected_size() -> None:
    assert sorted(WEIGHTS_GB) == sorted(shipped_profile_names())


@pytest.mark.parametrize("name", sorted(WEIGHTS_GB))
def test_each_profile_needs_its_checkpoints_its_images_their_archives_and_headroom(name: str) -> None:
    profile = load_profile(name)
    need = disk_need(profile)
    low, high = WEIGHTS_GB[name]
    assert low <= need.weights / 1e9 <= high
    assert need.weights == weights_bytes(profile)
    assert need.images == need.archives == (IMAGE_ROOM_GPU if profile.hardware.gpu else IMAGE_ROOM_CPU)
    assert need.margin == DISK_MARGIN
    gb = need.gigabytes()
    assert gb["weights"] >= need.weights / 1e9 > gb["weights"] - 0.1  # rounded up to a tenth


def test_gb300x2_on_one_disk_needs_about_340_gb() -> None:
    """The 122B checkpoint (250.2 GB) and its draft, the CUDA image loaded and, until loaded, its archive."""
    total = sum(disk_need(load_profile("gb300x2")).gigabytes().values())
    assert 335 <= total <= 350, total


@pytest.mark.parametrize("name", sorted(WEIGHTS_GB))
def test_the_generated_ansible_profile_carries_the_estimate(name: str) -> None:
    data = yaml.safe_load((ANSIBLE_DIR / "profiles" / f"{name}.yml").read_text())
    written = {key.removeprefix("ornith_disk_").removesuffix("_gb"): value
               for key, value in data.items() if key.startswith("ornith_disk_")}
    assert written == disk_need(load_profile(name)).gigabytes()


def test_up_checks_the_same_estimate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profile = load_profile("gb300x2")
    checked: list[dict[Path, int]] = []
    monkeypatch.setattr(P, "choose_profile", lambda name, root=None: (profile, None))
    monkeypatch.setattr(P, "docker_info", lambda run: {"DockerRootDir": str(tmp_path / "docker")})
    monkeypatch.setattr(P, "compose_version", lambda run: "2.26.1")
    monkeypatch.setattr(P, "check_nvidia_runtime", lambda profile, info: None)
    monkeypatch.setattr(P, "check_disk", lambda needs, usage: checked.append(needs))
    P.preflight("gb300x2", lambda argv: None, "127.0.0.1", True, tmp_path / "hf")
    need = disk_need(profile)
    assert checked == [{tmp_path / "hf": need.weights, tmp_path / "docker": need.images}]


def _disk_play(tmp_path: Path, profile: str, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """tasks/disk.yml with the generated variables of `profile`, every folder under tmp_path (one disk)."""
    if not (BIN / "ansible-playbook").exists():
        pytest.skip("ansible-playbook is not installed (pip install -e '.[dev]')")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f"#!/bin/sh\necho {tmp_path / 'docker-root'}\n")  # `docker info --format {{.DockerRootDir}}`
    docker.chmod(0o755)
    found = tmp_path / "disks.json"
    play = [{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable, "model_weights_hf_home": str(tmp_path / "hf"),
                 "ornith_service_project_dir": str(tmp_path / "opt")},
        "tasks": [
            {"ansible.builtin.include_vars": {"file": str(ANSIBLE_DIR / "profiles" / f"{profile}.yml")}},
            {"ansible.builtin.import_tasks": str(ANSIBLE_DIR / "tasks" / "disk.yml")},
            {"ansible.builtin.copy": {"content": "{{ ornith_preflight_disks | to_json }}", "dest": str(found),
                                      "mode": "0644"}},
        ],
    }]
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps(play))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="0", PATH=f"{bin_dir}:{BIN}:{os.environ['PATH']}")
    result = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook), *args], env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    return result, found


def test_the_preflight_adds_up_the_generated_estimate_on_each_disk(tmp_path: Path) -> None:
    result, found = _disk_play(tmp_path, "gb300x2")
    gb = disk_need(load_profile("gb300x2")).gigabytes()
    need = gb["weights"] + gb["archives"] + gb["images"] + gb["headroom"]
    free = shutil.disk_usage(tmp_path).free
    text = " ".join(result.stdout.split())
    if free >= need * 1e9:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        [disk] = json.loads(found.read_text())  # the three folders are on one disk
        assert disk["path"] == str(tmp_path / "hf") and disk["need"] == pytest.approx(need)
        assert len(disk["parts"]) == 3
    else:
        assert result.returncode != 0 and f"puts {need:.1f} GB there" in text, text[-3000:]


def test_too_small_a_disk_fails_with_need_free_path_and_fix(tmp_path: Path) -> None:
    free_gb = shutil.disk_usage(tmp_path).free / 1e9
    weights = round(free_gb + 100.0, 1)
    result, _ = _disk_play(tmp_path, "gb300x2", "-e", json.dumps({"ornith_disk_weights_gb": weights}))
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    gb = disk_need(load_profile("gb300x2")).gigabytes()
    need = weights + gb["archives"] + gb["images"] + gb["headroom"]
    assert re.search(
        rf"has [\d.]+ GB free on the disk of {re.escape(str(tmp_path / 'hf'))}; profile gb300x2 puts {need:.1f} GB "
        rf"there: weights of model and draft {weights} GB \({re.escape(str(tmp_path / 'hf'))}\) \+ image archives "
        rf"until docker load {gb['archives']} GB \({re.escape(str(tmp_path / 'opt' / 'images'))}\) \+ images "
        rf"{gb['images']} GB \({re.escape(str(tmp_path / 'docker-root'))}\) \+ {gb['headroom']} GB headroom",
        text), text[-3000:]
    assert "point model_weights_hf_home and ornith_service_hf_cache (the weights)" in text
