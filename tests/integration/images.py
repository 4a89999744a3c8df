"""Local base images for the integration tests, made once per machine by scripts/make-base-images.sh.

No image registry is reachable on the build machines, so every Dockerfile the tests build takes
`--build-arg BASE_IMAGE=<one of these tags>`. Fixtures call `ensure_base_images()`; the script is
idempotent (an existing, current tag is kept) and caches under $ORNITH_CACHE_DIR, so the call is cheap
after the first run.

The systemd host must be started with `SYSTEMD_HOST_RUN_OPTIONS` (see the script's header for why).
"""

from __future__ import annotations

import subprocess
import time
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from containers import daemon_available, exec_in

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "make-base-images.sh"

# What boots ornith-local/systemd-host here (Docker 20.10, cgroup v1), as keyword arguments of
# containers.run_detached (the Docker SDK's containers.run): `docker run --cgroupns=host
# -v /sys/fs/cgroup:/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock`; --privileged fails.
SYSTEMD_HOST_RUN_OPTIONS: dict[str, Any] = {
    "cgroupns": "host",
    "volumes": {"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}},
    "tmpfs": {"/run": "", "/run/lock": ""},
}

# A cold build (debootstrap plus three apt-based builds) took about 5 minutes here; leave room for a slow mirror.
_TIMEOUT_S = 1800


@cache
def ensure_base_images(*names: str) -> dict[str, str]:
    """Make (or find) the local base images and return {name: tag}.

    names: any of "debian", "python", "prometheus", "systemd-host"; none means all of them.
    Skips the calling test when Docker is missing; fails it with the script's own message otherwise.
    """
    if not daemon_available():
        pytest.skip("Docker daemon not reachable: cannot make the local base images")
    result = subprocess.run(
        ["bash", str(SCRIPT), *names],
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        pytest.fail(f"{SCRIPT.name} failed (exit {result.returncode}):\n{tail}", pytrace=False)
    return _parse_tags(result.stdout)


def wait_for_systemd(container: str, timeout_s: float = 60.0) -> str:
    """Wait until systemd in a started systemd-host container has finished booting; return its state.

    Right after `docker run` systemctl answers "Failed to connect to bus" for a moment, so poll.
    The state is "running" on a clean boot, "degraded" when a unit failed (worth failing a test on).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        # coreutils `timeout` bounds the exec inside the container; the SDK client only bounds each socket read.
        _, output = exec_in(container, "timeout", str(int(timeout_s)), "systemctl", "is-system-running", "--wait")
        state = output.strip()
        if state in ("running", "degraded") or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def _parse_tags(stdout: str) -> dict[str, str]:
    """The script prints one `name=tag` line per image it was asked for."""
    tags: dict[str, str] = {}
    for line in stdout.splitlines():
        name, sep, tag = line.partition("=")
        if sep and tag:
            tags[name.strip()] = tag.strip()
    return tags
