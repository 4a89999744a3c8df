"""Compose's monitoring-auth one-shot: the files that make Prometheus, Alertmanager and Grafana ask for a
password, written into the volume they mount at /auth before they start.

With ORNITH_MONITORING_PASSWORD set: Prometheus' and Alertmanager's web config (`--web.config.file`)
holds user `ornith` with a bcrypt hash of it, so both answer 401 without it; Grafana's settings turn the
anonymous viewer off and the login on, and its /metrics asks for the same login. Grafana's admin is
`admin` with a password of its own (GRAFANA_ADMIN_PASSWORD; unset, a random one kept in the volume), never
the viewers' one: the grafana-viewer one-shot gives `ornith` a Viewer login with the monitoring password.
Without it: an empty web config (no authentication) and Grafana as before, anonymous viewers and no login
unless the operator's ORNITH_GRAFANA_LOGIN_DISABLED / ORNITH_GRAFANA_BASIC_AUTH say otherwise; and the
one-shot refuses to run when ORNITH_MONITORING_BIND leaves loopback, so that Prometheus, Alertmanager and
Grafana (which wait for it) never start unauthenticated beyond this machine.

The password file is what Prometheus sends to itself and to Alertmanager (`basic_auth.password_file` in
monitoring/prometheus/prometheus.yml); its healthcheck reads the login from a wgetrc or promtool's HTTP
client configuration, never from a command line. Each file is mode 0600 and owned by the one user that
reads it: Prometheus' and Alertmanager's (ORNITH_MONITORING_UID, the upstream images' nobody by default) or
Grafana's (ORNITH_GRAFANA_UID, 472); only those containers mount the volume.
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from ornith_stack import deployment as D
from ornith_stack.errors import UserError
from ornith_stack.generate.prometheus import dump
from ornith_stack.urls import is_loopback
from ornith_stack.wire.http import WireError, basic_auth, fetch

# bcrypt cost 2^10: Prometheus checks the hash on every request it has not cached (scrapes, healthchecks).
BCRYPT_COST = 10
LOGIN_DISABLED_ENV = "ORNITH_GRAFANA_LOGIN_DISABLED"
BASIC_AUTH_ENV = "ORNITH_GRAFANA_BASIC_AUTH"


def bcrypt_hash(password: str) -> str:
    """The $2b$ hash Prometheus' and Alertmanager's web config take (exporter-toolkit's basic_auth_users)."""
    import bcrypt  # only where a password is hashed: rendering and planning do not need it

    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=BCRYPT_COST)).decode("ascii")


def kept_hash(password: str, previous: str = "") -> str:
    """`previous` when it is a bcrypt hash of `password` (a run that changes nothing writes nothing), else a
    new one. Ansible's host mode keeps its web config so (its ornith_bcrypt filter)."""
    import bcrypt

    try:
        if previous and bcrypt.checkpw(password.encode(), previous.encode()):
            return previous
    except ValueError:  # not a bcrypt hash
        pass
    return bcrypt_hash(password)


def web_config(password: str) -> dict[str, object]:
    """Prometheus' and Alertmanager's web config: basic auth for `ornith` with `password`; none without."""
    return {"basic_auth_users": {D.MONITORING_USER: bcrypt_hash(password)}} if password else {}


def _flag(value: str, default: bool) -> str:
    return str(default if value.strip().lower() not in ("true", "false") else value.strip().lower() == "true").lower()


def grafana_ini(password: str, environ: Mapping[str, str]) -> str:
    """Grafana's settings: viewers log in as `ornith` with the password, else the anonymous viewer of
    loopback; the admin's password a file of its own either way; /metrics behind the viewers' login (off
    without one: nothing scrapes it)."""
    common = {
        "users": {"allow_sign_up": "false", "auto_assign_org_role": "Viewer"},
        "security": {
            "admin_user": D.GRAFANA_ADMIN_USER,
            "admin_password": "$__file{" + D.GRAFANA_ADMIN_PASSWORD_FILE + "}",
        },
    }
    auth: dict[str, dict[str, str]]
    if password:
        auth = {
            "auth": {"disable_login_form": "false"},
            "auth.anonymous": {"enabled": "false"},
            "auth.basic": {"enabled": "true"},
            **common,
            "metrics": {
                "enabled": "true",
                "basic_auth_username": D.MONITORING_USER,
                "basic_auth_password": "$__file{" + D.GRAFANA_VIEWER_PASSWORD_FILE + "}",
            },
        }
    else:
        auth = {
            "auth": {"disable_login_form": _flag(environ.get(LOGIN_DISABLED_ENV, ""), True)},
            "auth.anonymous": {"enabled": "true", "org_role": "Viewer"},
            "auth.basic": {"enabled": _flag(environ.get(BASIC_AUTH_ENV, ""), False)},
            **common,
            "metrics": {"enabled": "false"},
        }
    return "\n".join(
        f"[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()) for section, keys in auth.items()
    )


def wgetrc(password: str) -> str:
    """GNU wget's settings for Prometheus' healthcheck: the login, read from this file, not from argv."""
    return f"http_user = {D.MONITORING_USER}\nhttp_password = {password}\n" if password else ""


def promtool_http_config(password: str) -> dict[str, object]:
    """promtool's HTTP client configuration for `promtool check ready` (the password read from its file)."""
    if not password:
        return {}
    return {"basic_auth": {"username": D.MONITORING_USER, "password_file": D.MONITORING_PASSWORD_FILE}}


def healthcheck() -> str:
    """Prometheus' healthcheck as compose's shell runs it: GNU wget with the WGETRC (the Debian stand-in
    image), else promtool with its HTTP client configuration (the upstream image, whose busybox wget takes a
    login from its arguments only, where `ps` shows it). Neither has a credential in its command line."""
    url = f"http://127.0.0.1:{D.PROMETHEUS_PORT}"
    return (
        f"WGETRC={D.MONITORING_WGETRC} wget -qO- {url}/-/ready >/dev/null 2>&1 || "
        f"promtool check ready --url={url} --http.config.file={D.MONITORING_PROMTOOL_HTTP_CONFIG} >/dev/null"
    )


def refusal(environ: Mapping[str, str]) -> str | None:
    """Why nothing may start: a monitoring bind beyond loopback without a password (None: fine)."""
    bind = environ.get(D.MONITORING_BIND_VARIABLE, "") or "127.0.0.1"
    password = environ.get(D.MONITORING_PASSWORD_VARIABLE, "")
    if len(password.encode()) > D.MONITORING_PASSWORD_MAX_BYTES:
        return f"{D.MONITORING_PASSWORD_VARIABLE} is longer than bcrypt's {D.MONITORING_PASSWORD_MAX_BYTES} bytes: use a shorter one"
    if password or is_loopback(bind):
        return None
    return (
        f"{D.MONITORING_BIND_VARIABLE}={bind} would publish Prometheus, Alertmanager and Grafana without a "
        f"password: set {D.MONITORING_PASSWORD_VARIABLE} in compose/.env (`ornith-stack up` makes one), or "
        f"keep {D.MONITORING_BIND_VARIABLE}=127.0.0.1"
    )


def _uid(environ: Mapping[str, str], name: str, default: int) -> int:
    value = environ.get(name, "").strip()
    return int(value) if value.isdigit() else default


def write(folder: Path, environ: Mapping[str, str]) -> None:
    """The files, each replaced whole (a shorter password leaves nothing of the longer one), mode 0600 and
    owned by the user that reads it (when run as root, as the one-shot is)."""
    password = environ.get(D.MONITORING_PASSWORD_VARIABLE, "")
    admin = environ.get(D.GRAFANA_ADMIN_PASSWORD_VARIABLE, "")
    admin_file = folder / Path(D.GRAFANA_ADMIN_PASSWORD_FILE).name
    if not admin:  # a random one kept across runs: never the viewers' password, never Grafana's admin/admin
        kept = admin_file.read_text() if admin_file.is_file() else ""
        admin = kept if kept and kept != password else secrets.token_urlsafe(24)
    monitoring = _uid(environ, D.MONITORING_UID_VARIABLE, D.MONITORING_UID_DEFAULT)
    grafana = _uid(environ, D.GRAFANA_UID_VARIABLE, D.GRAFANA_UID_DEFAULT)
    files = {
        D.MONITORING_PASSWORD_FILE: (password, monitoring),
        D.MONITORING_WEB_CONFIG: (dump(web_config(password)), monitoring),
        D.MONITORING_WGETRC: (wgetrc(password), monitoring),
        D.MONITORING_PROMTOOL_HTTP_CONFIG: (dump(promtool_http_config(password)), monitoring),
        D.MONITORING_GRAFANA_INI: (grafana_ini(password, environ), grafana),
        D.GRAFANA_VIEWER_PASSWORD_FILE: (password, grafana),
        D.GRAFANA_ADMIN_PASSWORD_FILE: (admin, grafana),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for path, (text, owner) in files.items():
        target = folder / Path(path).name
        temporary = target.with_name(f".{target.name}.tmp")
        temporary.unlink(missing_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        if os.geteuid() == 0:
            os.chown(temporary, owner, owner)
        os.replace(temporary, target)


def ensure_viewer(grafana: str, admin_password: str, password: str, wait_s: float = 120.0) -> None:
    """Give `ornith` a Viewer login with the monitoring password in the Grafana at `grafana` (base URL), as
    its admin: created when missing, its password and role set again when present. Waits for Grafana."""
    admin = basic_auth(D.GRAFANA_ADMIN_USER, admin_password)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if fetch(f"{grafana}/api/health", 5).status == 200:
                break
        except WireError:
            pass
        if time.monotonic() > deadline:
            raise UserError(f"Grafana at {grafana} did not answer within {wait_s:.0f} s")
        time.sleep(1)
    found = fetch(f"{grafana}/api/users/lookup?loginOrEmail={D.MONITORING_USER}", 10, headers=admin)
    if found.status == 404:
        made = fetch(
            f"{grafana}/api/admin/users",
            10,
            "POST",
            headers=admin,
            json={"name": D.MONITORING_USER, "login": D.MONITORING_USER, "password": password},
        )
        answers = [made.status]
        user = made.json().get("id") if made.status == 200 else None
    else:
        user = found.json().get("id") if found.status == 200 else None
        answers = [found.status]
        if user is not None:
            answers.append(
                fetch(
                    f"{grafana}/api/admin/users/{user}/password", 10, "PUT", headers=admin, json={"password": password}
                ).status
            )
    if user is not None:
        answers.append(
            fetch(f"{grafana}/api/orgs/1/users/{user}", 10, "PATCH", headers=admin, json={"role": "Viewer"}).status
        )
    if user is None or any(status != 200 for status in answers):
        raise UserError(
            f"Grafana at {grafana} refused the admin {D.GRAFANA_ADMIN_USER} (answers {answers}): "
            f"its admin password is {D.GRAFANA_ADMIN_PASSWORD_FILE}; recreate grafana if it was changed"
        )


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    if argv[:1] == ["--viewer"]:  # compose's grafana-viewer one-shot: --viewer GRAFANA_URL [FOLDER]
        folder = Path(argv[2] if len(argv) > 2 else D.MONITORING_AUTH_DIR)
        password = environ.get(D.MONITORING_PASSWORD_VARIABLE, "")
        if password:  # without one, viewers are anonymous: no login to make
            try:
                admin = (folder / Path(D.GRAFANA_ADMIN_PASSWORD_FILE).name).read_text()
                ensure_viewer(argv[1], admin, password)
            except (UserError, WireError, OSError, ValueError) as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
        return 0
    problem = refusal(environ)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    write(Path(argv[0] if argv else D.MONITORING_AUTH_DIR), environ)
    return 0


if __name__ == "__main__":  # compose's monitoring-auth service: [FOLDER], the settings from the environment
    sys.exit(main(sys.argv[1:], os.environ))
