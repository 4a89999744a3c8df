"""Per-profile files: compose/<p>.yml, helm/ornith/values-<p>.yaml and ansible/profiles/<p>.yml."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ornith_stack import deployment
from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError, shown
from ornith_stack.generate import monitoring_auth
from ornith_stack.generate.core import TEMPLATES, GeneratedFile, environment, render, require_targets, with_header
from ornith_stack.planner.disk import disk_need
from ornith_stack.planner.layout import Layout, profile_document
from ornith_stack.profiles import images, load_profile, shipped_profile_names
from ornith_stack.profiles.images import parse_image
from ornith_stack.profiles.model import Profile
from ornith_stack.sizing.shapes import load_shape

# Placeholders for values an operator must supply at deploy time (a model the seed does not name).
# Each target format spells "required" its own way, so the profile stays free of deployment syntax.
REQUIRED_PLACEHOLDER = {
    "compose": "${{ORNITH_{KEY}:?set ORNITH_{KEY} in compose/.env: {hint}}}",
    # Kubernetes expands $(VAR) in container args from the container's environment; the chart sets
    # that variable from a required value.
    "helm": "$(ORNITH_{KEY})",
    "ansible": "{{{{ ornith_{key} }}}}",
}

# (output path pattern, template, placeholder style)
TARGETS = (
    ("compose/{name}.yml", "compose.yml.j2", "compose"),
    ("helm/ornith/values-{name}.yaml", "helm-values.yaml.j2", "helm"),
    ("ansible/profiles/{name}.yml", "ansible-profile.yml.j2", "ansible"),
)


def with_placeholders(profile: Profile, style: str) -> Profile:
    """`profile` with each missing model/draft repository replaced by `style`'s required-value syntax."""
    updates: dict[str, Any] = {}
    for which in ("model", "draft"):
        ref = getattr(profile, which)
        if ref is not None and not ref.repo:
            key = f"{which}_repo"
            text = REQUIRED_PLACEHOLDER[style].format(
                KEY=key.upper(), key=key, hint=ref.missing_hint or "not named by the seed"
            )
            updates[which] = ref.model_copy(update={"repo": text})
    return profile.model_copy(update=updates)


def replica_sets(profile: Profile, tp: int) -> list[dict[str, Any]]:
    """Each engine service: its name and, behind a gateway, the GPU ids it is pinned to (tp of them)."""
    services = deployment.engine_services(profile.serve.replicas)
    if len(services) == 1 or not profile.gpu_count:
        # Replicas on CPU (a two-replica cpu-demo) share the host's cores: nothing to pin.
        return [{"service": s, "device_ids": None} for s in services]
    if profile.gpu_count < tp * len(services):
        raise UserError(f"profile {profile.name!r}: {len(services)} replicas x tp {tp} need {tp * len(services)} "
                        f"GPUs, hardware.gpu.count is {profile.gpu_count}")
    return [{"service": s, "device_ids": [str(i * tp + k) for k in range(tp)]} for i, s in enumerate(services)]


def gateway(profile: Profile, replicas: list[dict[str, Any]], running_limit: int | None) -> dict[str, Any] | None:
    """The Model Gateway in front of more than one replica: its image pin and argv; None for one engine."""
    service = deployment.gateway_service(len(replicas))
    if service is None:
        return None
    port = profile.serve.port
    urls = [deployment.worker_url(r["service"], port) for r in replicas]
    return {"service": service, "pin": images()["gateway"],
            "args": deployment.gateway_args(urls, port, balance_threshold=running_limit),
            # Helm: the gateway finds the engine pods itself (service discovery), no worker list.
            "args_discovered": deployment.gateway_args([], port, balance_threshold=running_limit)}


def drain_budget(profile: Profile, max_model_len: int | None, gateway: bool) -> dict[str, Any]:
    """How long an engine may take to finish its in-flight requests when it drains: the longest request the
    profile allows, i.e. its max tokens (the context, prompt and output together) decoded at the slowest
    single-stream rate its seed measured (deployment.DRAIN_DECODE_TOK_S where it measured none), capped by
    the gateway's request timeout when a gateway is in front (it ends longer ones itself)."""
    tokens = max_model_len or (load_shape(profile.model.shape).max_position_embeddings if profile.model.shape else None)
    if tokens is None:
        raise UserError(f"profile {profile.name!r}: neither a max-model-len/context-length flag nor model.shape: "
                        "the longest request (and so the drain time) is unknown; set one of them")
    expected = profile.expected
    rates = [p.decode_tok_s for p in expected.sweep if p.decode_tok_s] if expected else []
    if expected:
        rates += [r for r in (expected.baseline_decode_tok_s, expected.decode_tok_s) if r]
    rate = min(rates) if rates else deployment.DRAIN_DECODE_TOK_S
    seconds = math.ceil(tokens / rate)
    if gateway:
        seconds = min(seconds, deployment.GATEWAY_REQUEST_TIMEOUT_S)
    source = "the seed's slowest measured decode" if rates else "deployment.DRAIN_DECODE_TOK_S (no measured decode)"
    return {"max_tokens": tokens, "decode_tok_s": rate, "rate_source": source, "max_request_seconds": seconds,
            "capped_by_gateway": gateway and seconds == deployment.GATEWAY_REQUEST_TIMEOUT_S}


def template_context(profile: Profile, style: str, profile_file: Path | None = None) -> dict[str, Any]:
    """What every per-profile template sees."""
    filled = with_placeholders(profile, style)
    adapter = adapter_for(profile)
    argv = adapter.launch_args(filled)
    refs = {w: getattr(profile, w) for w in ("model", "draft")}
    settings = adapter.settings(profile)
    replicas = replica_sets(profile, settings.tp)
    return {
        # Ansible's preflight checks the free disk against it; computed for that target only.
        "disk_gb": disk_need(profile).gigabytes() if style == "ansible" else None,
        "replicas": replicas,
        # An operator's profile is not in the images: compose mounts this file into the containers.
        "profile_file": profile_file,
        "gateway": gateway(profile, replicas, settings.max_running_requests),
        "drain": drain_budget(profile, settings.max_model_len, len(replicas) > 1),
        # Named after the engine build: a new version or image starts with an empty cache.
        "compile_cache": deployment.compile_cache_key(profile.engine.kind, profile.engine.version,
                                                      profile.engine.image),
        "profile": profile,
        "adapter": adapter,
        "settings": settings,
        "launch_args": argv,
        # The argv split into the program (python3 -m module) and the flags after it.
        "engine_command": argv[:3],
        "engine_args": argv[3:],
        "missing": {w: ref.missing_hint for w, ref in refs.items() if ref is not None and not ref.repo},
        "images": images(),
        "image_ref": parse_image,
        "monitoring_healthcheck": monitoring_auth.healthcheck(),
    }


def render_profile(profile: Profile, template: str, style: str, profile_file: Path | None = None) -> str:
    """`template` filled for `profile` (no header)."""
    return environment().get_template(template).render(**template_context(profile, style, profile_file))


def source(name: str, template: str) -> str:
    return f"src/ornith_stack/profiles/{name}.yaml and src/ornith_stack/templates/{template}"


def _builder(name: str, template: str, style: str) -> Callable[[], str]:
    def build() -> str:
        return with_header(source(name, template), render_profile(load_profile(name, shipped=True), template, style), "yaml")

    return build


# Characters a profile file's path cannot carry into compose's volume line `${VAR:-PATH}:DEST:ro`: compose
# interpolates `$`, ends the default at `}`, splits the mount at `:`; control characters (a newline) have
# no place in a path an operator means. Everything else (spaces, ` #`, quotes) the line's YAML quoting holds.
_UNMOUNTABLE = frozenset("$}:") | frozenset(map(chr, (*range(32), 127)))


def mountable(profile_file: Path) -> Path:
    """`profile_file` made absolute (a relative one would be a named volume to compose), or refused."""
    path = profile_file.absolute()
    bad = sorted(set(str(path)) & _UNMOUNTABLE)
    if bad:
        raise UserError(f"the profile folder {shown(str(path.parent))} contains {', '.join(map(repr, bad))}, which "
                        "compose cannot mount (interpolation, the volume separator); set ORNITH_PROFILE_DIR to a "
                        "folder without them")
    return path


def operator_files(profile: Profile, profile_file: Path, command: str) -> list[GeneratedFile]:
    """The compose file, Helm values and Ansible variables of an operator's profile (`profiles new`), laid
    out as in a checkout; their header names the profile file and the command that wrote them."""
    profile_file = mountable(profile_file)
    found = []
    for pattern, template, style in TARGETS:
        text = f"{profile_file} and src/ornith_stack/templates/{template}"

        def build(template: str = template, style: str = style, text: str = text) -> str:
            return with_header(text, render_profile(profile, template, style, profile_file), "yaml", command)

        found.append(GeneratedFile(pattern.format(name=profile.name), text, build))
    return found


def files(root: Path) -> Iterator[GeneratedFile]:
    for name in shipped_profile_names():
        for pattern, template, style in TARGETS:
            if (TEMPLATES / template).is_file():
                yield GeneratedFile(pattern.format(name=name), source(name, template), _builder(name, template, style))


def save_computed(layout: Layout, folder: Path, out: Path, command: str) -> list[Path]:
    """Write a computed profile (`profiles new`, or `up` following `--profile auto`) into the operator's
    profile folder and its compose file, Helm values and Ansible variables under `out`; the paths written."""
    profile_file = folder / f"{layout.profile.name}.yaml"
    document = profile_document(layout, command)
    require_targets(folder, [profile_file.name])  # refused after the other files were written: half a profile
    written = render(out, operator_files(layout.profile, profile_file, command))
    render(folder, [GeneratedFile(profile_file.name, command, lambda: document)])
    return [profile_file, *(out / outcome.path for outcome in written)]
