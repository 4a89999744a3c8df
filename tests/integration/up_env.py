"""The environment `ornith-stack up` runs in for the integration tests: the local images in place of those
that cannot be pulled here, free loopback ports, none of the caller's ORNITH_* settings."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from containers import remove_image
from images import ensure_base_images
from ports import free_port

PUBLISHED = ("ENGINE", "EXPORTER", "PROMETHEUS", "GRAFANA", "ALERTMANAGER")


@contextmanager
def up_environment(tag: str) -> Iterator[dict[str, str]]:
    """The variables for `up` (the local Python base and Prometheus, a stand-in Grafana tagged `tag`, each
    published port free); the stand-in is removed afterwards. Skips without Compose v2."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode != 0:
        pytest.skip("Compose v2 (`docker compose`) is not installed: run scripts/install-compose-v2.sh")
    bases = ensure_base_images("python", "prometheus")
    # Grafana cannot be pulled here and Debian has none: a page on :3000 lets every service start.
    grafana = f"ornith-it/grafana-standin:{tag}"
    subprocess.run(["docker", "build", "-q", "-t", grafana, "-"], check=True, capture_output=True, text=True,
                   input=f'FROM {bases["python"]}\nCMD ["python3", "-m", "http.server", "3000", "-d", "/tmp"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORNITH_", "GRAFANA_", "HF_TOKEN"))}
    env.update(ORNITH_PYTHON_BASE_IMAGE=bases["python"], ORNITH_PROMETHEUS_IMAGE=bases["prometheus"],
               ORNITH_ALERTMANAGER_IMAGE=bases["prometheus"], ORNITH_GRAFANA_IMAGE=grafana)
    env.update({f"ORNITH_{name}_PORT": str(free_port()) for name in PUBLISHED})
    try:
        yield env
    finally:
        remove_image(grafana)
