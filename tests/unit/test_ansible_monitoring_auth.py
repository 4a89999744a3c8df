"""Ansible's host-mode monitoring asks for the password as compose's does: the role's own tasks
(tasks/host_auth.yml, run by the real ansible-playbook on localhost with its paths in a temporary folder), then
the real Prometheus and Alertmanager started with the ARGS and files those tasks wrote and the prometheus.yml
the role templates (Debian: apt-get install prometheus prometheus-alertmanager)."""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from ports import free_port
from test_monitoring_auth import ALERTMANAGER, PROMETHEUS, needs_binaries, stop, targets_up, wait_ready

from ornith_stack import deployment as D

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "ansible" / "roles" / "monitoring"
BIN = Path(sys.executable).parent
PASSWORD = "h0st-mode pa$$word"  # a space and dollars: a command line or a shell would mangle it
needs_ansible = pytest.mark.skipif(not (BIN / "ansible-playbook").exists(), reason="ansible-playbook not installed")


def play(tmp_path: Path, password: str, listen: str = "127.0.0.1", ports: tuple[int, int] = (9090, 9093)) -> subprocess.CompletedProcess[str]:
    """The role's host_auth.yml and its prometheus.yml template, as the role runs them, into tmp_path."""
    me = pwd.getpwuid(os.geteuid()).pw_name
    paths = {
        "__monitoring_service_user": me,
        "__monitoring_web_config": str(tmp_path / "ornith-web.yml"),
        "__monitoring_password_file": str(tmp_path / "ornith-monitoring-password"),
        "__monitoring_prometheus_defaults": str(tmp_path / "default-prometheus"),
        "__monitoring_alertmanager_defaults": str(tmp_path / "default-prometheus-alertmanager"),
        "__monitoring_prometheus_port": ports[0],
        "__monitoring_alertmanager_port": ports[1],
        "monitoring_listen_address": listen,
    }
    tasks = [
        {"name": "host_auth", "ansible.builtin.include_tasks": str(ROLE / "tasks" / "host_auth.yml")},
        {"name": "prometheus.yml", "ansible.builtin.template": {"src": str(ROLE / "templates" / "prometheus.yml.j2"),
                                                                "dest": str(tmp_path / "prometheus.yml"), "mode": "0644"}},
    ]
    handlers = [{"name": name, "ansible.builtin.debug": {"msg": name}}
                for name in ("Restart Prometheus", "Restart Alertmanager")]
    document = [{"hosts": "localhost", "connection": "local", "gather_facts": False,
                 "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
                 "tasks": tasks, "handlers": handlers}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(document))
    (tmp_path / "vars.yml").write_text(yaml.safe_dump({**paths, "monitoring_exporter_listen": "127.0.0.1:9400"}))
    env = {k: v for k, v in os.environ.items() if k != "ORNITH_MONITORING_PASSWORD"}
    env.update(ANSIBLE_NOCOLOR="1", PATH=f"{BIN}:{os.environ['PATH']}", ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_FILTER_PLUGINS=str(ROLE / "filter_plugins"),
               ORNITH_MONITORING_PASSWORD=password)  # the role's default: the controller's environment
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-e", f"@{tmp_path / 'vars.yml'}",
                           "-e", f"ansible_python_interpreter={sys.executable}", str(tmp_path / "play.yml")],
                          capture_output=True, text=True, env=env, timeout=300, check=False)


def args(path: Path) -> list[str]:
    line = next(line for line in path.read_text().splitlines() if line.startswith("ARGS="))
    return shlex.split(shlex.split(line.removeprefix("ARGS="))[0])


@needs_ansible
@needs_binaries
def test_host_mode_prometheus_and_alertmanager_answer_401_without_the_password(tmp_path: Path) -> None:
    prom_port, am_port = free_port(), free_port()
    done = play(tmp_path, PASSWORD, ports=(prom_port, am_port))
    assert done.returncode == 0, done.stdout[-4000:]
    assert PASSWORD not in done.stdout
    prometheus_args, alertmanager_args = args(tmp_path / "default-prometheus"), args(tmp_path / "default-prometheus-alertmanager")
    assert f"--web.listen-address=127.0.0.1:{prom_port}" in prometheus_args
    assert f"--web.listen-address=127.0.0.1:{am_port}" in alertmanager_args and "--cluster.listen-address=" in alertmanager_args
    for name in ("ornith-web.yml", "ornith-monitoring-password"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600 and (tmp_path / name).stat().st_uid == os.geteuid()
    assert not any(PASSWORD in a for a in prometheus_args + alertmanager_args)
    config = (tmp_path / "prometheus.yml").read_text().replace("localhost:9090", f"127.0.0.1:{prom_port}")
    config = config.replace(f"127.0.0.1:{D.ALERTMANAGER_PORT}", f"127.0.0.1:{am_port}")
    rendered = yaml.safe_load(config)
    jobs = [j for j in rendered["scrape_configs"] if j["job_name"] in ("prometheus", "alertmanager")]
    (tmp_path / "prometheus.yml").write_text(
        yaml.safe_dump({**rendered, "rule_files": [], "global": {"scrape_interval": "1s"}, "scrape_configs": jobs})
    )
    (tmp_path / "alertmanager.yml").write_text("route: {receiver: nobody}\nreceivers: [{name: nobody}]\n")
    log = (tmp_path / "log").open("w")
    alertmanager = subprocess.Popen([str(ALERTMANAGER), f"--config.file={tmp_path / 'alertmanager.yml'}",
                                     f"--storage.path={tmp_path / 'am'}", *alertmanager_args], stdout=log, stderr=log)
    prometheus = subprocess.Popen([str(PROMETHEUS), f"--config.file={tmp_path / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp_path / 'data'}", *prometheus_args], stdout=log, stderr=log)
    try:
        auth = (D.MONITORING_USER, PASSWORD)
        wait_ready(f"http://127.0.0.1:{am_port}/-/ready", alertmanager, auth)
        wait_ready(f"http://127.0.0.1:{prom_port}/-/ready", prometheus, auth)
        for port in (prom_port, am_port):
            assert httpx.get(f"http://127.0.0.1:{port}/-/ready", timeout=5).status_code == 401
            assert httpx.get(f"http://127.0.0.1:{port}/-/ready", auth=(D.MONITORING_USER, "x"), timeout=5).status_code == 401
        silence = {"matchers": [{"name": "alertname", "value": ".+", "isRegex": True}], "startsAt": "2026-01-01T00:00:00Z",
                   "endsAt": "2030-01-01T00:00:00Z", "createdBy": "x", "comment": "x"}
        assert httpx.post(f"http://127.0.0.1:{am_port}/api/v2/silences", json=silence, timeout=5).status_code == 401
        # Prometheus reaches itself and Alertmanager with the password file the role wrote.
        assert targets_up(f"http://127.0.0.1:{prom_port}", PASSWORD) == {"prometheus": "up", "alertmanager": "up"}
    finally:
        stop(prometheus)
        stop(alertmanager)


@needs_ansible
def test_a_second_run_keeps_the_hash_and_a_new_password_replaces_it(tmp_path: Path) -> None:
    assert play(tmp_path, PASSWORD).returncode == 0
    first = (tmp_path / "ornith-web.yml").read_text()
    again = play(tmp_path, PASSWORD)
    assert again.returncode == 0 and (tmp_path / "ornith-web.yml").read_text() == first
    assert "changed=0" in again.stdout.split("PLAY RECAP")[1], again.stdout[-2000:]
    assert play(tmp_path, "another").returncode == 0
    assert (tmp_path / "ornith-web.yml").read_text() != first


@needs_ansible
@pytest.mark.parametrize("listen", ["192.0.2.7"])
def test_host_mode_beyond_loopback_without_a_password_is_refused_before_anything_is_written(
    tmp_path: Path, listen: str
) -> None:
    done = play(tmp_path, "", listen=listen)
    assert done.returncode != 0
    assert f"monitoring_listen_address={listen} would publish Prometheus and Alertmanager without a password" in done.stdout
    assert not (tmp_path / "ornith-web.yml").exists() and not (tmp_path / "default-prometheus").exists()
