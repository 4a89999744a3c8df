"""Every option of every command, and every environment variable the CLI reads, against hostile values.

The options come from the CLI's own table (the click commands `ornith-stack` registers, every module
imported), the variables from the sources (every "ORNITH_..." name in src/), so a command, an option or a
variable added later is walked too. Each call runs `main` in-process in a scratch checkout (pyproject.toml and
compose/ and docker/), with HOME, the XDG folders, the operator profile folder and TMPDIR inside the scratch folder, and
with every way out of the process closed: starting a process, opening or accepting a connection, importing a
model library raises `SideEffect` (so nothing starts, nothing is reached, and a call that got that far was accepted).

What must hold, whatever the value:
- no traceback: `main` returns a status, or stops at a side effect;
- exit status 2 is one `error:` line and the scratch folder as it was;
- nothing is left in TMPDIR (a key file of a dry run) and nothing is written beside the scratch checkout
  (`--name ../escape-tune`, an absolute path);
- a value no command can mean is refused (exit 2): a control character (a line break in a name, a key or a
  path), a number written with non-ASCII digits.
The quoted cases of issue 45 are its first explicit examples.
"""

from __future__ import annotations

import builtins
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ornith_stack import deployment
from ornith_stack.cli import eager_commands, main
from ornith_stack.errors import UserError

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "ornith_stack"

# The words a command needs before an option's value is read (a required argument or option); every other
# option keeps its default. Anything not listed gets a name that is valid for a name and a path alike.
NEEDS: dict[str, list[str]] = {
    "bench": ["--url", "http://127.0.0.1:9"],
    "profiles new": ["probe-new", "--gpu", "h100-sxm"],
    "profiles show": ["cpu-demo"],
    "tune": ["cpu-demo", "--slo", "ttft_p99:1000 tpot_p99:100"],
    "tiny-model": ["model-out"],
    "plan": ["cpu-demo"],
    "launch-args": ["cpu-demo"],
    "up": ["cpu-demo"],
}
# An absolute path beside the scratch checkout (put in place of this word when the command runs).
ABSOLUTE = "<scratch>/absolute-escape"
# The parameters that name where a command writes (by their name in the CLI's table): writing there is asked for.
OUTPUTS = {"out", "out_dir", "root", "env_file"}
# Values from the classes issue 45's battery used (empty, huge, NaN/inf, negative, non-ASCII digits, control
# characters, path traversal, `$`, quotes, deep JSON) and its quoted cases.
HOSTILE = [
    "",
    " ",
    "a" * 5000,
    "9" * 5000,
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "1e999",
    "-0",
    "\u0663",
    "\uff11\uff12",
    "1.\u0665",
    "8.\u0660",
    "a\nb",
    "a\rb",
    "\x1b[2J",
    "tab\there",
    "\x7f",
    "\u0085",
    "../escape",
    "../../escape",
    "UPPER",
    "a/b",
    ABSOLUTE,
    "$HOME",
    "k$HOME",
    "pa$HOME",
    "'",
    '"quoted"',
    "`id`",
    "\\",
    "[" * 3000,
    '{"a":' * 1000 + "1" + "}" * 1000,
    "{}",
    "[]",
    "\udcff\udcfe",
    "--help",
]
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def must_refuse(value: str) -> str | None:
    """Why no command can take `value`, or None when some option could."""
    if CONTROL.search(value):
        return "a control character"
    if any(c.isdigit() and not c.isascii() for c in value) and _number(value):
        return "a number written with non-ASCII digits"
    return None


def _number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Option:
    command: str  # "profiles new"
    flag: str  # "--name", or "" for an argument
    argument: int  # position among the arguments, for an argument
    output: bool = False  # it names where the command writes

    def __str__(self) -> str:
        return f"{self.command} {self.flag or f'ARG{self.argument}'}"


def _leaves(name: str, command: Any) -> Iterator[tuple[str, Any]]:
    if hasattr(command, "commands"):
        for sub, child in sorted(command.commands.items()):
            yield from _leaves(f"{name} {sub}", child)
    else:
        yield name, command


def options() -> list[Option]:
    found = []
    for name, group in sorted(eager_commands().items()):
        for path, command in _leaves(name, group):
            arguments = [p for p in command.params if p.param_type_name == "argument"]
            found += [Option(path, "", i, p.name in OUTPUTS) for i, p in enumerate(arguments)]
            found += [
                Option(path, p.opts[0], 0, p.name in OUTPUTS)
                for p in command.params
                if p.param_type_name == "option" and not p.is_flag and not p.hidden
            ]
    return found


def variables() -> list[str]:
    """Every ORNITH_* variable the sources name (read with os.environ, or handed to compose)."""
    names = {m for f in SRC.rglob("*.py") for m in re.findall(r"\bORNITH_[A-Z0-9_]*[A-Z0-9]\b", f.read_text())}
    return sorted(names)


OPTIONS = options()
VARIABLES = variables()


class SideEffect(BaseException):
    """A call got as far as starting a process or using the network: accepted, and stopped there."""


def _stop(*args: object, **kwargs: object) -> None:
    raise SideEffect


# The libraries that load or build a model: importing one is where a command starts its real work.
MODEL_LIBRARIES = {"torch", "transformers", "vllm", "sglang", "safetensors"}


@pytest.fixture
def sealed(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def guarded(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.partition(".")[0] in MODEL_LIBRARIES:
            raise SideEffect
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", guarded)
    for owner, name in (
        (subprocess.Popen, "__init__"),
        (socket.socket, "connect"),
        (socket.socket, "connect_ex"),
        (socket.socket, "bind"),
        (socket.socket, "listen"),
        (os, "execvpe"),
        (os, "execv"),
        (os, "execve"),
        (os, "fork"),
        (os, "posix_spawn"),
        (os, "posix_spawnp"),
    ):
        monkeypatch.setattr(owner, name, _stop)


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
        for p in sorted(root.rglob("*"))
    }


@dataclass
class Outcome:
    rc: int | None  # None: stopped at a side effect
    out: str
    err: str
    before: dict[str, bytes | None]
    after: dict[str, bytes | None]


def checkout_files(*folders: str) -> list[str]:
    """The files of `folders` a clean clone has: tracked or new, not what git ignores (a developer's
    `compose/.env` from a local `up` would make a scratch checkout that is not CI's)."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z", "--", *folders],
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    return [name for name in listed.split("\0") if name and (REPO / name).is_file()]


CHECKOUT = checkout_files("compose", "docker")  # listed at import: the tests' `sealed` fixture refuses processes


def call(
    scratch: Path,
    argv: list[str],
    env: dict[str, str],
    capsys: pytest.CaptureFixture[str],
    prepare: Callable[[list[str]], list[str]] | None = None,
) -> Outcome:
    """`ornith-stack ARGV` with `env` added, in a fresh scratch checkout under `scratch` (`prepare`: changes it
    before the call)."""
    argv = [w.replace("<scratch>", str(scratch)) for w in argv]
    env = {k: v.replace("<scratch>", str(scratch)) for k, v in env.items()}
    shutil.rmtree(scratch, ignore_errors=True)
    work = scratch / "work"
    for folder in ("home/.config", "home/.cache", "operator-profiles", "tmp"):
        (scratch / folder).mkdir(parents=True)
    for name in CHECKOUT:  # what `up` and `tune --launch up` need of a checkout
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, work / name)
    shutil.copy(REPO / "pyproject.toml", work)
    base = {
        "HOME": str(scratch / "home"),
        "XDG_CONFIG_HOME": str(scratch / "home/.config"),
        "XDG_CACHE_HOME": str(scratch / "home/.cache"),
        "ORNITH_PROFILE_DIR": str(scratch / "operator-profiles"),
        "TMPDIR": str(scratch / "tmp"),
    }
    saved = dict(os.environ)
    os.environ.update({**base, **env})
    cwd = Path.cwd()
    os.chdir(work)
    argv = prepare(argv) if prepare else argv
    before = _tree(scratch)
    capsys.readouterr()
    try:
        tempfile.tempdir = None  # TMPDIR is read again
        rc: int | None = main(list(argv))
    except SideEffect:
        rc = None
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)
        tempfile.tempdir = None
    out, err = capsys.readouterr()
    return Outcome(rc, out, err, before, _tree(scratch))


def check(outcome: Outcome, why_refused: str | None, what: str, output: str = "") -> None:
    """`output`: the value of an option that names where the command writes (relative to the checkout)."""
    if outcome.rc == 2:
        lines = outcome.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{what}: {outcome.err[-3000:]}"
        assert "Traceback" not in outcome.err and len(lines[0]) <= 1000, what
        assert outcome.after == outcome.before, f"{what}: refused, but wrote {_changed(outcome)}"
    else:
        assert why_refused is None, f"{what}: accepted {why_refused} (exit {outcome.rc}): {outcome.err[-2000:]}"
        assert "Traceback" not in outcome.err, f"{what}: {outcome.err[-3000:]}"
    changed = _changed(outcome)
    assert not [p for p in changed if p.startswith("tmp/")], f"{what}: left in TMPDIR: {changed}"
    asked = os.path.normpath(os.path.join("work", output.replace("<scratch>/", "../"))) if output else "work"
    outside = [
        p for p in changed if not p.startswith(("work/", "home/", "operator-profiles/", f"{asked}/")) and p != asked
    ]
    assert outside == [], f"{what}: wrote beside the checkout: {outside}"


def _changed(outcome: Outcome) -> list[str]:
    return sorted(p for p in {*outcome.before, *outcome.after} if outcome.before.get(p) != outcome.after.get(p))


def argv_for(option: Option, value: str) -> list[str]:
    words = NEEDS.get(option.command, [])
    if option.flag:
        return [*option.command.split(), *words, option.flag, value]
    arguments = [w for w in words if not w.startswith("-")]
    rest = words[len(arguments) :]
    given = [*arguments[: option.argument], value, *arguments[option.argument + 1 :]]
    return [*option.command.split(), *given, *rest]


values = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(st.characters(codec="utf-8", categories=["Cc", "Nd", "Po", "Sm", "Sc", "Zs"]), max_size=12),
)


@pytest.mark.parametrize("option", OPTIONS, ids=str)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=values)
@example(value="a\nb")
@example(value="../escape")
@example(value="\u0663")
def test_every_option_refuses_hostile_values_in_one_line(
    option: Option, value: str, sealed: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if "\x00" in value:  # no argv word holds one (execve)
        return
    outcome = call(tmp_path / "scratch", argv_for(option, value), {}, capsys)
    check(outcome, must_refuse(value), f"{option} {value[:60]!r}", value if option.output else "")


# The command that reads each variable first, and the settings it needs to get there.
DRY_ENTRYPOINT = {"ORNITH_PROFILE": "cpu-demo", "ORNITH_DRY_RUN": "1", "ORNITH_SKIP_DOCTOR": "1"}


@pytest.mark.parametrize("variable", VARIABLES)
@pytest.mark.parametrize(
    "argv, env",
    [
        (["entrypoint"], DRY_ENTRYPOINT),  # vLLM: the key in its environment
        (["entrypoint"], {**DRY_ENTRYPOINT, "ORNITH_PROFILE": "gpu96"}),  # SGLang: a file
        (["up", "cpu-demo"], {}),
    ],
    ids=["entrypoint-vllm", "entrypoint-sglang", "up"],
)
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=values)
@example(value="k$HOME")
@example(value="a\nb")
def test_every_variable_refuses_hostile_values_in_one_line(
    variable: str,
    argv: list[str],
    env: dict[str, str],
    value: str,
    sealed: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if "\x00" in value or unicodedata.category(value[:1] or "a") == "Cs":  # no variable holds these
        return
    outcome = call(tmp_path / "scratch", argv, {**env, variable: value}, capsys)
    check(outcome, None, f"{variable}={value[:60]!r} {' '.join(argv)}")
    written = outcome.after.get("work/compose/.env")
    if written:  # compose must read back the value `up` kept, `$` and quotes included (no interpolation)
        for line in written.decode().splitlines():
            name, _, kept = line.partition("=")
            assert "$" not in kept or kept.startswith("'"), f"{variable}={value!r}: compose/.env {line!r}"


def test_the_walk_covers_the_commands_and_variables_of_the_cli() -> None:
    commands = {o.command for o in OPTIONS}
    assert {"bench", "tune", "profiles new", "exporter", "up", "plan", "doctor", "tiny-model"} <= commands
    assert {"--name", "--compute-capability", "--api-key"} <= {o.flag for o in OPTIONS}
    assert {"ORNITH_API_KEY", "ORNITH_EXTRA_ARGS", deployment.MONITORING_PASSWORD_VARIABLE} <= set(VARIABLES)


TUNE = ["tune", "cpu-demo", "--slo", "ttft_p99:1000 tpot_p99:100"]
NEW = [
    "profiles",
    "new",
    "probe-new",
    "--gpu",
    "nvml:NVIDIA Probe",
    "--memory-gib",
    "80",
    "--compute-capability",
    "9.0",
]


@pytest.mark.parametrize(
    "argv",
    [
        [*TUNE, "--name", "../escape-tune"],
        [*TUNE, "--name", ABSOLUTE],
        [*TUNE, "--name", "UPPER"],
        [*TUNE, "--name", "a\nb"],
        [*TUNE, "--name", "cpu-demo"],
        ["exporter", "--target", "http://127.0.0.1:9", "--canary", "--api-key", "a\nb"],
        ["bench", "--url", "http://127.0.0.1:9", "--api-key", "a\nb"],
        [*NEW, "--bandwidth-gbps", "0"],
        [*NEW[:-1], "9" * 5000 + ".0"],
        [*NEW[:-1], "\u0669.\u0660"],
        ["plan", "cpu-demo", "--tp", "\u0662"],
        ["profiles", "new", "probe-new", "--gpu", "h100-sxm", "--count", "\uff12"],
    ],
    ids=lambda argv: " ".join(argv)[:60],
)
def test_the_cases_issue_45_quotes_are_refused(
    argv: list[str], sealed: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = call(tmp_path / "scratch", argv, {}, capsys)
    assert outcome.rc == 2, f"{argv}: exit {outcome.rc}: {outcome.err[-2000:]}"
    check(outcome, "a quoted case", " ".join(argv))


@pytest.mark.parametrize(
    "env",
    [
        {"ORNITH_API_KEY": "k$HOME"},
        {deployment.MONITORING_PASSWORD_VARIABLE: "pa$HOME"},
        {deployment.MONITORING_PASSWORD_VARIABLE: '"quoted"'},
        # A refused monitoring password: no new API key is written before the refusal.
        {deployment.MONITORING_PASSWORD_VARIABLE: "p" * 100},
    ],
)
def test_up_refuses_secrets_compose_would_rewrite_before_writing_any(
    env: dict[str, str], sealed: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome = call(tmp_path / "scratch", ["up", "cpu-demo"], env, capsys)
    assert outcome.rc == 2 and "work/compose/.env" not in outcome.after, outcome.err[-2000:]
    check(outcome, "a quoted case", f"up with {env}")


@pytest.mark.parametrize(
    "extra", ["--api_key SECRET-U1 --hf_token SECRET-U2", "--api_key=SECRET-U1 --hf-token=SECRET-U2"]
)
def test_entrypoint_redacts_every_spelling_of_a_secret_and_leaves_no_key_file(
    extra: str, sealed: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {**DRY_ENTRYPOINT, "ORNITH_PROFILE": "gpu96", "ORNITH_API_KEY": "key-0123", "ORNITH_EXTRA_ARGS": extra}
    outcome = call(tmp_path / "scratch", ["entrypoint"], env, capsys)
    assert outcome.rc == 0 and "--config" in outcome.out, outcome.err[-2000:]
    assert "SECRET-U" not in outcome.out + outcome.err and "key-0123" not in outcome.out + outcome.err
    check(outcome, None, f"entrypoint {extra}")


@pytest.mark.parametrize(
    "state",
    [
        "[]",
        "[" * 100_000 + "]" * 100_000,
        '{"format": "ornith-stack-tune/1", "question": {}, "records": "x"}',
        '{"format": "ornith-stack-tune/1", "question": {}, "records": [{"key": "k", "name": "n", "settings": '
        '{"no-such-axis": 1}, "args": {}, "status": "measured"}]}',
        '{"format": "ornith-stack-tune/1", "question": {}, "records": [{"key": "k", "name": "n", "settings": {}, '
        '"args": {}, "status": "measured", "levels": [{"rate": "fast", "output_tok_s": 1, "ttft_p99_ms": 1, '
        '"tpot_p99_ms": 1}]}]}',
    ],
)
def test_a_corrupt_tune_state_is_one_error_line(
    state: str, sealed: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The state is read before any engine starts; one that answered the same question must parse."""
    from ornith_stack.tune import state as tune_state

    question = {
        "profile": "cpu-demo",
        "set": {},
        "slo": "ttft_p99:1000 tpot_p99:100",
        "workload": "random:256:128",
        "rates": "1,2,4,8,16,32,64",
        "num_prompts": 64,
        "max_concurrency": 256,
        "repeats": 1,
        "launch": "up",
    }
    if state.startswith("{"):
        state = state.replace('"question": {}', f'"question": {json.dumps(question)}')
    out = tmp_path / "out"
    out.mkdir()
    (out / tune_state.STATE_FILE).write_text(state)
    with pytest.raises(UserError, match="not a tune state file"):
        tune_state.load_state(out, question, ["max-running-requests"])


@pytest.mark.parametrize(
    "values",
    [None, b"\x7fELF\x02\x01\x01\x00\xff\xfe", b"a: 1\n", b"profile: x\n"],
    ids=["missing", "binary", "no-profile-key", "no-probes"],
)
def test_render_reads_the_charts_values_as_a_checked_source(
    values: bytes | None, sealed: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Round three's render tracebacks: FileNotFoundError without values.yaml, UnicodeDecodeError on a binary one,
    KeyError 'profile' on one without the key. Nothing is written before the refusal."""
    root = tmp_path / "scratch" / "work"

    def place(argv: list[str]) -> list[str]:
        chart = root / "helm" / "ornith"
        chart.mkdir(parents=True, exist_ok=True)
        if values is not None:
            (chart / "values.yaml").write_bytes(values)
        return argv

    outcome = call(tmp_path / "scratch", ["render", "--root", str(root)], {}, capsys, prepare=place)
    assert outcome.rc == 2 and "values.yaml" in outcome.err, outcome.err[-2000:]
    check(outcome, "a broken source", f"render with values.yaml {values!r}")


def test_render_replaces_a_binary_file_where_a_generated_one_belongs(
    sealed: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def place(argv: list[str]) -> list[str]:
        work = tmp_path / "scratch" / "work"
        shutil.copytree(REPO / "helm", work / "helm")
        (work / "compose" / "cpu-demo.yml").write_bytes(b"\xff\xfe\x00binary")
        return argv

    outcome = call(tmp_path / "scratch", ["render", "--check", "--root", "."], {}, capsys, prepare=place)
    assert outcome.rc == 1 and "compose/cpu-demo.yml" in outcome.out, outcome.err[-2000:]
    check(outcome, None, "render --check over a binary target")
