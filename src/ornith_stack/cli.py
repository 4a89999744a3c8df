"""The ornith-stack command. Sub-commands live in ornith_stack.commands.*; they parse and print only.

A command's module is imported when that command runs (or shows its help), not before: the bench alone imports
sympy through its math grader (0.8 s), and `ornith-stack --help` took 2.2 s when every command was imported
first. The list in the top-level help is read from the modules' source (commands/index.py).
"""

from __future__ import annotations

import errno
import functools
import importlib
import os
import re
import sys
from collections.abc import Mapping
from importlib.util import find_spec
from typing import Any

import typer
import typer.core
import typer.main
from rich.console import Console
from rich.markup import escape

from ornith_stack import commands
from ornith_stack.commands.index import command_index
from ornith_stack.errors import LINE_LIMIT, UserError, one_line

err = Console(stderr=True)

# Commands that need an extra of the package (pyproject.toml's optional-dependencies; tests/unit/test_cli_lazy.py
# checks these modules against it): the bench's math grader (math-verify, which brings sympy) and its plots
# (matplotlib) weigh about 200 MB that the exporter's image does without. Checked before the command starts, so
# that a benchmark does not run for minutes and then fail to draw its plots.
NEEDS_EXTRA: dict[str, tuple[str, tuple[str, ...]]] = {"bench": ("bench", ("math_verify", "matplotlib")),
                                                        "load": ("bench", ("math_verify", "matplotlib"))}


class _LazyGroup(typer.core.TyperGroup):
    """The top-level group: a command's module is imported when the command is looked up to run; the help
    listing shows each command's help as its source states it, without importing it."""

    _listing = False

    # Typer vendors click in a private module: its Context and Command types are not named here.
    def list_commands(self, ctx: Any) -> list[str]:
        return list(command_index())

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        entry = command_index().get(cmd_name)
        if entry is None:
            return None
        if self._listing:
            return typer.core.TyperCommand(cmd_name, help=entry.help, hidden=entry.hidden)
        _require_extra(cmd_name)
        return _loaded(entry.module).get(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def _require_extra(command: str) -> None:
    extra, modules = NEEDS_EXTRA.get(command, ("", ()))
    missing = [module for module in modules if find_spec(module) is None]
    if missing:
        raise UserError(f"`ornith-stack {command}` needs the {extra} extra ({', '.join(missing)} is not installed): "
                        f"pip install 'ornith-stack[{extra}]' (in a checkout: pip install -e '.[{extra}]')")


@functools.cache
def _loaded(module: str) -> dict[str, Any]:
    """The click commands one module registers, registered once per process: registering on every call of main()
    made a process that calls it repeatedly (the test suite) slower with each call."""
    sub = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    importlib.import_module(f"{commands.__name__}.{module}").register(sub)
    return dict(typer.main.get_group(sub).commands)


app = typer.Typer(
    name="ornith-stack",
    help="Deploy the Ornith models with DFlash speculative decoding: profiles, planner, doctor, "
    "generated compose/Helm/Ansible files, exporter and benchmark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_LazyGroup,
)


@functools.cache
def _command() -> typer.core.TyperGroup:
    return typer.main.get_group(app)  # the app has no completion options (add_completion=False)


def eager_commands() -> dict[str, Any]:
    """Every command, each module imported (what the lazy listing must agree with)."""
    return {name: command for entry in {e.module for e in command_index().values()}
            for name, command in _loaded(entry).items()}


# A control character (C0, DEL, C1) in a word or a variable: no name, number, path, URL or key holds one.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# ORNITH_EXTRA_ARGS is split as a shell splits it: a tab or a line break there separates words.
_WHITESPACE_VARIABLES = {"ORNITH_EXTRA_ARGS": "\t\n"}


def refuse_hostile_input(argv: list[str], environ: Mapping[str, str]) -> None:
    """Refuse, before any command reads them, the values no option or variable of any command can mean: a
    control character in a word of the command line or in an ORNITH_* variable (a line break in a name becomes
    two lines of a file, one in a key a second header), and a number typed with non-ASCII digits (Python reads
    '١٢' as 12). The message quotes neither: it may be a secret."""
    # Every word after `entrypoint` is the engine's command (`sh -c SCRIPT` holds line breaks): not ours to read.
    for i, word in enumerate(argv[:1] if argv[:1] == ["entrypoint"] else argv):
        flag, eq, value = word.partition("=") if word.startswith("--") else ("", "", word)
        where = flag if eq else argv[i - 1] if i and argv[i - 1].startswith("-") and not value.startswith("-") \
            else f"word {i + 1} of the command line"
        if _CONTROL.search(word):
            raise UserError(f"{where} holds a control character (a line break, tab or escape): type the value "
                            "without it")
        if _foreign_number(value):
            raise UserError(f"{where} is a number typed with non-ASCII digits: type it with 0-9")
    for name in sorted(environ):
        allowed = _WHITESPACE_VARIABLES.get(name, "")
        if name.startswith("ORNITH_") and {c for c in _CONTROL.findall(environ[name]) if c not in allowed}:
            raise UserError(f"${name} holds a control character (a line break, tab or escape): set it without one")


def _foreign_number(value: str) -> bool:
    if value.isascii() or not any(c.isdigit() for c in value):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """Entry point: user mistakes become one 'error:' line and exit status 2, never a traceback."""
    try:
        refuse_hostile_input(sys.argv[1:] if argv is None else argv, os.environ)
        rc = _command().main(args=argv, prog_name="ornith-stack", standalone_mode=False)
    except UserError as exc:
        return _error(str(exc))
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        return _error(f"a name is longer than the system allows ({len(str(exc.filename or ''))} characters)")
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        err.print("aborted")
        return 130
    except Exception as exc:
        # Usage errors (unknown option, missing argument) carry their own message and exit code.
        # Typer vendors click, so match the behaviour rather than one module's class.
        message, code = getattr(exc, "format_message", None), getattr(exc, "exit_code", None)
        if callable(message) and isinstance(code, int):
            # No message: a bare group, whose help click has just printed.
            return _error(f"{text} (see '{_command_path(exc)} --help')", code) if (text := message()) else code
        raise
    return rc if isinstance(rc, int) else 0


def _error(message: str, code: int = 2) -> int:
    # The whole line, "error: " included, within LINE_LIMIT.
    err.print("[bold red]error:[/] " + escape(one_line(message, LINE_LIMIT - len("error: "))), highlight=False,
              soft_wrap=True)
    return code


def _command_path(exc: Exception) -> str:
    ctx = getattr(exc, "ctx", None)
    return str(getattr(ctx, "command_path", None) or app.info.name)


if __name__ == "__main__":
    sys.exit(main())
