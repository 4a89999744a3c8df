"""Image references are parsed as references, so a digest pin works from the profile to the chart."""

from __future__ import annotations

import shutil
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from ornith_stack import profiles
from ornith_stack.cli import main
from ornith_stack.errors import UserError
from ornith_stack.profiles import load_profile
from ornith_stack.profiles.images import parse_image

DIGEST = "sha256:" + "ab" * 32
PINNED = f"registry.example:5000/lmsysorg/sglang@{DIGEST}"
PROFILES = Path(load_profile.__code__.co_filename).parent


@pytest.mark.parametrize(
    ("reference", "repository", "tag", "digest"),
    [
        ("lmsysorg/sglang:v0.5.17-cu129", "lmsysorg/sglang", "v0.5.17-cu129", None),
        ("python:3.11-slim-bookworm", "python", "3.11-slim-bookworm", None),
        (PINNED, "registry.example:5000/lmsysorg/sglang", None, DIGEST),
        (f"localhost:5000/a/b:1.0@{DIGEST}", "localhost:5000/a/b", "1.0", DIGEST),
        (f"nvcr.io/nvidia/vllm:25.01@{DIGEST}", "nvcr.io/nvidia/vllm", "25.01", DIGEST),
    ],
)
def test_references_split_into_repository_tag_and_digest(
    reference: str, repository: str, tag: str | None, digest: str | None
) -> None:
    ref = parse_image(reference)
    assert (ref.repository, ref.tag, ref.digest) == (repository, tag, digest)
    assert str(ref) == reference


@pytest.mark.parametrize("reference", ["a:b:c", "Upper/name:1", "name@sha256:short", "name:"])
def test_malformed_references_are_refused(reference: str) -> None:
    with pytest.raises(ValueError, match="image"):
        parse_image(reference)


@pytest.fixture
def digest_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped profiles plus `digest`: gpu96 with its engine image pinned by digest alone."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    for path in PROFILES.glob("*.yaml"):
        shutil.copy(path, folder / path.name)
    text = (PROFILES / "gpu96.yaml").read_text()
    engine = f"engine:\n  kind: sglang\n  version: 0.5.17\n  image: {PINNED}\n"
    (folder / "digest.yaml").write_text(text.replace("description:", engine + "description:", 1))
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(folder))
    monkeypatch.setattr(profiles, "SHIPPED_DIR", folder)  # render generates files for it too
    return folder


def test_a_digest_pin_loads_and_launches(digest_profiles: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = load_profile("digest")
    assert profile.engine.image == PINNED and profile.engine.image_ref.digest == DIGEST
    assert main(["launch-args", "digest"]) == 0
    assert "--model-path" in capsys.readouterr().out


def test_a_digest_pin_reaches_compose_ansible_and_the_helm_chart(
    digest_profiles: Path, repo: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    shutil.copytree(repo / "helm", root / "helm")
    shutil.copy(repo / "pyproject.toml", root / "pyproject.toml")
    (root / "compose").mkdir()  # what `render --root` recognises a checkout by
    assert main(["render", "--root", str(root)]) == 0
    compose = yaml.safe_load((root / "compose" / "digest.yml").read_text())
    assert PINNED in str(compose["services"]["engine"]["build"]["args"]["BASE_IMAGE"])
    ansible = yaml.safe_load((root / "ansible" / "profiles" / "digest.yml").read_text())
    assert ansible["ornith_engine_image"] == PINNED
    values = yaml.safe_load((root / "helm" / "ornith" / "values-digest.yaml").read_text())
    assert values["engine"]["image"] == {
        "repository": "registry.example:5000/lmsysorg/sglang",
        "tag": "",
        "digest": DIGEST,
    }
    values["projectImages"] = {"registry": "registry.example.test"}  # where the exporter image was pushed
    values["apiKey"] = {"secretName": "ornith-api-key"}  # the chart serves no engine without a key
    manifests = helm.Chart.load(root / "helm" / "ornith").render(values=values, name="ornith", namespace="llm")
    engine_images = {
        c["image"]
        for text in manifests.values()
        for doc in yaml.safe_load_all(text)
        if doc
        for c in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
        if c["name"] == "engine"
    }
    assert engine_images == {PINNED}


@pytest.mark.parametrize("image", ["x/y:latest", "x/y", "x/y@sha256:abc"])
def test_unpinned_images_are_refused(digest_profiles: Path, image: str) -> None:
    path = digest_profiles / "digest.yaml"
    path.write_text(path.read_text().replace(PINNED, image))
    with pytest.raises(UserError, match="engine.image"):
        load_profile("digest")
