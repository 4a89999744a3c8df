"""The Docker operations the integration tests need, through the Docker SDK for Python (docker.from_env()).

Every failure raises ContainerError naming the operation and the object it was done on; a missing image is
an answer (None / False), not an error. Building images and the README's `docker compose` command stay on the
CLI: they are what users type.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, NamedTuple

import requests
from docker.errors import DockerException, ImageNotFound, NotFound
from docker.models.containers import Container

import docker

# Saving or loading a 3 GB engine image over the socket takes minutes; the SDK's default read timeout is 60 s.
_CLIENT_TIMEOUT_S = 900

COMPOSE_PROJECT_LABEL = "com.docker.compose.project"
COMPOSE_SERVICE_LABEL = "com.docker.compose.service"


class ContainerError(RuntimeError):
    """A Docker operation failed; the message names the operation, its object and the daemon's reason."""


@cache
def client() -> docker.DockerClient:
    """One client per test session, talking to the daemon DOCKER_HOST (or the default socket) names."""
    try:
        return docker.from_env(timeout=_CLIENT_TIMEOUT_S)
    except DockerException as exc:
        raise ContainerError(f"cannot reach the Docker daemon: {exc}") from exc


def daemon_available() -> bool:
    """True when a Docker daemon answers a ping."""
    try:
        return bool(client().ping())
    except (ContainerError, DockerException):
        return False


def image_id(ref: str) -> str | None:
    """The id (sha256:...) of the local image `ref`, or None when the daemon has no such image."""
    try:
        return str(client().images.get(ref).id)
    except ImageNotFound:
        return None
    except DockerException as exc:
        raise ContainerError(f"cannot inspect image {ref}: {exc}") from exc


def image_exists(ref: str) -> bool:
    return image_id(ref) is not None


def remove_image(ref: str) -> None:
    """Untag `ref` (like `docker rmi --force`: also when a stopped container uses it); a missing image is fine."""
    try:
        client().images.remove(ref, force=True)
    except ImageNotFound:
        return
    except DockerException as exc:
        raise ContainerError(f"cannot remove image {ref}: {exc}") from exc


def project_containers(project: str, service: str | None = None) -> list[Container]:
    """The containers (running or stopped) of a compose project, optionally only one service's."""
    labels = [f"{COMPOSE_PROJECT_LABEL}={project}"]
    if service is not None:
        labels.append(f"{COMPOSE_SERVICE_LABEL}={service}")
    try:
        return list(client().containers.list(all=True, filters={"label": labels}))
    except DockerException as exc:
        raise ContainerError(f"cannot list the containers of compose project {project}: {exc}") from exc


def get_container(name_or_id: str) -> Container:
    try:
        return client().containers.get(name_or_id)
    except DockerException as exc:
        raise ContainerError(f"cannot find container {name_or_id}: {exc}") from exc


def published_ports(container: str, port: int, protocol: str = "tcp") -> list[tuple[str, int]]:
    """The (host address, host port) pairs where `container` publishes `port`; [] when it publishes none."""
    bindings = get_container(container).ports.get(f"{port}/{protocol}") or []
    return [(b["HostIp"], int(b["HostPort"])) for b in bindings]


def exec_in(container: str, *argv: str, check: bool = False) -> tuple[int, str]:
    """Run argv in a running container; return (exit code, stdout and stderr together, decoded).

    check: raise ContainerError (with the exit code and output) when argv exits non-zero.
    """
    try:
        result = get_container(container).exec_run(list(argv))
    except DockerException as exc:
        raise ContainerError(f"cannot exec {argv!r} in container {container}: {exc}") from exc
    code, output = int(result.exit_code), result.output.decode(errors="replace")
    if check and code != 0:
        raise ContainerError(f"{argv!r} in container {container} exited {code}:\n{output[-3000:]}")
    return code, output


def inspect(container: str) -> dict[str, Any]:
    """What `docker inspect CONTAINER` prints for it (the daemon's answer, fetched now)."""
    return dict(get_container(container).attrs)


class RunResult(NamedTuple):
    exit_code: int
    stdout: str
    stderr: str


def run_once(
    image: str,
    command: list[str] | tuple[str, ...],
    environment: dict[str, str] | None = None,
    entrypoint: str | None = None,
    timeout_s: float = 300,
) -> RunResult:
    """Run a command in a throwaway container and remove it, like `docker run --rm [--entrypoint E] [-e ...]`.

    Returns the exit code and, kept apart as the CLI keeps them, stdout and stderr; a non-zero exit is an
    answer, not an error. ContainerError when the container cannot be made or does not exit within timeout_s.
    """
    try:
        container = client().containers.create(image, list(command), environment=environment, entrypoint=entrypoint)
    except DockerException as exc:
        raise ContainerError(f"cannot create a container from {image} for {command!r}: {exc}") from exc
    try:
        container.start()
        status = container.wait(timeout=timeout_s)
        stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
        stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
    except (DockerException, requests.RequestException) as exc:
        raise ContainerError(f"cannot run {command!r} in a container from {image}: {exc}") from exc
    finally:
        remove_container(container.id)
    return RunResult(int(status["StatusCode"]), stdout, stderr)


def run_detached(image: str, name: str, **options: Any) -> Container:
    """Start a container like `docker run -d --name NAME`; options are containers.run's keyword arguments."""
    try:
        return client().containers.run(image, name=name, detach=True, **options)
    except DockerException as exc:
        raise ContainerError(f"cannot start container {name} from {image}: {exc}") from exc


def remove_container(name_or_id: str) -> None:
    """Remove a container and its anonymous volumes, running or not (`docker rm -f -v`); a missing one is fine."""
    try:
        client().containers.get(name_or_id).remove(force=True, v=True)
    except NotFound:
        return
    except DockerException as exc:
        raise ContainerError(f"cannot remove container {name_or_id}: {exc}") from exc


def save_image(ref: str, archive: Path) -> None:
    """Write image `ref` with its tag to a `docker save` archive (what `docker load` reads back)."""
    try:
        image = client().images.get(ref)
        named: str | bool = ref if ref in image.tags else True
        with archive.open("wb") as out:
            for chunk in image.save(named=named):
                out.write(chunk)
    except DockerException as exc:
        raise ContainerError(f"cannot save image {ref} to {archive}: {exc}") from exc


def load_image(archive: Path) -> list[str]:
    """Load a `docker save` archive into the daemon; return the tags it brought."""
    try:
        with archive.open("rb") as data:
            images = client().images.load(data)
    except DockerException as exc:
        raise ContainerError(f"cannot load image archive {archive}: {exc}") from exc
    return [tag for image in images for tag in image.tags]
