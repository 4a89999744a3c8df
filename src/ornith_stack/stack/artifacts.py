"""What a stack needs before it starts: the checkpoints (Hugging Face, at the profile's revisions) and the
images (the thin engine layer and this project's images built and labelled, the others pulled)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ornith_stack.doctor import Options, diagnose
from ornith_stack.errors import UserError
from ornith_stack.profiles.model import Profile
from ornith_stack.stack.compose import Stack, compose_json
from ornith_stack.stack.shell import Runner, first_line

BUILD_TIMEOUT_S = 3600.0
Say = Callable[[str], None]
# Doctor topics about the checkpoint itself (the machine's were checked in preflight).
CHECKPOINT_TOPICS = ("checkpoint", "config", "mtp", "vision", "mask token")


def hub_models(profile: Profile) -> list[tuple[str, str]]:
    """(repo, revision) of the model and the draft that come from the Hugging Face Hub (not a local path)."""
    models = [(profile.model.repo, profile.model.revision)]
    if profile.draft is not None and profile.draft.repo:
        models.append((profile.draft.repo, profile.draft.revision))
    return [(repo, rev) for repo, rev in models if repo and not repo.startswith(("/", ".")) and repo.count("/") == 1]


def download_weights(profile: Profile, hf_home: Path, say: Say) -> list[Path]:
    """Each Hub checkpoint at its pinned revision into hf_home/hub (resumed when interrupted), then the
    doctor's checkpoint checks on the model's snapshot. HF_TOKEN comes from the environment or the token
    file, read by huggingface_hub itself: it is never printed."""
    models = hub_models(profile)
    if not models:
        return []
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError("huggingface_hub is not installed: `pip install huggingface_hub` (ornith-stack's "
                        "dependency), then `ornith-stack up` again") from None
    snapshots = []
    for repo, revision in models:
        say(f"downloading {repo}@{revision}")
        try:
            snapshots.append(Path(snapshot_download(repo, revision=revision, cache_dir=hf_home / "hub")))
        except Exception as exc:  # the Hub's errors name the repository and the reason
            raise UserError(f"cannot download {repo}@{revision}: {type(exc).__name__}: {str(exc).splitlines()[0]} "
                            "(a gated or private repository needs HF_TOKEN in the environment)") from None
    report = diagnose(Options(profile=profile.name, weights=snapshots[0], allow_no_gpu=True,
                              draft_weights=snapshots[1] if len(snapshots) > 1 else None))
    problems = [f for f in report.problems if f.topic in CHECKPOINT_TOPICS]
    if problems:
        raise UserError(f"the checkpoint at {snapshots[0]}: {problems[0].topic}: {problems[0].message}")
    return snapshots


def image_id(run: Runner, image: str) -> str | None:
    """The ID of a local image; None when the image is not here."""
    result = run(["docker", "image", "inspect", image, "--format", "{{.Id}}"])
    return result.stdout.strip() if result.returncode == 0 else None


def ensure_images(run: Runner, stack: Stack, say: Say) -> list[str]:
    """Build this project's images, pull the missing others; returns what changed, one line each.

    The build goes through compose, the builder of the README's `docker compose ... up --build`, so both
    share one layer cache, and Docker's cache is what decides staleness: a changed source file, version
    label or upstream pin makes a new image, an unchanged one leaves the image ID as it was."""
    services: dict[str, Any] = compose_json(run, stack, "config", "--format", "json")["services"]
    builds: dict[str, str] = {}  # image -> the first service that builds it (several may share one image)
    for name, service in sorted(services.items()):
        if service.get("build") and service.get("image"):
            builds.setdefault(str(service["image"]), name)
    before = {image: image_id(run, image) for image in builds}
    if builds:
        say(f"building {', '.join(sorted(builds))} (an unchanged image is kept as it is)")
        _build(run, stack, sorted(set(builds.values())), say)
    changed = [f"built {image} ({'missing' if was is None else 'its sources changed'})"
               for image, was in sorted(before.items()) if image_id(run, image) != was]
    for name, service in sorted(services.items()):
        image = str(service.get("image", ""))
        if service.get("build") or not image or image_id(run, image) is not None:
            continue
        say(f"pulling {image}")
        pulled = run(["docker", "pull", image], timeout=BUILD_TIMEOUT_S)
        if pulled.returncode != 0:
            raise UserError(f"cannot pull {image} for {name} ({first_line(pulled)}): check the network or a "
                            "registry mirror; compose/.env.example names the variable that replaces this image")
        changed.append(f"pulled {image}")
    return changed


def _build(run: Runner, stack: Stack, services: list[str], say: Say) -> None:
    def step(line: str) -> None:  # BuildKit's plain progress: "#5 [engine build 2/9] RUN ..."
        if line.startswith("#") and " [" in line[:12]:
            say(line[:120])

    argv = stack.compose("--progress", "plain", "build", *services)
    result = run(argv, timeout=BUILD_TIMEOUT_S, on_line=step)
    if result.returncode != 0:
        tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
        raise UserError(f"building {', '.join(services)} failed: {tail} (`{' '.join(argv)}` shows the whole log)")
