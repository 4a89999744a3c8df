"""The playbooks refuse a host that cannot serve the profile before changing anything: the real playbooks, run with
ansible-playbook against this machine (local connection, check mode, no privilege escalation), which has no NVIDIA
GPU, not enough disk for a made-up need, and not the architecture of the profile asked for.

These refusals only read the host (tasks/preflight.yml), so a local play proves them; provisioning a container host
for each (tests/integration/test_ansible.py does it once, end to end) cost a minute per case.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = ROOT / "ansible"
BIN = Path(sys.executable).parent
PROFILES = ANSIBLE_DIR / "profiles"


def _has_nvidia_gpu() -> bool:
    return any(vendor.read_text().strip() == "0x10de" for vendor in Path("/sys/bus/pci/devices").glob("*/vendor"))


def _playbook(tmp_path: Path, extra: dict[str, object], *args: str,
              playbook: str = "provision-gpu-host.yml") -> subprocess.CompletedProcess[str]:
    if not (BIN / "ansible-playbook").exists():
        pytest.skip("ansible-playbook is not installed (pip install -e '.[dev]')")
    inventory = tmp_path / "hosts.json"
    host_vars = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_become": False}
    inventory.write_text(json.dumps({"ornith": {"hosts": {"localhost": host_vars}}}))
    extra_file = tmp_path / "extra.json"
    extra_file.write_text(json.dumps({"ornith_hosts": "ornith", "ornith_model_repo": "ornith-test/ornith-tiny",
                                      **extra}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_LOCALHOST_WARNING="0", PATH=f"{BIN}:{os.environ['PATH']}")
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), playbook, "-e", f"@{extra_file}",
                           "--check", *args], cwd=ANSIBLE_DIR, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def _recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    match = re.search(r"^localhost\s+:\s+(ok=.*)$", result.stdout, re.MULTILINE)
    assert match, result.stdout[-3000:] + result.stderr[-2000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", match.group(1))}


def _refused(result: subprocess.CompletedProcess[str]) -> str:
    """The play's output on one line; the play failed and changed nothing."""
    assert result.returncode != 0, result.stdout[-3000:]
    recap = _recap(result)
    assert recap["failed"] == 1 and recap["changed"] == 0, result.stdout[-3000:]
    return " ".join(result.stdout.split())


def test_preflight_refuses_a_small_disk_before_changing_anything(tmp_path: Path) -> None:
    text = _refused(_playbook(tmp_path, {"ornith_profile": "cpu-demo", "nvidia_driver_gpu_expected": False,
                                         "ornith_disk_weights_gb": 10_000_000}))
    assert re.search(r"has [\d.]+ GB free on the disk of \S+; profile cpu-demo puts [\d.]+ GB there: weights of "
                     r"model and draft 10000000 GB", text), text[-3000:]


def test_a_host_without_a_gpu_fails_clearly_unless_it_says_so(tmp_path: Path) -> None:
    if _has_nvidia_gpu():
        pytest.skip("this machine has an NVIDIA GPU")
    text = _refused(_playbook(tmp_path, {"ornith_profile": "gpu96", "nvidia_driver_gpu_expected": True},
                              "--tags", "driver"))
    assert "localhost has no NVIDIA GPU (no PCI device of vendor 0x10de, nvidia-smi finds none)" in text, text[-3000:]
    assert "but profile gpu96 needs 1 GPU(s)" in text
    assert "set nvidia_driver_gpu_expected: false in its inventory" in text


def test_spark_playbook_refuses_a_host_of_the_wrong_architecture(tmp_path: Path) -> None:
    arch = platform.machine()
    if arch == "aarch64":
        pytest.skip("this machine is aarch64, the architecture of profile spark")
    # The spark profile's own variables, only the repository supplied (the fixture's ornith_model_repo).
    text = _refused(_playbook(tmp_path, {}, "--tags", "driver", playbook="provision-spark.yml"))
    assert f"Profile spark runs on aarch64; localhost is {arch}. Choose a profile for this host." in text, text[-3000:]
