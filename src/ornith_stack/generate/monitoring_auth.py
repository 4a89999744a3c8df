"""Compose's monitoring-auth one-shot: the files that make Prometheus, Alertmanager and Grafana ask for a
password, written into the volume they mount at /auth before they start.

With ORNITH_MONITORING_PASSWORD set: Prometheus' and Alertmanager's web config (`--web.config.file`)
holds user `ornith` with a bcrypt hash of it, so both answer 401 without it; Grafana's settings turn the
anonymous viewer off and the login on (the admin is `ornith`, that password). Without it: an empty web
config (no authentication) and Grafana as before, anonymous viewers and no login unless the operator's
ORNITH_GRAFANA_LOGIN_DISABLED / ORNITH_GRAFANA_BASIC_AUTH say otherwise; and the one-shot refuses to run
when ORNITH_MONITORING_BIND leaves loopback, so that Prometheus, Alertmanager and Grafana (which wait for
it) never start unauthenticated beyond this machine.

The password file is what Prometheus sends to itself and to Alertmanager (`basic_auth.password_file` in
monitoring/prometheus/prometheus.yml) and what Grafana's admin reads (`$__file{}`). The files are
world-readable inside the volume: three images read them as three users (nobody, grafana's 472, Debian's
prometheus), and only those containers mount it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

import bcrypt

from ornith_stack import deployment as D
from ornith_stack.generate.prometheus import dump
from ornith_stack.urls import is_loopback

# bcrypt cost 2^10: Prometheus checks the hash on every request it has not cached (scrapes, healthchecks).
BCRYPT_COST = 10
LOGIN_DISABLED_ENV = "ORNITH_GRAFANA_LOGIN_DISABLED"
BASIC_AUTH_ENV = "ORNITH_GRAFANA_BASIC_AUTH"


def bcrypt_hash(password: str) -> str:
    """The $2b$ hash Prometheus' and Alertmanager's web config take (exporter-toolkit's basic_auth_users)."""
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=BCRYPT_COST)).decode("ascii")


def web_config(password: str) -> dict[str, object]:
    """Prometheus' and Alertmanager's web config: basic auth for `ornith` with `password`; none without."""
    return {"basic_auth_users": {D.MONITORING_USER: bcrypt_hash(password)}} if password else {}


def _flag(value: str, default: bool) -> str:
    return str(default if value.strip().lower() not in ("true", "false") else value.strip().lower() == "true").lower()


def grafana_ini(password: str, environ: Mapping[str, str]) -> str:
    """Grafana's settings: a login as `ornith` with the password, else the anonymous viewer of loopback."""
    if password:
        auth = {
            "auth": {"disable_login_form": "false"},
            "auth.anonymous": {"enabled": "false"},
            "auth.basic": {"enabled": "true"},
            "security": {
                "admin_user": D.MONITORING_USER,
                "admin_password": "$__file{" + D.MONITORING_PASSWORD_FILE + "}",
            },
        }
    else:
        auth = {
            "auth": {"disable_login_form": _flag(environ.get(LOGIN_DISABLED_ENV, ""), True)},
            "auth.anonymous": {"enabled": "true", "org_role": "Viewer"},
            "auth.basic": {"enabled": _flag(environ.get(BASIC_AUTH_ENV, ""), False)},
        }
    return "\n".join(
        f"[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()) for section, keys in auth.items()
    )


def ready_url(password: str) -> str:
    """Prometheus' readiness route as its healthcheck fetches it (the credentials in the URL)."""
    login = f"{quote(D.MONITORING_USER, safe='')}:{quote(password, safe='')}@" if password else ""
    return f"http://{login}127.0.0.1:{D.PROMETHEUS_PORT}/-/ready"


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


def write(folder: Path, environ: Mapping[str, str]) -> None:
    """The four files, each replaced whole (a shorter password leaves nothing of the longer one)."""
    password = environ.get(D.MONITORING_PASSWORD_VARIABLE, "")
    files = {
        D.MONITORING_PASSWORD_FILE: password,
        D.MONITORING_WEB_CONFIG: dump(web_config(password)),
        D.MONITORING_GRAFANA_INI: grafana_ini(password, environ),
        D.MONITORING_READY_URL_FILE: ready_url(password),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        target = folder / Path(path).name
        temporary = target.with_name(f".{target.name}.tmp")
        temporary.write_text(text)
        temporary.chmod(0o444)
        os.replace(temporary, target)


def main(argv: list[str], environ: Mapping[str, str]) -> int:
    problem = refusal(environ)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    write(Path(argv[0] if argv else D.MONITORING_AUTH_DIR), environ)
    return 0


if __name__ == "__main__":  # compose's monitoring-auth service: [FOLDER], the settings from the environment
    sys.exit(main(sys.argv[1:], os.environ))
