"""The ornith-stack command. Sub-commands live in ornith_stack.commands.*; they parse and print only."""

from __future__ import annotations

import errno
import functools
import importlib
import pkgutil
import sys

import typer
import typer.core
import typer.main
from rich.console import Console
from rich.markup import escape

from ornith_stack import commands
from ornith_stack.errors import UserError, one_line

app = typer.Typer(
    name="ornith-stack",
    help="Deploy the Ornith models with DFlash speculative decoding: profiles, planner, doctor, "
    "generated compose/Helm/Ansible files, exporter and benchmark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)


@functools.cache
def _command() -> typer.core.TyperGroup:
    """The sub-commands, registered once per process: registering on every call made a process that calls
    main() repeatedly (the test suite) hold every command once per call, and each call slower than the last."""
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"{commands.__name__}.{info.name}").register(app)
    return typer.main.get_group(app)  # the app has no completion options (add_completion=False)


def main(argv: list[str] | None = None) -> int:
    """Entry point: user mistakes become one 'error:' line and exit status 2, never a traceback."""
    try:
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
    err.print("[bold red]error:[/] " + escape(one_line(message)), highlight=False, soft_wrap=True)
    return code


def _command_path(exc: Exception) -> str:
    ctx = getattr(exc, "ctx", None)
    return str(getattr(ctx, "command_path", None) or app.info.name)


if __name__ == "__main__":
    sys.exit(main())
