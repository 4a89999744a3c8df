"""One compose stack: a profile's compose file run under a project name, and what Docker says about it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ornith_stack import deployment
from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError
from ornith_stack.profiles.model import Profile
from ornith_stack.stack.envfile import KEY_VAR
from ornith_stack.stack.shell import Runner, first_line

PROJECT_PREFIX = "ornith-"


def find_checkout(start: Path) -> Path:
    """The ornith-stack checkout holding `start` (its compose/ files build from docker/ and mount monitoring/)."""
    for folder in (start, *start.parents):
        if (folder / "compose" / ".env.example").is_file() and (folder / "docker" / "engine.Dockerfile").is_file():
            return folder
    raise UserError(f"no ornith-stack checkout at or above {start}: run this in a clone of the repository "
                    "(its compose/, docker/ and monitoring/ folders are what `up` starts)")


@dataclass(frozen=True)
class Stack:
    profile: str
    project: str
    compose_file: Path
    env_file: Path | None

    def compose(self, *args: str) -> list[str]:
        files = ["-f", str(self.compose_file)] if self.compose_file.is_file() else []
        env = ["--env-file", str(self.env_file)] if self.env_file is not None and self.env_file.is_file() else []
        return ["docker", "compose", "-p", self.project, *files, *env, *args]


def stack_for(root: Path, profile: str, project: str | None, env_file: Path | None) -> Stack:
    compose_file = root / "compose" / f"{profile}.yml"
    if not compose_file.is_file():
        raise UserError(f"{compose_file} does not exist: `ornith-stack render` writes it from the profile")
    return Stack(profile, project or PROJECT_PREFIX + profile, compose_file,
                 env_file or compose_file.parent / ".env")


def running_stacks(run: Runner) -> list[Stack]:
    """Compose projects on this Docker whose file is one of our compose/PROFILE.yml."""
    result = run(["docker", "compose", "ls", "--all", "--format", "json"])
    if result.returncode != 0:
        raise UserError(f"`docker compose ls` failed ({first_line(result)}): is Docker running, with Compose v2?")
    stacks = []
    for item in json.loads(result.stdout or "[]"):
        for file in str(item.get("ConfigFiles", "")).split(","):
            path = Path(file)
            if path.parent.name == "compose" and path.suffix == ".yml" and (path.parent / ".env.example").is_file():
                stacks.append(Stack(path.stem, str(item["Name"]), path, path.parent / ".env"))
                break
    return stacks


def pick_stack(run: Runner, project: str | None) -> Stack:
    """The stack a day-2 command acts on: --project NAME, else the only one on this Docker."""
    stacks = running_stacks(run)
    if project is not None:
        chosen = [s for s in stacks if s.project in (project, PROJECT_PREFIX + project)]
        if not chosen:
            known = ", ".join(s.project for s in stacks) or "none"
            raise UserError(f"no ornith-stack project {project!r} on this Docker (projects: {known})")
        return chosen[0]
    if not stacks:
        raise UserError("no ornith-stack project on this Docker: `ornith-stack up` starts one")
    if len(stacks) > 1:
        raise UserError(f"several projects run ({', '.join(s.project for s in stacks)}): pass --project NAME")
    return stacks[0]


def compose_json(run: Runner, stack: Stack, *args: str) -> Any:
    result = run(stack.compose(*args))
    if result.returncode != 0:
        raise UserError(f"`docker compose {' '.join(args)}` failed: {first_line(result)}")
    text = result.stdout.strip()
    try:
        return json.loads(text or "[]")
    except ValueError:  # `ps --format json` writes one object per line
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def containers(run: Runner, stack: Stack) -> list[dict[str, Any]]:
    """`docker inspect` of every container of the project, running or not."""
    ids = run(stack.compose("ps", "--all", "--quiet")).stdout.split()
    if not ids:
        return []
    result = run(["docker", "inspect", *ids])
    return list(json.loads(result.stdout)) if result.returncode == 0 else []


def service_of(container: dict[str, Any]) -> str:
    return str((container.get("Config", {}).get("Labels") or {}).get("com.docker.compose.service", ""))


def stale_services(run: Runner, stack: Stack) -> list[str] | None:
    """The services without a running container (not restarting) made from the configuration compose
    resolves now (its own per-service hash) and from the image its tag names now, in compose's order; None
    when compose resolves no service."""
    result = run(stack.compose("config", "--hash", "*"))
    if result.returncode != 0:
        return None
    want = dict(line.split(None, 1) for line in result.stdout.splitlines() if len(line.split()) == 2)
    have = {service_of(c): (c.get("Config", {}).get("Labels") or {}).get("com.docker.compose.config-hash")
            for c in containers(run, stack) if _current(run, c)}
    return [service for service, digest in want.items() if have.get(service) != digest] if want else None


def _current(run: Runner, container: dict[str, Any]) -> bool:
    """Running steadily (or, for a one-shot service such as alertmanager-config, finished with exit code
    0 under no restart policy), from the image its tag points at today."""
    state = container.get("State", {})
    restart = ((container.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name") or "no"
    finished = restart == "no" and state.get("Status") == "exited" and state.get("ExitCode") == 0
    if not finished and (state.get("Status") != "running" or state.get("Restarting")):
        return False
    tag = run(["docker", "image", "inspect", "--format", "{{.Id}}", str(container.get("Config", {}).get("Image"))])
    return tag.returncode == 0 and tag.stdout.strip() == container.get("Image")


def container_address(run: Runner, stack: Stack, service: str, port: int) -> str | None:
    """host:port where this host reaches a service's container port: where compose publishes it, else the
    container's own address on its network (a bridge network is routed from the Docker host); None: no
    running container."""
    address = published(run, stack, service, port)
    if address is not None:
        return address
    for container in containers(run, stack):
        networks = (container.get("NetworkSettings") or {}).get("Networks") or {}
        ips = [n.get("IPAddress") for n in networks.values() if n.get("IPAddress")]
        if service_of(container) == service and container.get("State", {}).get("Running") and ips:
            return f"{ips[0]}:{port}"
    return None


def published(run: Runner, stack: Stack, service: str, port: int) -> str | None:
    """host:port where a service's container port is published, or None."""
    result = run(stack.compose("port", service, str(port)))
    address = result.stdout.strip().splitlines()[0] if result.returncode == 0 and result.stdout.strip() else ""
    if not address or address.endswith(":0"):
        return None
    host, _, host_port = address.rpartition(":")
    return f"{'127.0.0.1' if host in ('0.0.0.0', '::', '[::]') else host}:{host_port}"


@dataclass(frozen=True)
class Layout:
    """The services of a stack that serve the model: one engine, or replicas behind the Model Gateway."""

    engines: tuple[str, ...]
    gateway: str | None
    health_path: str  # the route the published endpoint answers 200 on once it can serve

    @property
    def endpoint(self) -> str:
        """The service that publishes the API port: the gateway in front of replicas, else the engine."""
        return self.gateway or self.engines[0]

    @property
    def services(self) -> tuple[str, ...]:
        return (*self.engines, *([self.gateway] if self.gateway else []))

    def named(self, name: str) -> list[str]:
        """The services `name` means: `engine` is every replica (the name one engine has and the prefix
        of theirs, so `ornith-stack logs engine` reads the same in both layouts), any other name itself."""
        return list(self.engines) if name == deployment.ENGINE_SERVICE else [name]


def layout_for(profile: Profile) -> Layout:
    """The serving services compose/PROFILE.yml has (the template names them from the same facts)."""
    engines = tuple(deployment.engine_services(profile.serve.replicas))
    gateway = deployment.gateway_service(len(engines))
    health = deployment.GATEWAY_HEALTH_PATH if gateway else adapter_for(profile).health_path
    return Layout(engines, gateway, health)


def service_environment(run: Runner, stack: Stack, service: str) -> dict[str, str]:
    """A service's environment as compose resolves it now (the env file and the caller's variables in)."""
    services = compose_json(run, stack, "config", "--format", "json").get("services", {})
    environment = (services.get(service) or {}).get("environment") or {}  # `config` writes a mapping
    return {str(k): "" if v is None else str(v) for k, v in environment.items()}


def gateway_keyed(run: Runner, stack: Stack, layout: Layout) -> bool:
    """Whether the stack's gateway gets the API key (its launcher reads it from the environment): only then
    are its worker-management routes expected to refuse a request without it."""
    return layout.gateway is not None and bool(service_environment(run, stack, layout.gateway).get(KEY_VAR))


def stack_services(run: Runner, stack: Stack) -> list[str]:
    """The services of the stack's compose file, as compose resolves it (none known without the file)."""
    if not stack.compose_file.is_file():
        return []
    return sorted(compose_json(run, stack, "config", "--format", "json").get("services", {}))


def log_services(known: list[str], layout: Layout, name: str | None) -> list[str]:
    """The services `logs NAME` reads (none: every one); a name the stack does not have is one error listing
    those it has (`known` empty: not checked, compose answers for itself)."""
    if name is None:
        return []
    wanted = layout.named(name)
    unknown = [s for s in wanted if known and s not in known]
    if unknown:
        raise UserError(f"no service {name!r} in this stack; its services: {', '.join(known)}")
    return wanted
