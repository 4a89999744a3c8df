"""`ornith-stack --help` imports no command: the listing is read from the command modules' source, and it says what
the imported commands say."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from ornith_stack.cli import eager_commands
from ornith_stack.commands.index import command_index


def test_the_listing_names_every_command_with_the_help_the_command_has() -> None:
    listed = command_index()
    imported = eager_commands()
    assert list(listed) and set(listed) == set(imported)
    for name, entry in listed.items():
        assert (entry.help, entry.hidden) == (imported[name].help, imported[name].hidden), name


def test_help_imports_no_command_module_and_none_of_their_libraries() -> None:
    script = ("import sys, json\nfrom ornith_stack.cli import main\nrc = main(['--help'])\n"
              "print(json.dumps([rc, sorted(sys.modules)]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    rc, modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert rc == 0
    assert "bench" in done.stdout and "Measure decode" in done.stdout  # the listing is all there
    loaded = [m for m in modules if m.split(".")[0] in ("sympy", "math_verify", "httpx", "pydantic", "matplotlib")
              or (m.startswith("ornith_stack.commands.") and m != "ornith_stack.commands.index")]
    assert loaded == []


def test_a_command_is_imported_when_it_runs() -> None:
    script = ("import sys\nfrom ornith_stack.cli import main\nmain(['profiles', '--help'])\n"
              "print('ornith_stack.commands.profiles' in sys.modules, 'ornith_stack.commands.bench' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "True False"


def _pyproject() -> dict:
    import tomllib
    from pathlib import Path

    return tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())


def test_the_modules_the_cli_checks_are_the_extra_s_packages() -> None:
    from ornith_stack.cli import NEEDS_EXTRA

    extras = _pyproject()["project"]["optional-dependencies"]
    for command, (extra, modules) in NEEDS_EXTRA.items():
        packages = {re.split(r"[<>=!~ \[]", requirement)[0].replace("-", "_") for requirement in extras[extra]}
        assert packages == set(modules), command


def test_the_bench_without_its_extra_names_the_extra_to_install() -> None:
    # The grader's module made unimportable, as in an environment installed without the extra.
    script = ("import sys\nsys.modules['math_verify'] = None\nfrom ornith_stack.cli import main\n"
              "sys.exit(main(['bench', '--url', 'http://127.0.0.1:9']))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert "needs the bench extra (math_verify is not installed): pip install 'ornith-stack[bench]'" in " ".join(
        done.stderr.split())
    assert "Traceback" not in done.stderr


def test_the_exporter_image_installs_no_bench_extra_and_the_base_has_none_of_it() -> None:
    from pathlib import Path

    dockerfile = (Path(__file__).resolve().parents[2] / "docker" / "exporter.Dockerfile").read_text()
    # What the image's pip installs of ornith-stack: the checkout's path, with extras in brackets if any, and the
    # dependencies docker/pyproject-requirements.py lists (extras: its arguments after the pyproject's path).
    targets = [word for line in dockerfile.splitlines() if "pip install" in line
               for word in line.split() if "/tmp/ornith" in word and not word.endswith("requirements.txt")]
    assert targets == ["/tmp/ornith"], targets
    listing = re.search(r"python3 \S*pyproject-requirements\.py (\S+)([^>\n]*)>", dockerfile)
    assert listing and listing[2].strip() == "", "the exporter's dependency list names an extra"
    base = {re.split(r"[<>=!~ \[]", requirement)[0] for requirement in _pyproject()["project"]["dependencies"]}
    assert not base & {"math-verify", "matplotlib", "sympy", "numpy"}, base


def test_entrypoint_help_prints_its_help_with_no_profile_set() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORNITH_")}
    for word in ("--help", "-h"):
        shown = subprocess.run([sys.executable, "-m", "ornith_stack", "entrypoint", word], capture_output=True,
                               text=True, env=env, timeout=120, check=False)
        assert shown.returncode == 0 and shown.stderr == "", shown.stderr
        assert "Usage: ornith-stack entrypoint" in shown.stdout and "ORNITH_PROFILE" in shown.stdout
        assert "ORNITH_DRY_RUN=1" in shown.stdout  # the variables it reads, from stack/entrypoint.py
