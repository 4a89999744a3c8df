"""Compose's api-key-check one-shot (the exporter and the monitoring services start after it) and the engine
entrypoint's own check, so a plain `docker compose up` never serves the API beyond loopback without a key.
The engines do not wait for the one-shot: compose recreates a service whose dependency it recreates, and a new
exporter image must not restart an engine.

It refuses (one `error:` line, exit 1) when ORNITH_BIND leaves loopback and ORNITH_API_KEY is empty, when a
key is no bearer token, and when the operator's credential (ORNITH_OPERATOR_KEY) is the users' key. `up` and
Ansible refuse the same before they start anything; this is the compose file's own guard.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from ornith_stack.errors import UserError
from ornith_stack.stack.envfile import KEY_VAR, OPERATOR_VAR, check_key
from ornith_stack.urls import is_loopback

BIND_VAR = "ORNITH_BIND"


def refusal(environ: Mapping[str, str]) -> str | None:
    """Why the API must not start with these settings; None when it may."""
    bind = environ.get(BIND_VAR) or "127.0.0.1"
    try:
        key = check_key(environ.get(KEY_VAR, ""))
        operator = check_key(environ.get(OPERATOR_VAR, ""), f"${OPERATOR_VAR}")
    except UserError as exc:
        return str(exc)
    if not key and not is_loopback(bind):
        return (
            f"{BIND_VAR}={bind} publishes the API beyond loopback without {KEY_VAR}: set {KEY_VAR} in compose/.env "
            f"(`ornith-stack up` makes one), or {BIND_VAR}=127.0.0.1"
        )
    if operator and operator == key:
        return (f"{OPERATOR_VAR} equals {KEY_VAR}: the users' key would unlock the admin and worker routes (give the "
                "operator a credential of its own)")
    return None


def main(environ: Mapping[str, str]) -> int:
    problem = refusal(environ)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # compose's api-key-check service: the settings from the environment
    sys.exit(main(os.environ))
