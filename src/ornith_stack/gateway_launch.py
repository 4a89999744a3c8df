"""The Model Gateway's launcher: sglang-router 0.3.2 (`smg`) keyed from $ORNITH_API_KEY, off its command line.

smg 0.3.2 takes its API key only as the flag `--api-key` (no variable, no configuration file), and a flag
is in /proc/PID/cmdline, which every user of the machine can read. This launcher parses the gateway's
argv with smg's own parser, puts the key from the environment into the parsed arguments, removes it
from the environment and starts smg in this process: the key never reaches an argv. With a key, smg
answers 401 to every route but /v1/models, /liveness, /readiness and /health (its worker-management
routes /workers, /get_loads and /flush_cache included) and sends the key to the workers, whose key it is.

The gateway image runs this file as its entrypoint (docker/gateway.Dockerfile copies it); it imports
nothing of ornith-stack, which that image does not carry.
"""

from __future__ import annotations

import os
import sys

KEY_VARIABLE = "ORNITH_API_KEY"
KEY_FLAG = "--api-key"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(word == KEY_FLAG or word.startswith(KEY_FLAG + "=") for word in argv):
        # Not echoed: the word after it is the key.
        print(f"error: pass the gateway's key in ${KEY_VARIABLE}, not as {KEY_FLAG} (a flag is visible in ps)",
              file=sys.stderr)
        return 2
    key = os.environ.pop(KEY_VARIABLE, "")
    from sglang_router.launch_router import launch_router, parse_router_args  # type: ignore[import-untyped]

    args = parse_router_args(argv)
    if key:
        args.api_key = key
    else:
        print(f"ornith-gateway: no ${KEY_VARIABLE}: the gateway and its worker routes are open to anyone who "
              "reaches its port", file=sys.stderr)
    launch_router(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
