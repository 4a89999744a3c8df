"""Per-profile files: compose/<p>.yml, helm/ornith/values-<p>.yaml and ansible/profiles/<p>.yml."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ornith_stack.engines import adapter_for
from ornith_stack.generate.core import TEMPLATES, GeneratedFile, environment, with_header
from ornith_stack.profiles import images, load_profile, shipped_profile_names
from ornith_stack.profiles.images import parse_image
from ornith_stack.profiles.model import Profile

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


def template_context(profile: Profile, style: str) -> dict[str, Any]:
    """What every per-profile template sees."""
    filled = with_placeholders(profile, style)
    adapter = adapter_for(profile)
    argv = adapter.launch_args(filled)
    refs = {w: getattr(profile, w) for w in ("model", "draft")}
    return {
        "profile": profile,
        "adapter": adapter,
        "settings": adapter.settings(profile),
        "launch_args": argv,
        # The argv split into the program (python3 -m module) and the flags after it.
        "engine_command": argv[:3],
        "engine_args": argv[3:],
        "missing": {w: ref.missing_hint for w, ref in refs.items() if ref is not None and not ref.repo},
        "images": images(),
        "image_ref": parse_image,
    }


def render_profile(profile: Profile, template: str, style: str) -> str:
    """`template` filled for `profile` (no header)."""
    return environment().get_template(template).render(**template_context(profile, style))


def source(name: str, template: str) -> str:
    return f"src/ornith_stack/profiles/{name}.yaml and src/ornith_stack/templates/{template}"


def _builder(name: str, template: str, style: str) -> Callable[[], str]:
    def build() -> str:
        return with_header(source(name, template), render_profile(load_profile(name), template, style), "yaml")

    return build


def operator_files(profile: Profile, profile_file: Path, command: str) -> list[GeneratedFile]:
    """The compose file, Helm values and Ansible variables of an operator's profile (`profiles new`), laid
    out as in a checkout; their header names the profile file and the command that wrote them."""
    found = []
    for pattern, template, style in TARGETS:
        text = f"{profile_file} and src/ornith_stack/templates/{template}"

        def build(template: str = template, style: str = style, text: str = text) -> str:
            return with_header(text, render_profile(profile, template, style), "yaml", command)

        found.append(GeneratedFile(pattern.format(name=profile.name), text, build))
    return found


def files(root: Path) -> Iterator[GeneratedFile]:
    for name in shipped_profile_names():
        for pattern, template, style in TARGETS:
            if (TEMPLATES / template).is_file():
                yield GeneratedFile(pattern.format(name=name), source(name, template), _builder(name, template, style))
