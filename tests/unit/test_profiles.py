"""Profiles load, validate, and fail with errors that name the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from ornith_stack.cli import main
from ornith_stack.errors import UserError
from ornith_stack.profiles import DEFAULT_PROFILE, load_profile, profile_names

EXPECTED = {"a100x2", "gpu96", "spark", "gb300x2", "cpu-demo"}


def test_the_five_profiles_are_shipped_and_cpu_demo_is_the_default() -> None:
    assert EXPECTED <= set(profile_names())
    assert DEFAULT_PROFILE == "cpu-demo"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_profile_pins_its_image_to_a_tag(name: str) -> None:
    image = load_profile(name).engine.image
    assert ":" in image and not image.endswith(":latest")


def test_overlays_share_the_recipe_and_differ_only_in_hardware_and_parallelism() -> None:
    a100, gpu96 = load_profile("a100x2"), load_profile("gpu96")
    assert a100.model == gpu96.model and a100.draft == gpu96.draft and a100.engine == gpu96.engine
    differing = {k for k in a100.serve.args if a100.serve.args[k] != gpu96.serve.args.get(k)}
    assert differing == {"tp-size", "mem-fraction-static"}
    assert a100.hardware.gpu.count == 2 and gpu96.hardware.gpu.count == 1


def test_seed_pins_are_recorded() -> None:
    a100 = load_profile("a100x2")
    assert a100.engine.image == "lmsysorg/sglang:v0.5.17-cu129"
    assert a100.engine.python_pins == {"transformers": "5.12.1"}
    spark = load_profile("spark")
    assert (spark.engine.kind, spark.engine.version, spark.serve.served_name) == ("vllm", "0.24.0", "ornith")
    gb300 = load_profile("gb300x2")
    assert gb300.serve.sampling.model_dump() == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}


def _write_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    (tmp_path / "broken.yaml").write_text(text)
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(tmp_path))


def test_a_typo_names_the_file_and_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = Path(load_profile.__code__.co_filename).parent / "gpu96.yaml"
    _write_profile(tmp_path, monkeypatch, source.read_text().replace("  port:", "  prot:", 1)
                   if "  port:" in source.read_text() else source.read_text() + "servve: {}\n")
    with pytest.raises(UserError) as err:
        load_profile("broken")
    assert "broken.yaml" in str(err.value) and "unknown key" in str(err.value)


def test_a_wrong_type_says_what_was_expected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (Path(load_profile.__code__.co_filename).parent / "spark.yaml").read_text()
    _write_profile(tmp_path, monkeypatch, text.replace("port: 8000", "port: eight-thousand"))
    with pytest.raises(UserError) as err:
        load_profile("broken")
    assert "serve.port" in str(err.value) and "integer" in str(err.value)


def test_malformed_yaml_names_the_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_profile(tmp_path, monkeypatch, "name: x\nserve: [unclosed\n")
    with pytest.raises(UserError, match=r"broken.yaml: line \d+ is not valid YAML"):
        load_profile("broken")


def test_latest_tags_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (Path(load_profile.__code__.co_filename).parent / "cpu-demo.yaml").read_text()
    _write_profile(tmp_path, monkeypatch, text.replace("version: 0.32.0", "version: 0.32.0\n  image: x/y:latest"))
    with pytest.raises(UserError, match="latest"):
        load_profile("broken")


def test_unknown_profile_lists_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch-args", "a100"]) == 2
    err = capsys.readouterr().err
    assert "unknown profile 'a100'" in err and "a100x2" in err and "Traceback" not in err


def test_a_model_the_seed_does_not_name_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch-args", "spark"]) == 2
    assert "model.repo is required" in capsys.readouterr().err
    assert main(["launch-args", "spark", "--set", "model.repo=org/ornith-1.0-35b"]) == 0
    assert "--model org/ornith-1.0-35b" in capsys.readouterr().out


def test_profiles_lists_all_five(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles"]) == 0
    listing = capsys.readouterr().out
    for name in EXPECTED:
        assert name in listing


def test_profiles_show_prints_the_merged_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "show", "gpu96"]) == 0
    shown = capsys.readouterr().out
    assert "z-lab/Qwen3.5-35B-A3B-DFlash" in shown and "lmsysorg/sglang:v0.5.17-cu129" in shown


def test_a_usage_mistake_is_one_message_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch-args", "a100x2", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert "No such option: --bogus" in err and "Traceback" not in err


COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(("sets", "refused"), [
    (["serve.remote_code_unpinned=false"], "model.revision 'main' and draft.revision 'main' is no commit"),
    (["serve.remote_code_unpinned=false", f"model.revision={COMMIT}"], "draft.revision 'main' is no commit"),
    (["serve.remote_code_unpinned=false", "model.revision=v1.0", f"draft.revision={COMMIT}"],
     "model.revision 'v1.0' is no commit"),
    (["serve.remote_code_unpinned=false", f"model.revision={COMMIT}", f"draft.revision={COMMIT}"], None),
    ([], None),  # the shipped profile says so, with its reason
], ids=["both at main", "draft at main", "a tag", "both pinned", "allowed"])
def test_remote_code_at_a_branch_is_refused_unless_the_profile_says_so(
        capsys: pytest.CaptureFixture[str], sets: list[str], refused: str | None) -> None:
    argv = ["launch-args", "gpu96"]
    for s in sets:
        argv += ["--set", s]
    code = main(argv)
    captured = capsys.readouterr()
    if refused is None:
        assert code == 0 and "--trust-remote-code" in captured.out
    else:
        assert code == 2 and "Traceback" not in captured.err
        (line,) = [line for line in captured.err.splitlines() if line.startswith("error:")]
        assert "trust-remote-code runs the checkpoint's own code" in line and refused in line
        assert "set serve.remote_code_unpinned: true" in line


def test_only_the_profiles_that_run_remote_code_at_a_branch_say_so() -> None:
    for name in profile_names():
        profile = load_profile(name)
        remote_code = profile.serve.args.get("trust-remote-code") is True
        assert profile.serve.remote_code_unpinned == (remote_code and profile.model.revision == "main"), name
