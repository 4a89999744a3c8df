"""The nvidia_driver role against what NVIDIA's tools really print on a host in a broken state.

Each case runs the role's own task files with ansible-playbook on this machine (local connection, check mode
where the role could change something); `nvidia-smi` and `journalctl` are replayed from the recorded real
outputs in tests/fixtures/nvidia/ (provenance in its README) by scripts put first on PATH.
"""

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
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia"
BIN = Path(sys.executable).parent
# nvidia-smi exits with NVML's error code: NVML_ERROR_LIB_RM_VERSION_MISMATCH is 18 (nvml.h).
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18


def _replay(bin_dir: Path, command: str, fixture: str, status: int) -> None:
    """An executable `command` that prints the recorded output `fixture` and exits with `status`."""
    script = bin_dir / command
    script.write_text(f"#!/bin/sh\ncat {FIXTURES / fixture}\nexit {status}\n")
    script.chmod(0o755)


def _play(tmp_path: Path, tasks: list[dict], play_vars: dict, *args: str) -> subprocess.CompletedProcess[str]:
    if not (BIN / "ansible-playbook").exists():
        pytest.skip("ansible-playbook is not installed (pip install -e '.[dev]')")
    playbook = tmp_path / "play.yml"
    play = {"hosts": "localhost", "connection": "local", "gather_subset": ["min"], "become": False}
    play_vars = {"ansible_python_interpreter": sys.executable, **play_vars}
    playbook.write_text(json.dumps([{**play, "vars": play_vars, "tasks": tasks}]))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"),
        ANSIBLE_ROLES_PATH=str(ANSIBLE_DIR / "roles"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_LOCALHOST_WARNING="0",
        PATH=f"{tmp_path / 'bin'}:{BIN}:{os.environ['PATH']}",
    )
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    (tmp_path / "bin").mkdir()
    return tmp_path / "bin"


def _text(result: subprocess.CompletedProcess[str]) -> str:
    return " ".join((result.stdout + result.stderr).split())


def test_a_driver_library_mismatch_stops_the_play_with_reboot_and_installs_nothing(
    tmp_path: Path, bin_dir: Path
) -> None:
    _replay(bin_dir, "nvidia-smi", "nvidia-smi-driver-library-mismatch.txt", NVML_ERROR_LIB_RM_VERSION_MISMATCH)
    role = [{"ansible.builtin.include_role": {"name": "nvidia_driver"}}]
    result = _play(tmp_path, role, {"ornith_profile": "gpu96", "nvidia_driver_gpu_expected": True}, "--check")
    assert result.returncode != 0
    text = _text(result)
    assert 'answers "Failed to initialize NVML: Driver/library version mismatch" (NVML library 570.124,' in text, text
    assert "Reboot this host, then run the play again. This play installs no driver over it." in text
    assert "Install the driver" not in text
    assert "has no NVIDIA GPU" not in text  # not mistaken for a host without a GPU or without a driver


def test_a_fabric_manager_of_another_version_stops_with_both_versions(tmp_path: Path, bin_dir: Path) -> None:
    _replay(bin_dir, "journalctl", "fabricmanager-journal-version-mismatch.txt", 0)
    tasks = [{"ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "fabricmanager-failed.yml"}}]
    result = _play(tmp_path, tasks, {"nvidia_driver_loaded_version": "550.120", "nvidia_driver_source": "distro"})
    assert result.returncode != 0
    text = _text(result)
    assert "its driver interface version 550.127.05 is not the loaded driver's 550.120" in text, text
    assert "Install nvidia-fabricmanager-550=550.120* and hold it with the driver" in text


# Package names and versions as NVIDIA's repository and Ubuntu's archive publish them.
FABRIC_MANAGER_PINS = [
    ("distro", "550.127.05", "nvidia-fabricmanager-550=550.127.05*"),
    ("nvidia", "570.195.03", "nvidia-fabricmanager-570=570.195.03*"),
    ("nvidia", "580.95.05", "nvidia-fabricmanager=580.95.05*"),
]


def test_the_fabric_manager_is_installed_at_the_loaded_driver_s_exact_version(tmp_path: Path, bin_dir: Path) -> None:
    tasks: list[dict] = [
        {"ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "detect.yml", "public": True}}
    ]
    for source, driver in ((source, driver) for source, driver, _ in FABRIC_MANAGER_PINS):
        tasks.append(
            {"ansible.builtin.set_fact": {"nvidia_driver_source": source, "nvidia_driver_loaded_version": driver}}
        )
        tasks.append({"ansible.builtin.debug": {"msg": "pin {{ nvidia_driver_fabricmanager_packages | join(' ') }}"}})
    result = _play(tmp_path, tasks, {})
    assert result.returncode == 0, result.stdout[-3000:]
    assert re.findall(r'"msg": "pin (\S+)"', result.stdout) == [pin for _, _, pin in FABRIC_MANAGER_PINS]


@pytest.mark.parametrize(
    ("details", "query_line", "nvml_brand"),
    [
        ("nvidia-smi-q-h100-560.txt", "0, NVIDIA H100 80GB HBM3, 560.35.03, 9.0", "NVML_BRAND_NVIDIA"),
        ("nvidia-smi-q-geforce-rtx3050-535.txt", "0, NVIDIA GeForce RTX 3050, 535.183.01, 8.6", "NVML_BRAND_GEFORCE"),
    ],
)
def test_the_preflight_and_the_doctor_agree_on_forward_compatibility_by_brand(
    tmp_path: Path, bin_dir: Path, details: str, query_line: str, nvml_brand: str
) -> None:
    """gpu96's cu129 image on the recorded GPU and driver: the preflight passes exactly when the doctor does."""
    pynvml = pytest.importorskip("pynvml")
    from ornith_stack.doctor import GpuInfo, Options, diagnose
    from ornith_stack.doctor.gpu import brand_name

    script = bin_dir / "nvidia-smi"  # `-q` answers the recorded head, the CSV query its line
    script.write_text(f'#!/bin/sh\ncase " $* " in *" -q "*) cat {FIXTURES / details};; *) echo "{query_line}";; esac\n')
    script.chmod(0o755)
    tasks = [
        {"ansible.builtin.include_vars": {"file": str(ANSIBLE_DIR / "profiles" / "gpu96.yml")}},
        {"ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "detect.yml", "public": True}},
        {"ansible.builtin.include_role": {"name": "nvidia_driver", "tasks_from": "preflight.yml"}},
    ]
    result = _play(tmp_path, tasks, {}, "--check")
    _, name, driver, capability = (part.strip() for part in query_line.split(","))
    gpu = GpuInfo(0, name, 80.0, capability, driver, brand=brand_name(pynvml, getattr(pynvml, nvml_brand)))
    (finding,) = [f for f in diagnose(Options(profile="gpu96"), gpus=[gpu]).findings if f.topic == "driver"]
    assert (result.returncode == 0) == (finding.level == "ok"), (_text(result)[-3000:], finding.message)
    if finding.level != "ok":
        text = _text(result)
        assert f"The NVIDIA driver on localhost is {driver}" in text
        assert "this GPU's brand is geforce, which cannot use forward compatibility (CUDA error 804 at start)" in text
        assert "on a geforce GPU" in finding.message
