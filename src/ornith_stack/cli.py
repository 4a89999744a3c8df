"""The ornith-stack command. Sub-commands live in ornith_stack.commands.*; they parse and print only."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer
from rich.console import Console
from rich.markup import escape

from ornith_stack import commands
from ornith_stack.errors import UserError

app = typer.Typer(
    name="ornith-stack",
    help="Deploy the Ornith models with DFlash speculative decoding: profiles, planner, doctor, "
    "generated compose/Helm/Ansible files, exporter and benchmark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)


def _register_commands() -> None:
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"{commands.__name__}.{info.name}").register(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point: user mistakes become one 'error:' line and exit status 2, never a traceback."""
    _register_commands()
    try:
        rc = app(args=argv, standalone_mode=False)
    except UserError as exc:
        err.print("[bold red]error:[/] " + escape(str(exc)), highlight=False, soft_wrap=True)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        err.print("aborted")
        return 130
    except Exception as exc:
        # Usage errors (unknown option, missing argument) carry their own message and exit code.
        # Typer vendors click, so match the behaviour rather than one module's class.
        show, code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(code, int):
            show()
            return code
        raise
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
