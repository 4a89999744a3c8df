"""tests/integration/containers.py against the real Docker daemon (needs Docker and the local base images).

One systemd-host container (about 10 s to boot) carries a compose project label and publishes a port on
loopback; a throwaway tag of the Debian base goes through save, remove and load; one-shot containers of the
Debian base run and are removed. Prints its wall time.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from containers import (
    ContainerError,
    client,
    exec_in,
    image_exists,
    image_id,
    inspect,
    load_image,
    project_containers,
    published_ports,
    remove_container,
    remove_image,
    run_detached,
    run_once,
    save_image,
)
from images import SYSTEMD_HOST_RUN_OPTIONS, ensure_base_images, wait_for_systemd

pytestmark = pytest.mark.integration

PROJECT = f"ornith-it-sdk-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def host() -> Iterator[str]:
    """A booted systemd-host container in compose project PROJECT, publishing 8080/tcp on 127.0.0.1."""
    image = ensure_base_images("systemd-host")["systemd-host"]
    name = f"{PROJECT}-host"
    started = time.monotonic()
    run_detached(
        image,
        name,
        labels={"com.docker.compose.project": PROJECT, "com.docker.compose.service": "host"},
        ports={"8080/tcp": ("127.0.0.1", None)},
        **SYSTEMD_HOST_RUN_OPTIONS,
    )
    try:
        assert wait_for_systemd(name) in ("running", "degraded")
        print(f"\nsystemd-host booted in {time.monotonic() - started:.1f} s")
        yield name
    finally:
        remove_container(name)


def test_exec_returns_exit_code_and_output(host: str) -> None:
    code, output = exec_in(host, "sh", "-c", "echo hello; echo oops >&2; exit 3")
    # Docker multiplexes stdout and stderr as two streams: their interleaving is not defined.
    assert (code, sorted(output.splitlines())) == (3, ["hello", "oops"])


def test_exec_with_check_raises_naming_the_command_and_its_exit(host: str) -> None:
    assert exec_in(host, "true", check=True) == (0, "")
    with pytest.raises(ContainerError, match=r"\('sh', '-c', 'echo nope; exit 5'\) in container .* exited 5:\nnope"):
        exec_in(host, "sh", "-c", "echo nope; exit 5", check=True)


def test_inspect_answers_what_docker_inspect_prints(host: str) -> None:
    state = inspect(host)
    assert state["Name"] == f"/{host}"
    assert state["State"]["Running"] is True
    assert state["Config"]["Labels"]["com.docker.compose.project"] == PROJECT


def test_run_once_keeps_stdout_and_stderr_apart_and_leaves_no_container() -> None:
    base = ensure_base_images("debian")["debian"]

    def from_base() -> set[str]:
        return {c.id for c in client().containers.list(all=True, filters={"ancestor": base})}

    before = from_base()
    result = run_once(base, ["sh", "-c", "echo out; echo err >&2; exit 4"])
    assert (result.exit_code, result.stdout, result.stderr) == (4, "out\n", "err\n")
    assert run_once(base, ["-c", "echo $GREETING"], environment={"GREETING": "hi"}, entrypoint="sh").stdout == "hi\n"
    assert from_base() - before == set()


def test_project_containers_finds_the_labelled_container_only(host: str) -> None:
    assert [c.name for c in project_containers(PROJECT)] == [host]
    assert [c.name for c in project_containers(PROJECT, "host")] == [host]
    assert project_containers(PROJECT, "engine") == []


def test_published_ports_name_the_loopback_binding(host: str) -> None:
    bindings = published_ports(host, 8080)
    assert len(bindings) == 1 and bindings[0][0] == "127.0.0.1" and bindings[0][1] > 0, bindings
    assert published_ports(host, 9999) == []


def test_save_remove_load_brings_the_tag_back(tmp_path: Path) -> None:
    base = ensure_base_images("debian")["debian"]
    tag = f"ornith-it/sdk-roundtrip:{PROJECT}"
    started = time.monotonic()
    client().images.get(base).tag(tag)
    try:
        archive = tmp_path / "image.tar"
        save_image(tag, archive)
        remove_image(tag)
        assert not image_exists(tag)
        assert tag in load_image(archive)
        assert image_id(tag) == image_id(base)
    finally:
        remove_image(tag)
    print(f"\nsave + load of {base} took {time.monotonic() - started:.1f} s")
