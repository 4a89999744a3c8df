"""Frozen dataclasses to JSON and back: one encoder, and one decoder that checks every value.

The decoder follows each field's type hint (int, float, str, bool, None, unions of them, tuples, dicts with
string keys, nested dataclasses, Any) and names the field's path in its error, e.g.
`suites.decode.samples[3].ttft_s: expected float or None, got 'abc'`. A missing field takes its default
(results written by older versions lack later fields); a field without default is required; keys the
class does not know are skipped.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

from ornith_stack.errors import shown

T = TypeVar("T")
# Field metadata: the key is left out of the JSON when the value is None (keys written only sometimes).
OMIT_NONE = {"omit_none": True}


class Malformed(ValueError):
    """A JSON value that does not fit the type: `path` names the field, `problem` what is wrong."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path or 'the top level'}: {problem}")
        self.path = path
        self.problem = problem


def to_json(value: Any) -> Any:
    """`value` (dataclasses, tuples, dicts, scalars) as plain JSON data; dataclass fields in their order."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(v) for f in dataclasses.fields(value)
                if (v := getattr(value, f.name)) is not None or not f.metadata.get("omit_none")}
    if isinstance(value, tuple | list):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


def from_json(cls: type[T], data: Any, path: str = "") -> T:
    """`data` (parsed JSON) as an instance of dataclass `cls`; Malformed names the first field that does not fit."""
    return typing.cast(T, _decode(cls, data, path))


def _decode(hint: Any, data: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    if hint is Any:
        return data
    if origin is typing.Union or origin is types.UnionType:
        return _union(hint, data, path)
    if origin is tuple:
        return tuple(_decode(typing.get_args(hint)[0], item, f"{path}[{i}]") for i, item in enumerate(_list(data, path)))
    if origin is dict:
        value_hint = typing.get_args(hint)[1]
        return {key: _decode(value_hint, item, f"{path}.{_key(key)}") for key, item in _object(data, path).items()}
    if dataclasses.is_dataclass(hint):
        return _dataclass(hint, _object(data, path), path)
    return _scalar(hint, data, path)


def _union(hint: Any, data: Any, path: str) -> Any:
    options = typing.get_args(hint)
    if data is None and type(None) in options:
        return None
    errors = []
    for option in options:
        if option is not type(None):
            try:
                return _decode(option, data, path)
            except Malformed as exc:
                errors.append(exc)
    # An option that took the value apart (an object, a list) knows which field inside does not fit.
    deepest = max(errors, key=lambda exc: len(exc.path))
    if deepest.path != path:
        raise deepest
    raise Malformed(path, f"expected {_name(hint)}, got {_got(data)}")


def _scalar(hint: Any, data: Any, path: str) -> Any:
    if hint is bool and isinstance(data, bool):
        return data
    if hint is int and isinstance(data, int) and not isinstance(data, bool):
        return data
    if hint is float and isinstance(data, int | float) and not isinstance(data, bool):
        return float(data)
    if hint is str and isinstance(data, str):
        return data
    if hint not in (bool, int, float, str):
        raise TypeError(f"{path}: {hint!r} has no JSON form")
    raise Malformed(path, f"expected {_name(hint)}, got {_got(data)}")


def _list(data: Any, path: str) -> list[Any]:
    if not isinstance(data, list):
        raise Malformed(path, f"expected a list, got {_got(data)}")
    return data


def _object(data: Any, path: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise Malformed(path, f"expected an object, got {_got(data)}")
    return data


def _dataclass(cls: Any, data: dict[str, Any], path: str) -> Any:
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        where = f"{path}.{f.name}" if path else f.name
        if f.name in data:
            values[f.name] = _decode(hints[f.name], data[f.name], where)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise Malformed(where, "missing")
    return cls(**values)


@functools.cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _name(hint: Any) -> str:
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "a string", type(None): "null"}
    return " or ".join(names.get(o, "an object" if dataclasses.is_dataclass(o) else "a list or object") for o in options)


def _key(key: str) -> str:
    return key if len(key) <= 40 else f"{key[:39]}…"


def _got(data: Any) -> str:
    return shown(data, 60)
