"""What a stack needs before it starts: the checkpoints (Hugging Face, at the profile's revisions) and the
images (the thin engine layer and this project's images built and labelled, the others pulled)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ornith_stack import __version__
from ornith_stack.doctor import Options, diagnose
from ornith_stack.errors import UserError
from ornith_stack.profiles.model import Profile
from ornith_stack.stack.compose import Stack, compose_json
from ornith_stack.stack.shell import Runner, first_line

# Labels of the images `up` builds: a change of either means the image is stale and is built again.
LABEL_VERSION = "org.ornith-stack.version"
LABEL_UPSTREAM = "org.ornith-stack.upstream"
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


def image_labels(run: Runner, image: str) -> dict[str, str] | None:
    """The labels of a local image; None when the image is not here."""
    result = run(["docker", "image", "inspect", image, "--format", "{{json .Config.Labels}}"])
    if result.returncode != 0:
        return None
    labels = json.loads(result.stdout or "null")
    return dict(labels) if isinstance(labels, dict) else {}


def ensure_images(run: Runner, stack: Stack, say: Say) -> list[str]:
    """Build what is missing or stale, pull what is missing; returns what changed, one line each."""
    services: dict[str, Any] = compose_json(run, stack, "config", "--format", "json")["services"]
    changed = []
    for name, service in sorted(services.items()):
        image, build = str(service.get("image", "")), service.get("build")
        if build:
            want = {LABEL_VERSION: __version__, LABEL_UPSTREAM: str((build.get("args") or {}).get("BASE_IMAGE", ""))}
            have = image_labels(run, image)
            if have is not None and all(have.get(k) == v for k, v in want.items()):
                continue
            why = "missing" if have is None else "stale"
            say(f"building {image} ({why}; FROM {want[LABEL_UPSTREAM]})")
            _build(run, image, build, want, say)
            changed.append(f"built {image} ({why})")
        elif image and image_labels(run, image) is None:
            say(f"pulling {image}")
            pulled = run(["docker", "pull", image], timeout=BUILD_TIMEOUT_S)
            if pulled.returncode != 0:
                raise UserError(f"cannot pull {image} for {name} ({first_line(pulled)}): check the network or a "
                                "registry mirror; compose/.env.example names the variable that replaces this image")
            changed.append(f"pulled {image}")
    return changed


def _build(run: Runner, image: str, build: dict[str, Any], labels: dict[str, str], say: Say) -> None:
    context = Path(str(build.get("context", ".")))
    argv = ["docker", "build", "-t", image, "-f", str(context / str(build.get("dockerfile", "Dockerfile")))]
    argv += [f"--build-arg={k}={v}" for k, v in sorted((build.get("args") or {}).items())]
    argv += [f"--label={k}={v}" for k, v in labels.items()]
    def step(line: str) -> None:  # the classic builder's "Step 3/14 : RUN ..." lines, BuildKit's "#5 [2/9] ..."
        if line.startswith("Step ") or (line.startswith("#") and " [" in line[:12]):
            say(line[:120])

    result = run([*argv, str(context)], timeout=BUILD_TIMEOUT_S, on_line=step)
    if result.returncode != 0:
        tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-3:])
        raise UserError(f"building {image} failed: {tail} (`{' '.join(argv[:4])} ...` shows the whole log)")
