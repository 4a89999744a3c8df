"""Hostile input, by class: each is one `error:` line, exit status 2, and the disk as it was.

The inputs are representatives of the classes a run of ~1,000 hostile inputs found (issue 19): usage
errors, names that are paths, input that parses without limits, files that are not files, URLs, and
values that used to be read as "not given" or as something else.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from ornith_stack.cli import main

BILLION_LAUGHS = ("a=[&a [lol,lol,lol,lol,lol,lol,lol,lol,lol],&b [*a,*a,*a,*a,*a,*a,*a,*a,*a],"
                  "&c [*b,*b,*b,*b,*b,*b,*b,*b,*b],&d [*c,*c,*c,*c,*c,*c,*c,*c,*c],"
                  "&e [*d,*d,*d,*d,*d,*d,*d,*d,*d],&f [*e,*e,*e,*e,*e,*e,*e,*e,*e]]")


def _tree(root: Path) -> dict[str, tuple[int, bytes | None]]:
    return {str(p.relative_to(root)): (p.lstat().st_mode, p.read_bytes() if p.is_file() and not p.is_symlink()
                                       else None) for p in sorted(root.rglob("*"))}


def _within(seconds: int, call: Callable[..., int], *args: object) -> int:
    """`call(*args)`, failing the test after `seconds` (a FIFO read blocks; a hang must not stall CI)."""
    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        return call(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> Callable[..., str]:
    """Run the CLI in a scratch folder; assert one error line, exit 2, nothing written; return the line."""
    monkeypatch.chdir(tmp_path)

    def run(*argv: str) -> str:
        before = _tree(tmp_path)
        capsys.readouterr()
        assert _within(30, main, list(argv)) == 2
        out, err = capsys.readouterr()
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), err[:2000]
        assert len(lines[0]) <= 1000 and out == ""
        assert _tree(tmp_path) == before
        return lines[0]

    return run


@pytest.mark.parametrize("argv, says", [
    (["profiles", "--bogus"], "No such option: --bogus (see 'ornith-stack profiles --help')"),
    (["profiles", "show"], "Missing argument 'name'. (see 'ornith-stack profiles show --help')"),
    (["plan", "gpu96", "--tp", "two"], "Invalid value for '--tp'"),
    (["no-such-command"], "No such command 'no-such-command'. (see 'ornith-stack --help')"),
])
def test_usage_errors_are_one_error_line(refused: Callable[..., str], argv: list[str], says: str) -> None:
    line = refused(*argv)
    assert says in line


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/hostname", "cpu-demo/../cpu-demo", ".hidden",
                                  "a" * 5000, "", "cpu demo", "cpu-demo\n"])
def test_a_profile_name_is_a_name_never_a_path(refused: Callable[..., str], name: str) -> None:
    line = refused("profiles", "show", name)
    # A line break is refused before any command reads the word (cli.refuse_hostile_input).
    assert "a profile name is letters, digits" in line or ("\n" in name and "control character" in line)
    assert len(line) < 400  # the 5,000-character name is quoted cut short


def test_a_profile_folder_that_does_not_exist_is_an_error_not_an_empty_list(
    refused: Callable[..., str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(tmp_path / "nonexistent"))
    assert "ORNITH_PROFILE_DIR=" in refused("profiles")
    assert "is not a folder" in refused("launch-args", "cpu-demo")


@pytest.mark.parametrize("value, says", [
    ("a=" + "[" * 10_000, "nested deeper than 64 levels"),
    ("a=" + "{b: " * 100 + "1" + "}" * 100, "nested deeper than 64 levels"),
    (BILLION_LAUGHS, "repeats a mapping or list"),
    ("a=\"" + "x" * 1_000_000, "not a valid YAML value"),  # an unclosed megabyte-long string: the line stays short
    ("engine.kind=", "empty value"),
    ("=x", "expected KEY=VALUE"),
    ("a..b=1", "expected a dotted key"),
])
def test_set_values_parse_with_limits(refused: Callable[..., str], value: str, says: str) -> None:
    assert says in refused("profiles", "show", "cpu-demo", "--set", value)


def test_a_profile_file_with_an_alias_bomb_is_refused(
    refused: Callable[..., str], monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("profiles")
    (folder / "bomb.yaml").write_text(BILLION_LAUGHS.replace("a=", "x: ", 1) + "\n")
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(folder))
    assert "repeats a mapping or list" in refused("profiles", "show", "bomb")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder", "huge"])
def test_files_that_are_not_configuration_files_are_refused_before_reading(
    refused: Callable[..., str], monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory,
    kind: str,
) -> None:
    """A profile, a checkpoint's config.json, a bench baseline: a FIFO would hang the reader, /dev/zero
    would fill memory."""
    folder = tmp_path_factory.mktemp(kind)
    for name in ("x.yaml", "config.json"):
        target = folder / name
        if kind == "fifo":
            os.mkfifo(target)
        elif kind == "dev-zero":
            target.symlink_to("/dev/zero")
        elif kind == "folder":
            target.mkdir()
        else:
            with target.open("wb") as handle:
                handle.truncate(65 << 20)  # sparse: 65 MiB, over the 64 MiB cap
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(folder))
    says = "larger than" if kind == "huge" else "not a regular file"
    assert says in refused("profiles", "show", "x")
    monkeypatch.delenv("ORNITH_PROFILE_DIR")
    assert says in refused("doctor", "--profile", "cpu-demo", "--weights", str(folder), "--allow-no-gpu")
    assert says in refused("bench", "--url", "http://127.0.0.1:1", "--baseline", str(folder / "config.json"),
                           "--out", "out", "--suite", "decode")


BAD_URLS = ["http://127.0.0.1:0", "http://127.0.0.1:70000", "http://127.0.0.1:-1", "http://", "http://:8000",
            "http://127.0.0.1:8000\r\nX-Injected: 1", "http://[::1", "http://127.0.0.1 :8000", "javascript:alert(1)",
            "file:///etc/passwd", "ftp://127.0.0.1", "http://127.0.0.1:8000/?a=1", "", "http://" + "h" * 5000]


@pytest.mark.parametrize("url", BAD_URLS)
def test_engine_urls_are_validated_once_for_the_exporter_and_the_bench(
    refused: Callable[..., str], url: str
) -> None:
    target = refused("exporter", "--target", url, "--listen", "127.0.0.1:1")
    bench = refused("bench", "--url", url, "--out", "out", "--suite", "decode")
    # A gateway's URL was listed at /sd/gateways unchecked: `http://[::1` made every answer there an HTTP 500.
    gateway = refused("exporter", "--target", "http://127.0.0.1:8000", "--gateway", url, "--listen", "127.0.0.1:1")
    assert target.startswith("error: --target") and bench.startswith("error: --url")
    assert gateway.startswith("error: --gateway")
    assert target.removeprefix("error: --target") == bench.removeprefix("error: --url").replace(
        "--url", "--target") == gateway.removeprefix("error: --gateway").replace("--gateway", "--target")


@pytest.mark.parametrize("name", ["\udcff\udcfe", "engine\nup 1", "tab\there"])
def test_a_target_name_is_printable_utf8(refused: Callable[..., str], name: str) -> None:
    """Invalid UTF-8 on the command line (surrogates to Python) made every /metrics answer an HTTP 500."""
    assert "--target-name" in refused("exporter", "--target", "http://127.0.0.1:8000", "--target-name", name,
                                      "--listen", "127.0.0.1:1")


@pytest.mark.parametrize("argv, says", [
    (["plan", "gpu96", "--speculative-method", "bogus"], "--speculative-method 'bogus': choose one of"),
    (["plan", "gpu96", "--draft-config", "nosuch"], "model config 'nosuch' is neither a file nor a shipped"),
    (["plan", "gpu96", "--model-config", ""], "--model-config: empty value"),
    (["plan", "gpu96", "--engine-version", " "], "--engine-version: empty value"),
    (["plan", ""], "PROFILE: empty value"),
    (["launch-args", ""], "a profile name is letters"),
    (["tiny-model", ""], "empty directory name"),
    (["tiny-model", "."], "is the current directory or above it"),
    (["tiny-model", "x", "--seed", str(2**64)], "--seed"),
])
def test_values_once_read_as_not_given_are_errors(refused: Callable[..., str], argv: list[str], says: str) -> None:
    assert says in refused(*argv)


def test_set_engine_version_takes_that_versions_image(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "show", "gpu96", "--json", "--set", "engine.version=0.5.21"]) == 0
    assert '"image": "lmsysorg/sglang:v0.5.21-cu130"' in capsys.readouterr().out


def test_an_over_long_output_folder_is_one_error_line(refused: Callable[..., str]) -> None:
    """ENAMETOOLONG from the file system, wherever a path reaches it."""
    assert "longer than the system allows" in refused("render", "--root", "x" * 5000)


def test_tiny_model_replaces_an_old_model_whole_or_not_at_all(tmp_path: Path) -> None:
    """The model is written to a folder beside OUT and swapped in; a failure midway leaves OUT as it was."""
    from ornith_stack.tiny_model import _swapped_in

    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text('{"old": true}')
    before = _tree(tmp_path)
    with pytest.raises(OSError), _swapped_in(out) as staging:
        (staging / "config.json").write_text('{"new": true}')
        raise OSError(28, "No space left on device")
    assert _tree(tmp_path) == before
    with _swapped_in(out) as staging:
        (staging / "config.json").write_text('{"new": true}')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert (out / "config.json").read_text() == '{"new": true}'


def test_a_process_that_calls_the_command_again_and_again_keeps_one_copy_of_each_sub_command(
    refused: Callable[..., str],
) -> None:
    """Tools and tests call main() many times in one process: each call parses against the same sub-commands
    (registering them again on every call made the 30th call 1.75 s slower than the first)."""
    from ornith_stack import cli

    first = refused("bench", "--url", "ftp://127.0.0.1", "--out", "out")
    count = len(cli.app.registered_commands)
    for _ in range(20):
        assert refused("bench", "--url", "ftp://127.0.0.1", "--out", "out") == first
    assert len(cli.app.registered_commands) == count
    assert sorted({c.name for c in cli.app.registered_commands if c.name}) == sorted(
        c.name for c in cli.app.registered_commands if c.name)


@pytest.mark.parametrize("folder, says", [
    ("ops}x", "contains '}'"), ("ops$x", "contains '$'"), ("ops:x", "contains ':'"),
    ("ops\nx", "$ORNITH_PROFILE_DIR holds a control character"),
])
def test_a_profile_folder_compose_cannot_mount_is_refused_before_any_write(
        refused: Callable[..., str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, folder: str, says: str) -> None:
    """ORNITH_PROFILE_DIR is pasted into compose's volume line `${VAR:-PATH}:DEST:ro`: `}` ended the default,
    `$` was interpolated, `:` split the mount, a newline made invalid YAML, and each said "wrote"."""
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(tmp_path / folder))
    assert says in refused("profiles", "new", "mine", "--gpu", "h200", "--out", "out")


@pytest.mark.parametrize("folder", ["relative-profiles", "ops #not a comment", 'quote"d'])
def test_a_profile_folder_compose_can_mount_is_mounted_as_itself(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, folder: str) -> None:
    """A relative folder is mounted by its absolute path (relative, compose took it for a named volume); ` #` and
    quotes stay in the path instead of cutting the line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ORNITH_PROFILE_DIR", folder)
    assert main(["profiles", "new", "mine", "--gpu", "h200", "--out", "out"]) == 0
    engine = yaml.safe_load((tmp_path / "out" / "compose" / "mine.yml").read_text())["services"]["engine"]
    mount = next(v for v in engine["volumes"] if v.endswith("/mine.yaml:ro"))
    assert mount == f"${{ORNITH_PROFILE_FILE:-{tmp_path / folder / 'mine.yaml'}}}:/etc/ornith-stack/profiles/mine.yaml:ro"


@pytest.mark.parametrize("argv, says", [
    (["profiles", "new", "mine", "--gpu", "h200\n"], "--gpu holds a control character"),
    (["profiles", "new", "a" * 65, "--gpu", "h200"], "a new profile's name is lowercase letters, digits"),
    (["profiles", "new", "a" * 100, "--gpu", "h200"], "a new profile's name is lowercase letters, digits"),
    (["profiles", "new", "UPPER", "--gpu", "h200"], "a new profile's name is lowercase letters, digits"),
    (["profiles", "new", "mine", "--gpu", "h200", "--out", ""], "--out '': name the folder"),
])
def test_profiles_new_refuses_what_profiles_show_could_not_read(
        refused: Callable[..., str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str],
        says: str) -> None:
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(tmp_path / "ops"))
    assert says in refused(*argv)


def test_profiles_new_refuses_the_profile_file_before_writing_the_others(
        refused: Callable[..., str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A folder where the profile file goes: refused before the compose file, Helm values and Ansible
    variables are written (they were written, then the command said "nothing was written")."""
    (tmp_path / "ops" / "mine.yaml").mkdir(parents=True)
    monkeypatch.setenv("ORNITH_PROFILE_DIR", str(tmp_path / "ops"))
    assert "in the way of a generated file" in refused("profiles", "new", "mine", "--gpu", "h200", "--force",
                                                       "--out", "out")


@pytest.mark.parametrize("argv, says", [
    (["plan", "gpu96", "--model-config", "~nosuchuser"], "no home directory for that ~user"),
    (["plan", "gpu96", "--draft-config", "~nosuchuser/config.json"], "no home directory for that ~user"),
    (["plan", "gpu96", "--num-speculative-tokens", str(2**63)], "--num-speculative-tokens must be at most 256"),
    (["plan", "gpu96", "--tp", str(10**30)], "--tp must be at most 576"),
    (["plan", "gpu96", "--gpu-count", str(2**40)], "--gpu-count must be at most 576"),
])
def test_plan_refuses_what_it_planned_with_negative_figures(refused: Callable[..., str], argv: list[str],
                                                              says: str) -> None:
    """`~nosuchuser` was a RuntimeError traceback; 2^63 draft tokens and tp 10^30 were planned, with negative
    memory figures."""
    assert says in refused(*argv)


@pytest.mark.parametrize("argv, says", [
    (["--request-rate", "1e-300"], "--request-rate '1e-300': expected rates of at least 0.001"),
    (["--request-rate", "nan"], "--request-rate 'nan': expected rates of at least 0.001"),
    (["--timeout", "inf"], "--timeout inf: seconds from 1 to"),
    (["--concurrency", str(10**12)], "--concurrency '1000000000000': at most 100,000"),
    (["--max-concurrency", str(10**12)], "--max-concurrency '1000000000000': at most 100,000"),
    (["--model", ""], "--model '': name a served model"),
    (["--model", "  "], "--model '': name a served model"),
])
def test_bench_refuses_a_run_that_cannot_be_what_was_meant(refused: Callable[..., str], argv: list[str],
                                                          says: str) -> None:
    """1e-300 requests a second hung, 10^12 streams was a MemoryError, `--timeout inf` waited forever on a
    stuck engine, `--model ''` silently used the first model."""
    assert says in refused("bench", "--url", "http://127.0.0.1:1", "--out", "out", "--suite", "serving", *argv)
