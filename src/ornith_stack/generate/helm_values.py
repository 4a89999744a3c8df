"""The Helm chart's values, described once: helm/ornith/values.yaml, annotated.

The comment block above a key documents it; a comment line `@schema {...}` (a YAML flow mapping) adds
JSON Schema keywords the default value does not imply (`enum`, `minimum`, `pattern`, `items`, ...;
`required: true` lists the key in its parent's `required`). From that one source come
values.schema.json (types inferred from the defaults, unknown keys refused) and the README's table.
A mapping whose children carry no comments of their own is one value (e.g. a security context).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from ornith_stack.errors import UserError

SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"
ANNOTATION = "@schema"
# Keywords after which the default value says nothing about the type.
_TYPED_BY_ANNOTATION = ("type", "anyOf", "oneOf", "allOf", "$ref", "const")
# A `key:` line of a values file, with its indentation.
_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w.-]*):(\s|$)")


@dataclass(frozen=True)
class Value:
    """One key of values.yaml with its documentation."""

    path: str  # dotted
    default: Any
    description: str
    keywords: dict[str, Any] = field(default_factory=dict)  # from @schema
    children: tuple[Value, ...] = ()  # documented keys of a mapping, in file order

    @property
    def documented_leaves(self) -> list[Value]:
        """The rows of the values table: this value, or its documented children's rows."""
        return [self] if not self.children else [row for c in self.children for row in c.documented_leaves]


@dataclass
class _Notes:
    text: list[str] = field(default_factory=list)
    keywords: dict[str, Any] = field(default_factory=dict)


def _comments(text: str, source: str) -> dict[str, _Notes]:
    """Dotted key -> the comment block right above it (a blank line ends a block)."""
    found: dict[str, _Notes] = {}
    stack: list[tuple[int, str]] = []
    pending = _Notes()
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#"):
            body = stripped.lstrip("#").strip()
            if body.startswith(ANNOTATION):
                pending.keywords.update(_keywords(body.removeprefix(ANNOTATION), f"{source}:{number}"))
            else:
                pending.text.append(body)
            continue
        match = _KEY.match(line)
        if not match:
            pending = _Notes() if not stripped else pending
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([name for _, name in stack] + [match["key"]])
        stack.append((indent, match["key"]))
        if pending.text or pending.keywords:
            found[path] = pending
        pending = _Notes()
    return found


def _keywords(text: str, where: str) -> dict[str, Any]:
    try:
        keywords = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "not YAML"
        raise UserError(f"{where}: {ANNOTATION} is not a YAML mapping ({problem})") from None
    if not isinstance(keywords, dict):
        raise UserError(f"{where}: {ANNOTATION} must be followed by a mapping, e.g. {ANNOTATION} {{minimum: 1}}")
    return keywords


def parse(text: str, source: str = "values.yaml") -> list[Value]:
    """The documented values of a values file, in file order."""
    comments = _comments(text, source)
    data = yaml.safe_load(text)
    return _values(data if isinstance(data, dict) else {}, "", comments)


def _values(node: dict[str, Any], prefix: str, comments: dict[str, _Notes]) -> list[Value]:
    values = []
    for key, default in node.items():
        path = f"{prefix}{key}"
        notes = comments.get(path, _Notes())
        nested = isinstance(default, dict) and any(c.startswith(path + ".") for c in comments)
        children = tuple(_values(default, path + ".", comments)) if nested else ()
        values.append(Value(path, default, " ".join(notes.text), dict(notes.keywords), children))
    return values


# JSON Schema's type of a YAML default; bool before int, since a bool is an int in Python.
_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"), (dict, "object"),
)


def _type(value: Any) -> str:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "null")


def _node(value: Value) -> dict[str, Any]:
    keywords = {k: v for k, v in value.keywords.items() if k != "required"}
    node: dict[str, Any] = {}
    if value.children:
        node = {"type": "object", "additionalProperties": False, **_properties(value.children)}
    elif not any(k in keywords for k in _TYPED_BY_ANNOTATION):
        node = {"type": _type(value.default)}
    node["description"] = value.description
    node.update(keywords)
    return node


def _properties(values: tuple[Value, ...] | list[Value]) -> dict[str, Any]:
    body: dict[str, Any] = {"properties": {v.path.rsplit(".", 1)[-1]: _node(v) for v in values}}
    required = [v.path.rsplit(".", 1)[-1] for v in values if v.keywords.get("required") is True]
    if required:
        body["required"] = required
    return body


def schema(values: list[Value], title: str) -> dict[str, Any]:
    """The JSON Schema (draft 7) of a values file: what Helm checks before rendering."""
    return {"$schema": SCHEMA_DIALECT, "title": title, "type": "object", "additionalProperties": False,
            **_properties(values)}


def table(values: list[Value]) -> str:
    """The Markdown table of every documented value: key, default, description."""
    rows = ["| key | default | description |", "|---|---|---|"]
    for value in (row for v in values for row in v.documented_leaves):
        cell = value.description.replace("|", "\\|")
        rows.append(f"| `{value.path}` | `{json.dumps(value.default)}` | {cell} |")
    return "\n".join(rows)
