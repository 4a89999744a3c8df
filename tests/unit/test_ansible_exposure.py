"""Ansible's side of what a deployment exposes: the bind address refused without a key (evaluated by the real
ansible-playbook on localhost, with the role's own assertion), no shipped password, the host-mode exporter keyed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = ROOT / "ansible" / "roles"
BIN = Path(sys.executable).parent
CASES = [("0.0.0.0", "", True), ("192.168.1.5", "", True), ("0.0.0.0", "a-key", False), ("127.0.0.1", "", False),
         ("::1", "", False), ("localhost", "", False), ("127.0.0.1.evil.example", "", True)]


def test_the_role_refuses_a_non_loopback_bind_without_a_key(tmp_path: Path) -> None:
    if not (BIN / "ansible-playbook").exists():
        pytest.skip("ansible-playbook is not installed (pip install -e '.[dev]')")
    tasks = yaml.safe_load((ROLES / "ornith_service" / "tasks" / "main.yml").read_text())
    guard = next(t for t in tasks if t["name"] == "Refuse to publish an unauthenticated API beyond this host.")
    keyed = yaml.safe_load((ROLES / "ornith_service" / "vars" / "main.yml").read_text())["__ornith_service_keyed"]
    check = {**guard, "vars": {"ornith_service_bind_address": "{{ item[0] }}", "ornith_service_api_key": "{{ item[1] }}",
                               "__ornith_service_keyed": keyed},
             "loop": [[bind, key] for bind, key, _ in CASES], "loop_control": {"label": "{{ item[0] }}"},
             "ignore_errors": True, "register": "guarded"}
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
             "tasks": [check, {"ansible.builtin.copy": {"content": "{{ guarded.results | map(attribute='failed') "
                                                                   "| list | to_json }}",
                                                        "dest": str(tmp_path / "failed.json")}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "PATH": f"{BIN}:{os.environ['PATH']}",
           "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"}
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
                           str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert json.loads((tmp_path / "failed.json").read_text()) == [refused for _, _, refused in CASES]
    assert "would publish an unauthenticated API" in done.stdout and "a-key" not in done.stdout


def test_no_example_inventory_ships_a_grafana_password() -> None:
    for inventory in sorted((ROOT / "ansible" / "inventory").glob("*.yml")):
        assert "change-me" not in inventory.read_text(), inventory.name


@pytest.mark.parametrize("key", ["exporter-k3y", ""])
def test_the_host_mode_exporter_gets_the_key_by_name_never_in_its_unit(key: str) -> None:
    template = (ROLES / "monitoring" / "templates" / "exporter.service.j2").read_text()
    unit = jinja2.Template(template).render(
        ansible_managed="managed", monitoring_exporter_targets=["http://127.0.0.1:8000"], monitoring_exporter_unit_name="ornith-exporter",
        monitoring_exporter_hardening=True, monitoring_exporter_image="img", monitoring_exporter_listen="127.0.0.1:9400",
        monitoring_exporter_profile="cpu-demo", monitoring_exporter_canary=True, monitoring_exporter_api_key=key)
    assert "EnvironmentFile=-/etc/default/ornith-exporter" in unit
    assert (" --env ORNITH_API_KEY " in unit) == bool(key)
    assert "exporter-k3y" not in unit
    tasks = yaml.safe_load((ROLES / "monitoring" / "tasks" / "host.yml").read_text())
    writer = next(t for t in tasks if t.get("ansible.builtin.copy", {}).get("dest") == "/etc/default/{{ monitoring_exporter_unit_name }}")
    assert writer["ansible.builtin.copy"]["mode"] == "0600" and writer["no_log"] is True


KEY_CASES = [("users-k3y", "0perator-k3y", None), ("same-k3y", "same-k3y", "Refuse one key for both roles."),
             ("users-k3y", "", None), ("Zq8$HOSTNAME", "0perator-k3y", "Refuse a key compose would change in compose/.env."),
             ("users-k3y", "op$x", "Refuse a key compose would change in compose/.env.")]


def test_the_role_refuses_one_key_for_both_roles_and_a_key_compose_would_change(tmp_path: Path) -> None:
    """The role's own two assertions, run by the real ansible-playbook on localhost for each pair of keys."""
    if not (BIN / "ansible-playbook").exists():
        pytest.skip("ansible-playbook is not installed (pip install -e '.[dev]')")
    tasks = yaml.safe_load((ROLES / "ornith_service" / "tasks" / "main.yml").read_text())
    guards = [t for t in tasks if t["name"] in {"Refuse one key for both roles.",
                                                 "Refuse a key compose would change in compose/.env."}]
    assert len(guards) == 2 and all(t["no_log"] is True for t in guards)
    checks = [{**guard, "vars": {"ornith_service_api_key": "{{ item[0] }}", "ornith_service_operator_key": "{{ item[1] }}"},
               "loop": [[user, operator] for user, operator, _ in KEY_CASES], "ignore_errors": True,
               "register": f"guard{i}"} for i, guard in enumerate(guards)]
    report = {"ansible.builtin.copy": {"content": "{{ [guard0.results | map(attribute='failed') | list, "
                                                  "guard1.results | map(attribute='failed') | list] | to_json }}",
                                       "dest": str(tmp_path / "failed.json")}}
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": False, "tasks": [*checks, report]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "PATH": f"{BIN}:{os.environ['PATH']}",
           "ANSIBLE_LOCALHOST_WARNING": "False", "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False"}
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-e",
                           f"ansible_python_interpreter={sys.executable}", str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    failed = json.loads((tmp_path / "failed.json").read_text())
    assert failed == [[refused == guard["name"] for _, _, refused in KEY_CASES] for guard in guards]
    assert not any(secret in done.stdout for secret in ("users-k3y", "0perator-k3y", "same-k3y", "HOSTNAME"))
