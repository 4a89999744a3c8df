"""Monitoring beyond loopback asks for a password: the monitoring-auth one-shot's files, tried on the real
Prometheus and Alertmanager binaries (Debian: apt-get install prometheus prometheus-alertmanager)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from ports import free_port

from ornith_stack import deployment as D
from ornith_stack.errors import UserError
from ornith_stack.generate import monitoring_auth as M
from ornith_stack.generate.prometheus import PROMETHEUS_SELF, compose_config
from ornith_stack.stack.bringup import refuse_monitoring
from ornith_stack.stack.status import alerts_go_nowhere, asks_for_login

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
needs_binaries = pytest.mark.skipif(
    PROMETHEUS is None or ALERTMANAGER is None, reason="prometheus and alertmanager not installed"
)
PASSWORD = "pa:ss@w/rd%"  # what a URL or a header would mangle if not escaped


def auth_files(tmp_path: Path, password: str, **environ: str) -> Path:
    folder = tmp_path / "auth"
    assert M.main([str(folder)], {D.MONITORING_PASSWORD_VARIABLE: password, **environ}) == 0
    return folder


def wait_ready(url: str, process: subprocess.Popen[bytes], auth: tuple[str, str] | None) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{url} exited {process.returncode}"
        try:
            if httpx.get(url, auth=auth, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.fixture
def monitoring(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """Alertmanager and Prometheus started as compose starts them (the generated scrape and alerting
    configuration, each with --web.config.file), on free loopback ports, with the password in request.param."""
    password = request.param
    folder = auth_files(tmp_path, password)
    prom_port, am_port = free_port(), free_port()
    config = compose_config()
    text = yaml.safe_dump(
        {
            **config,
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [],
            "scrape_configs": [j for j in config["scrape_configs"] if j["job_name"] in ("prometheus", "alertmanager")],
        }
    )
    text = (
        text.replace(D.MONITORING_PASSWORD_FILE, str(folder / "password"))
        .replace(PROMETHEUS_SELF, f"127.0.0.1:{prom_port}")
        .replace(f"{D.ALERTMANAGER_SERVICE}:{D.ALERTMANAGER_PORT}", f"127.0.0.1:{am_port}")
    )
    (tmp_path / "prometheus.yml").write_text(text)
    (tmp_path / "alertmanager.yml").write_text("route: {receiver: nobody}\nreceivers: [{name: nobody}]\n")
    web = f"--web.config.file={folder / 'web.yml'}"
    log = (tmp_path / "log").open("w")
    alertmanager = subprocess.Popen(
        [
            str(ALERTMANAGER),
            f"--config.file={tmp_path / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'am'}",
            f"--web.listen-address=127.0.0.1:{am_port}",
            "--cluster.listen-address=",
            web,
        ],
        stdout=log,
        stderr=log,
    )
    prometheus = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            web,
        ],
        stdout=log,
        stderr=log,
    )
    auth = (D.MONITORING_USER, password) if password else None
    try:
        wait_ready(f"http://127.0.0.1:{am_port}/-/ready", alertmanager, auth)
        wait_ready(f"http://127.0.0.1:{prom_port}/-/ready", prometheus, auth)
        yield {
            "prometheus": f"http://127.0.0.1:{prom_port}",
            "alertmanager": f"http://127.0.0.1:{am_port}",
            "folder": str(folder),
            "password": password,
        }
    finally:
        stop(prometheus)
        stop(alertmanager)


def targets_up(prometheus: str, password: str) -> dict[str, str]:
    """Each job's target health after Prometheus has scraped them (within 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        answer = httpx.get(f"{prometheus}/api/v1/targets", auth=(D.MONITORING_USER, password), timeout=5).json()
        health = {t["labels"]["job"]: t["health"] for t in answer["data"]["activeTargets"]}
        if all(h != "unknown" for h in health.values()) and len(health) == 2 or time.monotonic() > deadline:
            return health
        time.sleep(0.5)


@needs_binaries
@pytest.mark.parametrize("monitoring", [PASSWORD], indirect=True)
def test_with_a_password_prometheus_and_alertmanager_refuse_anyone_without_it(monitoring: dict[str, str]) -> None:
    for service in ("prometheus", "alertmanager"):
        url = f"{monitoring[service]}/-/ready"
        assert httpx.get(url, timeout=5).status_code == 401, service
        assert httpx.get(url, auth=(D.MONITORING_USER, "wrong"), timeout=5).status_code == 401, service
        assert httpx.get(url, auth=(D.MONITORING_USER, PASSWORD), timeout=5).status_code == 200, service
    # Silencing is what an open Alertmanager let anyone do.
    silences = f"{monitoring['alertmanager']}/api/v2/silences"
    assert httpx.get(silences, timeout=5).status_code == 401
    # Prometheus itself gets in, with the password file: its own and Alertmanager's metrics are scraped.
    assert targets_up(monitoring["prometheus"], PASSWORD) == {"prometheus": "up", "alertmanager": "up"}


@needs_binaries
@pytest.mark.parametrize("monitoring", [PASSWORD, ""], indirect=True)
def test_status_reads_alertmanager_with_the_password(monitoring: dict[str, str]) -> None:
    address = monitoring["alertmanager"].removeprefix("http://")
    password = monitoring["password"]
    assert asks_for_login(address) is bool(password)
    # Its configuration is read (this one sends nowhere: no placeholder webhook); a wrong password reads nothing.
    assert alerts_go_nowhere(address, password) is False
    if password:
        assert alerts_go_nowhere(address) is None and alerts_go_nowhere(address, "wrong") is None


@needs_binaries
@pytest.mark.parametrize("monitoring", [""], indirect=True)
def test_without_a_password_nothing_asks_for_one(monitoring: dict[str, str]) -> None:
    # Loopback as before: open, and Prometheus' empty password is ignored where no login is asked.
    for service in ("prometheus", "alertmanager"):
        assert httpx.get(f"{monitoring[service]}/-/ready", timeout=5).status_code == 200, service
    assert targets_up(monitoring["prometheus"], "") == {"prometheus": "up", "alertmanager": "up"}


def healthcheck_command() -> str:
    """Prometheus' healthcheck in the compose files, as the container's shell runs it."""
    test = yaml.safe_load((REPO / "compose" / "cpu-demo.yml").read_text())["services"]["prometheus"]["healthcheck"][
        "test"
    ]
    assert test[0] == "CMD-SHELL"
    return str(test[1]).replace("$$", "$")


@needs_binaries
@pytest.mark.skipif(shutil.which("wget") is None, reason="wget not installed")
@pytest.mark.parametrize("monitoring", [PASSWORD, ""], indirect=True)
def test_the_prometheus_healthcheck_passes_with_or_without_a_password(monitoring: dict[str, str]) -> None:
    port = monitoring["prometheus"].rsplit(":", 1)[1]
    ready_url = Path(monitoring["folder"]) / "prometheus-ready-url"
    command = (
        healthcheck_command()
        .replace(D.MONITORING_READY_URL_FILE, str(ready_url))
        .replace(f"127.0.0.1:{D.PROMETHEUS_PORT}", f"127.0.0.1:{port}")
    )
    url = ready_url.read_text().replace(f":{D.PROMETHEUS_PORT}/", f":{port}/")
    ready_url.chmod(0o644)
    ready_url.write_text(url)
    assert subprocess.run(["sh", "-c", command], check=False, timeout=30).returncode == 0


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
@pytest.mark.parametrize("password", [PASSWORD, ""])
def test_promtool_accepts_the_web_config(tmp_path: Path, password: str) -> None:
    folder = auth_files(tmp_path, password)
    result = subprocess.run(
        [str(PROMTOOL), "check", "web-config", str(folder / "web.yml")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert ("basic_auth_users" in (folder / "web.yml").read_text()) == bool(password)
    assert (folder / "password").read_text() == password


@pytest.mark.parametrize("bind", ["0.0.0.0", "192.0.2.7", "::"])
def test_a_monitoring_bind_beyond_loopback_without_a_password_starts_nothing(
    tmp_path: Path, bind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert M.main([str(tmp_path / "auth")], {D.MONITORING_BIND_VARIABLE: bind}) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: {D.MONITORING_BIND_VARIABLE}={bind} would publish") and "\n" not in error
    assert not (tmp_path / "auth").exists()
    assert (
        M.main([str(tmp_path / "auth")], {D.MONITORING_BIND_VARIABLE: bind, D.MONITORING_PASSWORD_VARIABLE: PASSWORD})
        == 0
    )


def test_a_password_past_bcrypts_72_bytes_starts_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Plain `docker compose` users set the password themselves: bcrypt would hash only its first 72 bytes."""
    environ = {D.MONITORING_BIND_VARIABLE: "0.0.0.0", D.MONITORING_PASSWORD_VARIABLE: "x" * 73}
    assert M.main([str(tmp_path / "auth")], environ) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ORNITH_MONITORING_PASSWORD is longer than bcrypt's 72 bytes") and "x" * 73 not in error
    assert not (tmp_path / "auth").exists()


def grafana(folder: Path) -> dict[str, dict[str, str]]:
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string((folder / "grafana.ini").read_text())
    return {section: dict(parser[section]) for section in parser.sections()}


def test_with_a_password_grafana_asks_for_a_login(tmp_path: Path) -> None:
    ini = grafana(auth_files(tmp_path, PASSWORD, ORNITH_GRAFANA_LOGIN_DISABLED="true"))
    assert ini["auth.anonymous"]["enabled"] == "false"
    assert ini["auth"]["disable_login_form"] == "false"
    assert ini["security"] == {
        "admin_user": D.MONITORING_USER,
        "admin_password": f"$__file{{{D.MONITORING_PASSWORD_FILE}}}",
    }
    assert PASSWORD not in (tmp_path / "auth" / "grafana.ini").read_text()


def test_without_a_password_grafana_keeps_its_anonymous_viewer_and_the_operators_switches(tmp_path: Path) -> None:
    ini = grafana(auth_files(tmp_path, ""))
    assert ini["auth.anonymous"] == {"enabled": "true", "org_role": "Viewer"}
    assert ini["auth"]["disable_login_form"] == "true" and ini["auth.basic"]["enabled"] == "false"
    turned_on = grafana(
        auth_files(tmp_path / "on", "", ORNITH_GRAFANA_LOGIN_DISABLED="false", ORNITH_GRAFANA_BASIC_AUTH="true")
    )
    assert turned_on["auth"]["disable_login_form"] == "false" and turned_on["auth.basic"]["enabled"] == "true"


@needs_binaries
@pytest.mark.parametrize("monitoring", [PASSWORD, ""], indirect=True)
def test_up_proves_that_prometheus_and_alertmanager_ask_for_the_password(monitoring: dict[str, str]) -> None:
    addresses = {name: monitoring[name].removeprefix("http://") for name in ("prometheus", "alertmanager")}
    if monitoring["password"]:
        refuse_monitoring(addresses, timeout=10)
    else:
        with pytest.raises(UserError, match=r"^prometheus at 127\.0\.0\.1:\d+ answered without the password"):
            refuse_monitoring(addresses, timeout=10)


def test_up_says_so_when_alertmanager_never_answers() -> None:
    with pytest.raises(UserError, match=r"^alertmanager at 127\.0\.0\.1:\d+ answered nothing \(expected 401\)"):
        refuse_monitoring({"alertmanager": f"127.0.0.1:{free_port()}"}, timeout=0.5)
