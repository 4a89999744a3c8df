"""The two programs of a sandboxed test run; sandbox.py runs this file's source with `python -I -S -B -c`.

`candidate` runs inside the sandbox: it executes the untrusted solution as module `solution` (not
`__main__`, so demo code under `if __name__ == "__main__":` stays quiet), then serves calls to its functions
over two pipes, one request or reply per line. `judge` runs outside the sandbox: it executes the trusted
test code with each tested function replaced by a proxy that calls the candidate, and prints the verdict.

Values cross the pipes as Python literals (`repr` on one side, `decode` on the other), so a reply is plain
data: an object whose `__eq__` always says yes cannot reach the tests, and the candidate holds nothing that
could sway the verdict except the values it returns. Standard library only, Python 3.10 or newer.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import resource
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any, TextIO

MAX_LINE = 16 << 20  # the longest request (the trusted tests' arguments), in characters
MAX_REPLY = 1 << 20  # the longest reply the judge reads from the candidate, in characters
# The judge's address-space limit: parsing a reply of MAX_REPLY characters stays well inside it (a
# 10 MiB list literal would take 5 GiB of syntax tree), and a reply that cannot is a failed check.
JUDGE_MEMORY_MB = 1024
_NAMES = {"inf": float("inf"), "nan": float("nan"), "True": True, "False": False, "None": None}


def decode(text: str) -> Any:
    """A Python literal (what `repr` writes for numbers, strings, bytes, containers, inf and nan)."""
    return _value(ast.parse(text.strip(), mode="eval").body)


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_value(e) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items if isinstance(node, ast.List) else set(items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand)
        if isinstance(operand, (int, float, complex)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        left, right = _value(node.left), _value(node.right)
        if isinstance(left, (int, float)) and isinstance(right, complex):
            return left + right if isinstance(node.op, ast.Add) else left - right
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        if node.func.id in ("set", "frozenset") and len(node.args) <= 1:
            kind = set if node.func.id == "set" else frozenset
            return kind(_value(node.args[0])) if node.args else kind()
    raise ValueError(f"not a plain value: {ast.dump(node)[:80]}")


def plain(value: Any) -> Any:
    """Subclasses of the built-in containers and scalars as the built-ins themselves (a Counter as a dict,
    a namedtuple as a tuple), which compare equal to them and have a literal spelling."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    for container in (tuple, list, set, frozenset):
        if isinstance(value, container):
            return container(plain(v) for v in value)
    return value


def _send(stream: TextIO, message: Any) -> None:
    stream.write(repr(message).replace("\n", "\\n") + "\n")
    stream.flush()


def _describe(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return lines[-1].strip()[:500] if lines else type(exc).__name__


def _limit(cpu_s: int, memory_mb: int, file_mb: int, open_files: int, processes: int) -> None:
    for which, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_mb << 20),
                         (resource.RLIMIT_FSIZE, file_mb << 20), (resource.RLIMIT_NOFILE, open_files),
                         (resource.RLIMIT_NPROC, processes), (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))


def candidate(requests_fd: int, replies_fd: int, limits: list[int]) -> None:
    """Load the solution from stdin, then answer `(name, args, kwargs)` requests until they stop."""
    source = sys.stdin.read()
    sys.stdin.close()
    requests = os.fdopen(requests_fd, "r", encoding="utf-8")
    replies = os.fdopen(replies_fd, "w", encoding="utf-8")
    _limit(*limits)
    module = types.ModuleType("solution")
    module.__file__ = "solution.py"
    sys.modules["solution"] = module
    try:
        exec(compile(source, "solution.py", "exec"), module.__dict__)
    except BaseException as exc:  # noqa: BLE001 - any failure of the solution is its verdict
        traceback.print_exc()
        _send(replies, ("load-error", _describe(exc)))
        return
    _send(replies, ("ready", None))
    for line in iter(lambda: requests.readline(MAX_LINE), ""):
        name, args, kwargs = decode(line)
        try:
            _send(replies, ("ok", plain(_function(module, name)(*args, **kwargs))))
        except BaseException as exc:  # noqa: BLE001
            _send(replies, ("error", (type(exc).__name__, _describe(exc))))


def _function(module: types.ModuleType, name: str) -> Callable[..., Any]:
    """The function the tests call; a solution that defines exactly one function under another name
    (a model that was not told the name) is called through that one."""
    found = module.__dict__.get(name)
    if callable(found):
        return found  # type: ignore[no-any-return]
    own = [v for v in module.__dict__.values()
           if isinstance(v, types.FunctionType) and v.__module__ == "solution"]
    if len(own) == 1:
        return own[0]
    raise NameError(f"the solution defines no function {name!r}")


class CandidateError(Exception):
    """The solution failed in a way the tests cannot catch as a built-in exception."""


def judge(requests_fd: int, replies_fd: int) -> None:
    """Run the trusted tests (a JSON job on stdin) against the candidate; print the verdict as JSON."""
    job = json.load(sys.stdin)
    resource.setrlimit(resource.RLIMIT_AS, (JUDGE_MEMORY_MB << 20, JUDGE_MEMORY_MB << 20))
    requests = os.fdopen(requests_fd, "w", encoding="utf-8")
    replies = os.fdopen(replies_fd, "r", encoding="utf-8")
    verdict = {"passed": False, "detail": ""}
    try:
        status, payload = _reply(replies)
        if status != "ready":
            raise CandidateError(str(payload))
        namespace: dict[str, Any] = {"__name__": "tests"}
        exec(compile(job["setup"], "setup.py", "exec"), namespace)
        for name in job["functions"]:
            namespace[name] = _proxy(name, requests, replies)
        exec(compile(job["tests"], "tests.py", "exec"), namespace)
        verdict["passed"] = True
    except BaseException as exc:  # noqa: BLE001 - every failure is a failed verdict, with its reason
        verdict["detail"] = _describe(exc)
    print(json.dumps(verdict), flush=True)


def _reply(replies: TextIO) -> tuple[str, Any]:
    line = replies.readline(MAX_REPLY + 1)
    if not line:
        raise CandidateError("the solution stopped before answering (it exited, crashed or hit a limit)")
    if len(line) > MAX_REPLY:
        raise CandidateError(f"the solution returned a value longer than {MAX_REPLY} characters")
    try:
        status, payload = decode(line)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise CandidateError(f"the solution returned a value that is not plain data ({exc})") from None
    return str(status), payload


def _proxy(name: str, requests: TextIO, replies: TextIO) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        _send(requests, (name, args, kwargs))
        status, payload = _reply(replies)
        if status == "ok":
            return payload
        kind, message = payload
        exception = getattr(builtins, str(kind), None)
        if isinstance(exception, type) and issubclass(exception, Exception):
            raise exception(message)
        raise CandidateError(message)

    call.__name__ = name
    return call


if __name__ == "__main__":
    _ROLE, _IN, _OUT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if _ROLE == "candidate":
        candidate(_IN, _OUT, [int(v) for v in sys.argv[4:9]])
    else:
        judge(_IN, _OUT)
