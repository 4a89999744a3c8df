"""The engine pod's readiness probe and drain (preStop hook), run by the engine image's own python3.

Helm runs the upstream engine images, without ornith-stack installed: this file is a part of the chart, uses
the standard library only, and each engine container runs it as `python3 -c <this file> ready|drain ...`
(templates/_engine.tpl, "ornith.engineLifecycle"). tests/unit/test_helm_rollout.py runs it against an engine.

- `ready` (the readiness probe): false while the pod drains (the container's drain marker exists); true once the engine's
  health route answers 200 and, the first time, one real generation (1 token through the chat route)
  succeeded, so a pod is ready when the engine can serve, not when its HTTP server is up. The generation is
  asked once: under load a probe that generates would queue behind the users' requests and flap.
- `drain` (the preStop hook, before Kubernetes sends SIGTERM): writes the marker, so the readiness probe
  fails and the Service and the Model Gateway stop sending new requests; waits the time readiness takes to
  turn false; then polls the engine's own running- and waiting-requests gauges on its /metrics until both
  read 0 twice in a row, or until the longest request the profile allows has passed.

Exit status: 0 ready (or drained), 1 not ready (or the bound was reached with requests still running).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

TIMEOUT_S = 4.0  # under the probe's timeoutSeconds (5)
POLL_S = 1.0


def _request(url: str, body: dict[str, object] | None = None, key: str = "", timeout: float = TIMEOUT_S) -> bytes:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as reply:
        return bytes(reply.read())


def _key(options: argparse.Namespace) -> str:
    if options.key_env:
        return os.environ.get(options.key_env, "")
    if options.key_file and Path(options.key_file).is_file():
        values = json.loads(Path(options.key_file).read_text())  # {"api-key": KEY}: the one value
        return str(next(iter(values.values()), "")) if isinstance(values, dict) else ""
    return ""


def container_start() -> str:
    """This container's start (its PID 1's start time, /proc/1/stat field 22): the markers live in an emptyDir
    that outlives a container restart (a liveness failure runs the preStop too), so each names the start it
    belongs to and a restarted engine is neither draining nor proven."""
    try:
        return Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "unknown"


def marked(path: str) -> bool:
    try:
        return bool(path) and Path(path).read_text().split("\n", 1)[0] == container_start()
    except OSError:
        return False


def mark(path: str, note: str) -> None:
    Path(path).write_text(f"{container_start()}\n{note}\n")


def ready(options: argparse.Namespace) -> int:
    base = f"http://127.0.0.1:{options.port}"
    if marked(options.marker):
        print("not ready: draining (preStop)")
        return 1
    try:
        _request(base + options.health_path)
    except (OSError, ValueError) as exc:
        print(f"not ready: {options.health_path}: {exc}")
        return 1
    if marked(options.served):
        return 0
    key = _key(options)
    try:
        models = json.loads(_request(base + options.models_path, key=key))
        model = models["data"][0]["id"]
        reply = json.loads(
            _request(
                base + options.chat_path,
                {"model": model, "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 1},
                key=key,
            )
        )
        reply["choices"][0]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        print(f"not ready: no generation yet: {exc}")
        return 1
    mark(options.served, model)
    print(f"ready: {model} generated a token")
    return 0


def in_flight(text: str, names: list[str]) -> float:
    """The sum of the samples of `names` (gauges, any labels) in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        name, _, rest = line.partition("{") if "{" in line.split(" ", 1)[0] else line.partition(" ")
        if name in names:
            total += float(rest.rsplit("}", 1)[-1].split()[0])
    return total


def drain(options: argparse.Namespace) -> int:
    mark(options.marker, "draining")
    print(f"drain: readiness false; waiting {options.unready_seconds} s for the endpoints and the gateway")
    time.sleep(options.unready_seconds)
    deadline = time.monotonic() + options.max_seconds
    host = os.environ.get(options.host_env, "") if options.host_env else "127.0.0.1"
    url = f"http://{host or '127.0.0.1'}:{options.port}{options.metrics_path}"
    idle = 0
    while time.monotonic() < deadline:
        try:
            count = in_flight(_request(url).decode(), options.metric)
        except (OSError, ValueError) as exc:
            print(f"drain: {options.metrics_path} unreadable ({exc}): the engine is not serving, nothing to wait for")
            return 0
        idle = idle + 1 if count == 0 else 0
        if idle >= 2:
            print("drain: no request running or waiting")
            return 0
        time.sleep(POLL_S)
    print(f"drain: requests still running after {options.max_seconds} s (the longest request the profile allows)")
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engine-lifecycle")
    parser.add_argument("action", choices=("ready", "drain"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--host-env",
        default="",
        help="drain: variable naming the host whose requests to wait for (a worker node: its leader's); none: this one",
    )
    parser.add_argument("--marker", required=True, help="file whose presence means: draining")
    parser.add_argument("--served", default="", help="file written once a generation succeeded")
    parser.add_argument("--health-path", default="/health")
    parser.add_argument("--models-path", default="/v1/models")
    parser.add_argument("--chat-path", default="/v1/chat/completions")
    parser.add_argument("--metrics-path", default="/metrics")
    parser.add_argument("--metric", action="append", default=[], help="running/waiting requests gauge")
    parser.add_argument("--key-env", default="", help="variable holding the engine's API key")
    parser.add_argument("--key-file", default="", help="JSON file {option: key} holding the engine's API key")
    parser.add_argument("--unready-seconds", type=float, default=0.0)
    parser.add_argument("--max-seconds", type=float, default=0.0)
    options = parser.parse_args(argv)
    return ready(options) if options.action == "ready" else drain(options)


if __name__ == "__main__":
    sys.exit(main())
