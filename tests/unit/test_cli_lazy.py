"""`ornith-stack --help` imports no command: the listing is read from the command modules' source, and it says what
the imported commands say."""

from __future__ import annotations

import json
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
