"""The roles trust NVIDIA's apt signing keys only by their pinned fingerprints: the container toolkit's key and the
keyring inside the cuda-keyring package go through container_toolkit's tasks/signing_key.yml before any keyring or
package is installed. Here the task file runs in a local play on keys made with gpg (the real keys are on NVIDIA's
servers, which tests never reach): the pinned key passes, another key or a file holding a second key beside the
pinned one is refused with a line that says what to check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ANSIBLE_DIR = Path(__file__).resolve().parents[2] / "ansible"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def gnupg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    for name in ("pinned", "other"):
        subprocess.run(["gpg", "--batch", "--homedir", str(home), "--passphrase", "", "--quick-gen-key",
                        f"{name} <{name}@example.invalid>", "ed25519", "sign", "never"], check=True, capture_output=True)
    return home


def _export(home: Path, out: Path, *names: str) -> Path:
    armored = subprocess.run(["gpg", "--batch", "--homedir", str(home), "--armor", "--export", *names], check=True,
                             capture_output=True, text=True).stdout
    out.write_text(armored)
    return out


def _fingerprint(home: Path, name: str) -> str:
    listing = subprocess.run(["gpg", "--batch", "--homedir", str(home), "--with-colons", "--list-keys", name],
                             check=True, capture_output=True, text=True).stdout
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


def _check(tmp_path: Path, key_file: Path, fingerprint: str) -> subprocess.CompletedProcess[str]:
    if not (BIN / "ansible-playbook").exists():
        pytest.skip("ansible-playbook is not installed (pip install -e '.[dev]')")
    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [{
        "name": "Check the key.", "ansible.builtin.include_role": {"name": "container_toolkit",
                                                                   "tasks_from": "signing_key.yml"},
        "vars": {"__container_toolkit_key_file": str(key_file), "__container_toolkit_key_fingerprint": fingerprint}}]}]
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps(play))
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_ROLES_PATH=str(ANSIBLE_DIR / "roles"), ANSIBLE_LOCALHOST_WARNING="0",
               GNUPGHOME=str(tmp_path / "reader-home"), PATH=f"{BIN}:{os.environ['PATH']}")
    (tmp_path / "reader-home").mkdir(mode=0o700)
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(playbook)], cwd=ANSIBLE_DIR,
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def test_the_pinned_key_is_trusted(gnupg: Path, tmp_path: Path) -> None:
    key = _export(gnupg, tmp_path / "key.asc", "pinned")
    # Spaced and lower case, as a fingerprint is often copied from a web page.
    spaced = " ".join(_fingerprint(gnupg, "pinned")[i:i + 4] for i in range(0, 40, 4)).lower()
    result = _check(tmp_path, key, spaced)
    assert result.returncode == 0, result.stdout[-3000:]


@pytest.mark.parametrize("served", [("other",), ("pinned", "other"), ("other", "pinned")],
                         ids=["another key", "a second key after it", "a second key before it"])
def test_any_other_key_file_is_refused(gnupg: Path, tmp_path: Path, served: tuple[str, ...]) -> None:
    key = _export(gnupg, tmp_path / "key.asc", *served)
    pinned = _fingerprint(gnupg, "pinned")
    result = _check(tmp_path, key, pinned)
    assert result.returncode != 0
    text = " ".join(result.stdout.split())
    assert f"holds {len(served)} key(s)" in text and f"not the pinned {pinned}: refusing to trust it" in text, text[-3000:]
    assert "check the new fingerprint on NVIDIA's install guide" in text


def test_both_roles_check_the_key_before_trusting_it() -> None:
    toolkit = (ANSIBLE_DIR / "roles" / "container_toolkit" / "tasks" / "nvidia.yml").read_text()
    driver = (ANSIBLE_DIR / "roles" / "nvidia_driver" / "tasks" / "install-nvidia.yml").read_text()
    assert toolkit.index("signing_key.yml") < toolkit.index("--dearmor")
    assert driver.index("signing_key.yml") < driver.index("ansible.builtin.apt:")
