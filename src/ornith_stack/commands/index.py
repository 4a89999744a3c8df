"""The sub-commands and their help as their modules' source states it, read without importing them.

`ornith-stack --help` lists every command; importing each module for that (the bench's imports sympy) took most of
the 2.2 s the listing took. Each command module registers its commands in `register(app)` with
`@app.command("name")`, `app.command("name")(function)` or `app.add_typer(group, name="name")`; this reads those
calls from the module's syntax tree. The help of a command is its `help=` or its function's docstring, as Typer
takes it; tests/unit/test_cli_lazy.py checks that the listing agrees with the imported commands.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_HERE = Path(__file__).parent


@dataclass(frozen=True)
class CommandEntry:
    module: str  # the module under ornith_stack.commands that registers it
    help: str | None
    hidden: bool = False


@cache
def command_index() -> dict[str, CommandEntry]:
    """Command name -> where it is and its help, in the order of the modules' names and of registration."""
    found: dict[str, CommandEntry] = {}
    for path in sorted(_HERE.glob("*.py")):
        if path.stem in ("__init__", "index"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        found.update(_registered(path.stem, tree))
    return found


def _registered(module: str, tree: ast.Module) -> dict[str, CommandEntry]:
    register = next((node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "register"), None)
    if register is None or not register.args.args:
        return {}
    app = register.args.args[0].arg
    functions = {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    groups = {target.id: call for node in ast.walk(register) if isinstance(node, ast.Assign)
              and isinstance(call := node.value, ast.Call) and _is_typer(call)
              for target in node.targets if isinstance(target, ast.Name)}
    found: dict[str, CommandEntry] = {}
    for node in ast.walk(register):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                if _method_call(decorator, app, "command"):
                    name, entry = _command(module, decorator, node)  # type: ignore[arg-type]
                    found[name] = entry
        elif isinstance(node, ast.Call) and _method_call(node.func, app, "command"):
            target = node.args[0] if node.args else None
            if isinstance(target, ast.Name) and target.id in functions:
                name, entry = _command(module, node.func, functions[target.id])  # type: ignore[arg-type]
                found[name] = entry
        elif isinstance(node, ast.Call) and _method_call(node, app, "add_typer"):
            name_kw = _keyword(node, "name")
            group = groups.get(node.args[0].id) if node.args and isinstance(node.args[0], ast.Name) else None
            group_help = _keyword(group, "help")
            if isinstance(name_kw, str):
                found[name_kw] = CommandEntry(module, group_help if isinstance(group_help, str) else None,
                                              bool(_keyword(node, "hidden")))
    return found


def _command(module: str, call: ast.Call, function: ast.FunctionDef) -> tuple[str, CommandEntry]:
    named = call.args[0].value if call.args and isinstance(call.args[0], ast.Constant) else None
    name = named if isinstance(named, str) else function.name.replace("_", "-")
    help_text = _keyword(call, "help")
    if not isinstance(help_text, str):
        docstring = ast.get_docstring(function, clean=False)
        help_text = inspect.cleandoc(docstring) if docstring else None
    return name, CommandEntry(module, help_text, bool(_keyword(call, "hidden")))


def _method_call(node: ast.AST, owner: str, method: str) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method
            and isinstance(node.func.value, ast.Name) and node.func.value.id == owner)


def _is_typer(call: ast.Call) -> bool:
    func = call.func
    return (isinstance(func, ast.Attribute) and func.attr == "Typer") or (isinstance(func, ast.Name)
                                                                          and func.id == "Typer")


def _keyword(call: ast.Call | None, name: str) -> object:
    for keyword in call.keywords if call is not None else []:
        if keyword.arg == name and isinstance(keyword.value, ast.Constant):
            return keyword.value.value
    return None
