"""Monitoring beyond loopback asks for a password: the monitoring-auth one-shot's files, tried on the real
Prometheus and Alertmanager binaries (Debian: apt-get install prometheus prometheus-alertmanager)."""

from __future__ import annotations

import os
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
from ornith_stack.stack.status import alerts_go_nowhere, asks_for_login, heartbeat_goes_nowhere

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
    # The files owned by the user these processes run as, as compose gives them to Prometheus' user.
    folder = auth_files(tmp_path, password, ORNITH_MONITORING_UID=str(os.geteuid()))
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
def test_the_prometheus_healthcheck_passes_with_or_without_a_password_and_shows_none(
    monitoring: dict[str, str],
) -> None:
    port = monitoring["prometheus"].rsplit(":", 1)[1]
    folder = Path(monitoring["folder"])
    command = (
        healthcheck_command()
        .replace(D.MONITORING_AUTH_DIR + "/", f"{folder}/")
        .replace(f"127.0.0.1:{D.PROMETHEUS_PORT}", f"127.0.0.1:{port}")
    )
    assert "cat " not in command and "@" not in command  # no credential read into, or written in, an argv
    if monitoring["password"]:
        assert monitoring["password"] not in command
    assert subprocess.run(["sh", "-c", command], check=False, timeout=30).returncode == 0
    # The same check without the login's files fails: the password is what lets it in.
    if monitoring["password"]:
        (folder / "wgetrc").write_text("")
        (folder / "promtool-http.yml").write_text("{}\n")
        assert subprocess.run(["sh", "-c", command], check=False, timeout=30, capture_output=True).returncode != 0


def test_every_secret_file_is_0600_and_owned_by_its_reader(tmp_path: Path) -> None:
    folder = auth_files(tmp_path, PASSWORD, ORNITH_MONITORING_UID="990", ORNITH_GRAFANA_UID="472")
    owners = {path.name: (path.stat().st_uid, path.stat().st_mode & 0o777) for path in folder.iterdir()}
    reader = 990 if os.geteuid() == 0 else os.geteuid()
    grafana_reader = 472 if os.geteuid() == 0 else os.geteuid()
    assert owners == {
        "password": (reader, 0o600),
        "web.yml": (reader, 0o600),
        "wgetrc": (reader, 0o600),
        "promtool-http.yml": (reader, 0o600),
        "grafana.ini": (grafana_reader, 0o600),
        "grafana-viewer-password": (grafana_reader, 0o600),
        "grafana-admin-password": (grafana_reader, 0o600),
    }


def test_grafanas_admin_password_is_never_the_viewers(tmp_path: Path) -> None:
    folder = auth_files(tmp_path, PASSWORD)
    admin = (folder / "grafana-admin-password").read_text()
    assert admin and admin != PASSWORD
    # Kept across runs (Grafana keeps the admin it made first), and the operator's own when given.
    assert (auth_files(tmp_path, PASSWORD) / "grafana-admin-password").read_text() == admin
    given = auth_files(tmp_path, PASSWORD, GRAFANA_ADMIN_PASSWORD="the-admins-own")
    assert (given / "grafana-admin-password").read_text() == "the-admins-own"
    assert (given / "grafana-viewer-password").read_text() == PASSWORD


def compose_services() -> dict[str, dict[str, object]]:
    return dict(yaml.safe_load((REPO / "compose" / "cpu-demo.yml").read_text())["services"])


def test_no_credential_in_any_compose_command_and_alertmanager_gossips_with_nobody() -> None:
    services = compose_services()
    for name, service in services.items():
        argv = " ".join(str(a) for key in ("command", "entrypoint") for a in (service.get(key) or []))
        assert "PASSWORD" not in argv and "@127.0.0.1" not in argv, name
    assert "--cluster.listen-address=" in list(services["alertmanager"]["command"])  # type: ignore[arg-type]
    grafana = services["grafana"]["environment"]
    assert "GF_SECURITY_ADMIN_PASSWORD" not in grafana  # type: ignore[operator]


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
        "admin_user": D.GRAFANA_ADMIN_USER,
        "admin_password": f"$__file{{{D.GRAFANA_ADMIN_PASSWORD_FILE}}}",
    }
    assert ini["metrics"] == {
        "enabled": "true",
        "basic_auth_username": D.MONITORING_USER,
        "basic_auth_password": f"$__file{{{D.GRAFANA_VIEWER_PASSWORD_FILE}}}",
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


@needs_binaries
@pytest.mark.parametrize("heartbeat", ["", "https://heartbeat.example/ping"])
def test_status_says_when_the_heartbeat_goes_nowhere(tmp_path: Path, heartbeat: str) -> None:
    """Issue 44: the heartbeat URL is empty by default and `up`/`status` did not say so. The generated
    configuration, as compose's one-shot writes it, loaded by the real Alertmanager."""
    from ornith_stack.generate import alertmanager as AM

    config = tmp_path / "alertmanager.yml"
    AM.write_with_webhooks(REPO / AM.CONFIG, config, AM.Webhooks("https://pager.example/x", "", heartbeat))
    port = free_port()
    log = (tmp_path / "log").open("w")
    process = subprocess.Popen([str(ALERTMANAGER), f"--config.file={config}", f"--storage.path={tmp_path / 'am'}",
                                f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                               stdout=log, stderr=log)
    try:
        wait_ready(f"http://127.0.0.1:{port}/-/ready", process, None)
        assert heartbeat_goes_nowhere(f"127.0.0.1:{port}") is (not heartbeat)
        assert alerts_go_nowhere(f"127.0.0.1:{port}") is False
    finally:
        stop(process)


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv")
def test_the_one_shot_runs_again_with_only_the_capabilities_compose_gives_it(tmp_path: Path) -> None:
    """Compose runs monitoring-auth as root with cap_drop ALL and the cap_add of the rendered file: a second
    start must still read the admin password it made (now Grafana's, 0600) and give every file to its reader."""
    import sys

    service = compose_services()[D.MONITORING_AUTH_SERVICE]
    assert service["cap_drop"] == ["ALL"]
    keep = ",".join(f"+{c.lower()}" for c in service["cap_add"])  # type: ignore[union-attr]
    argv = ["setpriv", f"--bounding-set=-all,{keep}", "--inh-caps=-all", sys.executable, "-m",
            "ornith_stack.generate.monitoring_auth", str(tmp_path / "auth")]
    env = {**os.environ, D.MONITORING_PASSWORD_VARIABLE: PASSWORD, "PYTHONPATH": str(REPO / "src")}
    for _ in range(2):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
    admin = tmp_path / "auth" / "grafana-admin-password"
    assert admin.stat().st_uid == D.GRAFANA_UID_DEFAULT and (tmp_path / "auth" / "web.yml").stat().st_uid == D.MONITORING_UID_DEFAULT
