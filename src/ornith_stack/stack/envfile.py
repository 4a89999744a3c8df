"""compose/.env: the variables compose reads, and the secrets kept there (mode 0600): the API key (the users'),
the operator's credential and the monitoring password."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ornith_stack import deployment
from ornith_stack.errors import UserError
from ornith_stack.urls import is_loopback

KEY_VAR = "ORNITH_API_KEY"
# The operator's credential: the gateway's worker routes and SGLang's admin routes, which the users' key
# (KEY_VAR) must not reach.
OPERATOR_VAR = "ORNITH_OPERATOR_KEY"
PASSWORD_VAR = deployment.MONITORING_PASSWORD_VARIABLE
# What a secret (the API key, the monitoring password) may hold, checked once for every consumer: visible
# ASCII. A line break would end its line in compose/.env and make the rest a setting of its own
# (`k<newline>ORNITH_BIND=0.0.0.0`); a space or a control character breaks the `Authorization: Bearer` header
# clients send it in; compose interpolates `$` in compose/.env (`k$HOME` reached the engines as `k/root`) and
# strips or keeps quotes by rules of its own, and a YAML or shell reader of the value has its own for `\` and
# backquotes: none of those five.
_UNQUOTABLE = "$'\"\\`"
_KEY_CHARS = frozenset(chr(c) for c in range(0x21, 0x7F)) - set(_UNQUOTABLE)


@dataclass(frozen=True)
class Secret:
    value: str  # empty: none (the API, or monitoring, is unauthenticated)
    where: str  # what `up` tells the user about where it is kept
    created: bool = False


def read_env(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a compose env file (comments and blank lines skipped, quotes removed)."""
    if not path.is_file():
        return {}
    values = {}
    for line in path.read_text().splitlines():
        name, sep, value = line.strip().partition("=")
        if sep and name and not name.startswith("#"):
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            values[name.strip()] = value
    return values


def set_env(path: Path, name: str, value: str) -> None:
    """Set one variable in the env file, keeping every other line; the file ends up mode 0600."""
    lines = path.read_text().splitlines() if path.is_file() else []
    kept = [line for line in lines if line.strip().partition("=")[0].strip() != name]
    kept.append(f"{name}={value}")
    write_private(path, "\n".join(kept) + "\n")


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text` at once (a reader sees the old file or the new one), mode 0600."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(temporary, path)
    os.chmod(path, 0o600)


def check_key(value: str, where: str = f"${KEY_VAR}") -> str:
    """`value`, if it is usable as an API key; else a UserError that does not echo it."""
    if set(value) - _KEY_CHARS:
        raise UserError(f"{where} holds a line break, space, control or non-ASCII character, or one of "
                        f"{' '.join(_UNQUOTABLE)} (compose would change those in its env file): use visible ASCII without those (e.g. python3 -c 'import "
                        "secrets; print(secrets.token_urlsafe(32))')")
    return value


def check_secrets(path: Path, environ: Mapping[str, str]) -> None:
    """Both secrets `up` keeps, from the environment and the env file, checked before either is written: a
    refused monitoring password must not leave a new API key behind."""
    stored = read_env(path)
    limit = deployment.MONITORING_PASSWORD_MAX_BYTES
    for name in (KEY_VAR, OPERATOR_VAR, PASSWORD_VAR):
        for where, given in ((f"${name}", environ.get(name, "")), (f"{name} in {path}", stored.get(name, ""))):
            check_key(given, where)
            if name == PASSWORD_VAR and len(given.encode()) > limit:
                raise UserError(f"{where} is longer than bcrypt's {limit} bytes (Prometheus and Alertmanager check "
                                "a bcrypt hash of it): use a shorter one")


def kept_secret(path: Path, environ: Mapping[str, str], name: str, create: bool) -> Secret:
    """$NAME, else the env file's, else (`create`) a new one; kept in the env file (0600) so that a later
    plain `docker compose` starts the same stack. Neither and not `create`: none (an empty value)."""
    given = check_key(environ.get(name, ""), f"${name}")
    stored = check_key(read_env(path).get(name, ""), f"{name} in {path}")
    value = given or stored or (secrets.token_urlsafe(32) if create else "")
    if value and (value != stored or (path.stat().st_mode & 0o777) != 0o600):
        set_env(path, name, value)
    source = f"from ${name}, " if given else "" if stored else "new, "
    return Secret(value, f"{name} in {path} ({source}mode 0600)", created=bool(value) and not given and not stored)


def api_key(path: Path, environ: Mapping[str, str], wanted: bool) -> Secret:
    """The key the stack runs with (kept_secret); `wanted` False: no key."""
    if not wanted:
        return Secret("", "none: the API is unauthenticated (--no-api-key)")
    return kept_secret(path, environ, KEY_VAR, create=True)


def operator_key(path: Path, environ: Mapping[str, str], wanted: bool) -> Secret:
    """The operator's credential, kept like the API key (kept_secret); `wanted` False: none (there is no API
    key either, so nothing tells an operator from a user)."""
    if not wanted:
        return Secret("", "none: no API key (--no-api-key)")
    stored = read_env(path)
    given = environ.get(OPERATOR_VAR) or stored.get(OPERATOR_VAR, "")
    if given and given == (environ.get(KEY_VAR) or stored.get(KEY_VAR)):
        raise UserError(f"{OPERATOR_VAR} equals {KEY_VAR}: the operator's credential must differ from the "
                        f"users' key (unset {OPERATOR_VAR} and `up` makes one)")
    return kept_secret(path, environ, OPERATOR_VAR, create=True)


def monitoring_password(path: Path, environ: Mapping[str, str], bind: str) -> Secret:
    """The password Prometheus, Alertmanager and Grafana ask for: a new one when `bind`
    (ORNITH_MONITORING_BIND) leaves loopback and none is set; on loopback, only the operator's."""
    check_secrets(path, environ)  # refused before the env file is touched
    found = kept_secret(path, environ, PASSWORD_VAR, create=not is_loopback(bind))
    return found if found.value else Secret("", "none: Prometheus, Alertmanager and Grafana ask for no login "
                                                "(they are published on loopback only)")

