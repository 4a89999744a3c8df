"""The Model Gateway's launcher: sglang-router 0.3.2 (`smg`) keyed from the environment, off its command line.

smg 0.3.2 takes its keys only as flags (`--api-key`, `--control-plane-api-keys`: no variable, no configuration
file), and a flag is in /proc/PID/cmdline, which every user of the machine can read. This launcher parses the
gateway's argv with smg's own parser, puts the keys from the environment into the parsed arguments, removes
them from the environment and starts smg in this process: no key ever reaches an argv.

Two roles:
- $ORNITH_API_KEY, the users' key (the data plane): chat and the other inference routes; smg sends it on
  to the workers, whose key it is.
- $ORNITH_OPERATOR_KEY, the operator's credential: smg's control plane (`--control-plane-api-keys`, role
  admin), i.e. /workers (list, add, remove), /get_loads, /flush_cache. With a control-plane key configured smg
  answers 401 to the users' key there. Without $ORNITH_OPERATOR_KEY the control plane gets a random key
  nobody knows: the worker routes are closed to everyone (static workers need none).

Fail closed: without $ORNITH_API_KEY the launcher refuses to listen beyond loopback.

The gateway image runs this file as its entrypoint (docker/gateway.Dockerfile copies it); it imports
nothing of ornith-stack, which that image does not carry.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import sys

KEY_VARIABLE = "ORNITH_API_KEY"
OPERATOR_VARIABLE = "ORNITH_OPERATOR_KEY"
# smg's flags that carry a key, with the variable that replaces each.
SECRET_FLAGS = {"--api-key": KEY_VARIABLE, "--control-plane-api-keys": OPERATOR_VARIABLE}
# The control-plane key's id and name in smg's audit log, and its role (admin: the worker routes).
OPERATOR_ID, OPERATOR_NAME, OPERATOR_ROLE = "ornith-operator", "ornith-stack operator", "admin"


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def secret_flag(word: str) -> str | None:
    """The secret flag `word` spells, in full or as an abbreviation argparse would expand (`--api-ke=K`)."""
    if not word.startswith("--"):
        return None
    flag = word.partition("=")[0]
    return next((f for f in SECRET_FLAGS if len(flag) > 2 and f.startswith(flag)), None)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    for word in argv:
        flag = secret_flag(word)
        if flag:  # not echoed: the word itself, or the one after it, is the key
            return _error(f"pass the gateway's key in ${SECRET_FLAGS[flag]}, not as {flag} (a flag is visible in ps)")
    key = os.environ.pop(KEY_VARIABLE, "")
    operator = os.environ.pop(OPERATOR_VARIABLE, "")
    if operator and operator == key:
        return _error(f"${OPERATOR_VARIABLE} must differ from ${KEY_VARIABLE}: the users' key would steer the "
                      "gateway's workers")
    from sglang_router.launch_router import launch_router, parse_router_args  # type: ignore[import-untyped]

    args = parse_router_args(argv)
    if not key and not _loopback(str(args.host)):
        return _error(f"no ${KEY_VARIABLE}: refusing to serve the gateway on {args.host} without a key "
                      "(set it, or --host 127.0.0.1)")
    if key:
        args.api_key = key
    # (id, name, key, role): the tuple smg's own parser makes of `id:name:role:key`.
    args.control_plane_api_keys = [(OPERATOR_ID, OPERATOR_NAME, operator or secrets.token_urlsafe(32),
                                    OPERATOR_ROLE)]
    if not operator:
        print(f"ornith-gateway: no ${OPERATOR_VARIABLE}: the worker routes are closed to everyone", file=sys.stderr)
    launch_router(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
