"""The Helm chart's values, described once: helm/ornith/values.yaml, annotated as the Helm ecosystem does.

- helm-docs (github.com/norwoodj/helm-docs) comments: `# -- description` right above a key, continued by
  the comment lines after it; `# -- (type) description` names the type; `# @default -- text` is shown
  instead of the default; `# @section -- name` puts the key's row in a table of its own. `table` writes
  the README's values table as helm-docs writes it (Key | Type | Default | Description, rows sorted by key,
  a table per section and "Other Values" last).
- dadav/helm-schema annotations: JSON Schema keywords in YAML between two `# @schema` lines, above the
  description (helm-docs would print them as description otherwise); `required: true` lists the key in its
  parent's `required`. `schema` writes values.schema.json (draft 7): types from the defaults unless a
  keyword gives one, unknown keys refused, each key described as in the table.

A mapping none of whose keys carries a comment block is one value in the schema (e.g. a security context).
helm-docs itself is a Go program; this module reads the same comments the same way, so either tool gives
one table (tests/unit/test_helm_values.py checks each rule on a sample, tests/fixtures/helm-docs).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import yaml

from ornith_stack.errors import UserError

SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"
SCHEMA_MARK = "# @schema"
DEFAULT_SECTION = "Other Values"  # helm-docs' name for the rows of no section
TABLE_HEADER = "| Key | Type | Default | Description |\n|-----|------|---------|-------------|"
# The lines of a helm-docs comment block: `# -- [(type)] text` opens the description, `# @default -- text`
# and `# @section -- name` are tags, any other `# text` line continues the description.
_OPENING = re.compile(r"#\s*--\s?(?P<text>.*)")
_TAG = re.compile(r"#\s*@(?P<tag>\w+)\s+--\s?(?P<text>.*)")
_TYPED = re.compile(r"\((?P<type>[^()]+)\)\s*(?P<text>.*)")
_TAGS = ("default", "section")
# Keywords after which the default value says nothing about the type.
_TYPED_BY_KEYWORDS = ("type", "anyOf", "oneOf", "allOf", "$ref", "const")
# helm-docs' type names of a default, and the JSON Schema types of helm-docs' names (as helm-schema maps them).
_HELM_DOCS_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "bool"), (int, "int"), (float, "float"), (str, "string"), (list, "list"), (dict, "object"))
_JSON_TYPES = {"bool": "boolean", "boolean": "boolean", "int": "integer", "integer": "integer", "float": "number",
               "number": "number", "string": "string", "tpl": "string", "list": "array", "array": "array",
               "object": "object", "map": "object", "null": "null"}


@dataclass(frozen=True)
class Doc:
    """What the comment block right above a key (or list item) says."""

    description: str = ""
    type: str = ""  # `# -- (type) ...`
    default: str = ""  # `# @default -- ...`
    section: str = ""  # `# @section -- ...`
    keywords: dict[str, Any] = field(default_factory=dict)  # the `# @schema` block
    commented: bool = False  # any comment block at all


@dataclass(frozen=True)
class Value:
    """A key of a mapping in values.yaml: its default, its comments and, for a mapping, its keys."""

    path: str  # helm-docs' key: dotted, a segment with "." or " " quoted
    name: str
    default: Any
    doc: Doc
    children: tuple[Value, ...] = ()  # the keys of a mapping with a commented key

    @property
    def description(self) -> str:
        return self.doc.description


@dataclass(frozen=True)
class Row:
    """A row of the values table, as helm-docs makes it."""

    key: str
    type: str
    default: str
    description: str
    section: str


@dataclass(frozen=True)
class Values:
    """A parsed values file: its keys (for the schema) and its table rows (for the README)."""

    keys: tuple[Value, ...]
    rows: tuple[Row, ...]


class _Reader:
    def __init__(self, text: str, source: str) -> None:
        self.lines = text.splitlines()
        self.source = source

    def doc(self, node: yaml.Node, item: bool = False) -> Doc:
        """The comment block directly above `node` (a blank line ends it), when `node` begins its line."""
        line, column = node.start_mark.line, node.start_mark.column
        before = self.lines[line][:column] if line < len(self.lines) else ""
        if before.strip(" -" if item else " "):
            return Doc()  # in a flow collection, or a key after "- ": the comment belongs to what comes first
        start = line
        while start > 0 and self.lines[start - 1].lstrip().startswith("#"):
            start -= 1
        block = [text.strip() for text in self.lines[start:line]]
        if not block:
            return Doc()
        where = f"{self.source}:{start + 1}"
        keywords, rest = _schema_block(block, where)
        return _helm_docs(rest, where, keywords)


def _schema_block(block: list[str], where: str) -> tuple[dict[str, Any], list[str]]:
    """The keywords of the `# @schema` block in `block`, and the other lines."""
    marks = [i for i, line in enumerate(block) if line == SCHEMA_MARK]
    if not marks:
        return {}, block
    if len(marks) != 2:
        raise UserError(f"{where}: a {SCHEMA_MARK} block opens and closes with a `{SCHEMA_MARK}` line each "
                        f"({len(marks)} found above one key)")
    first, last = marks
    if any(line.startswith("# --") for line in block[:first]):
        raise UserError(f"{where}: the {SCHEMA_MARK} block comes after the `# --` description, where helm-docs "
                        "prints it: put it above")
    body = "\n".join(re.sub(r"^# ?", "", line) for line in block[first + 1:last])
    try:
        keywords = yaml.safe_load(body) if body.strip() else {}
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "not YAML"
        raise UserError(f"{where}: the {SCHEMA_MARK} block is not YAML ({problem})") from None
    if not isinstance(keywords, dict):
        raise UserError(f"{where}: a {SCHEMA_MARK} block holds a mapping of JSON Schema keywords, e.g. `# minimum: 1`")
    return keywords, block[:first] + block[last + 1:]


def _helm_docs(block: list[str], where: str, keywords: dict[str, Any]) -> Doc:
    """What helm-docs reads in a comment block: the description starts at the last `# --` line (a second
    one makes helm-docs drop what came before it), the lines after it continue it or are tags."""
    starts = [i for i, line in enumerate(block) if _OPENING.fullmatch(line)]
    if not starts:
        return Doc(keywords=keywords, commented=True)
    opening = _OPENING.fullmatch(block[starts[-1]])
    assert opening is not None
    description = opening["text"]
    if " --" in description:
        # helm-docs splits a first line at its last " --": the words before it would name another key.
        raise UserError(f"{where}: helm-docs reads `{block[starts[-1]][:60]}` as the description of another "
                        "key (a ' --' in the first line): reword it")
    kind = ""
    if typed := _TYPED.fullmatch(description):
        kind, description = typed["type"], typed["text"]
    tags: dict[str, str] = {}
    for line in block[starts[-1] + 1:]:
        if tag := _TAG.fullmatch(line):
            if tag["tag"] not in _TAGS:
                raise UserError(f"{where}: `@{tag['tag']}` is not a tag this chart's table uses "
                                f"({', '.join('@' + t for t in _TAGS)})")
            tags[tag["tag"]] = tag["text"]
        else:
            description += " " + line[1:].strip()
    return Doc(description.strip(), kind, tags.get("default", ""), tags.get("section", ""), keywords, True)


def _key(prefix: str, name: str) -> str:
    segment = f'"{name}"' if "." in name or " " in name else name
    return f"{prefix}.{segment}" if prefix else segment


def _construct(node: yaml.Node) -> Any:
    return yaml.SafeLoader("").construct_object(node, deep=True)


def parse(text: str, source: str = "values.yaml") -> Values:
    """The keys and table rows of a values file."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        raise UserError(f"{source}: not YAML ({getattr(exc, 'problem', None) or exc})") from None
    if root is None:
        return Values((), ())
    if not isinstance(root, yaml.MappingNode):
        raise UserError(f"{source}: a values file is a mapping")
    reader = _Reader(text, source)
    return Values(tuple(_keys(root, "", reader)), tuple(_rows("", Doc(), root, reader, True)))


def _keys(node: yaml.MappingNode, prefix: str, reader: _Reader) -> list[Value]:
    values = []
    for key_node, value_node in node.value:
        name = str(key_node.value)
        path = _key(prefix, name)
        children: tuple[Value, ...] = ()
        if isinstance(value_node, yaml.MappingNode) and any(reader.doc(k).commented for k, _ in value_node.value):
            children = tuple(_keys(value_node, path, reader))
        values.append(Value(path, name, _construct(value_node), reader.doc(key_node), children))
    return values


def _rows(prefix: str, doc: Doc, node: yaml.Node, reader: _Reader, leaves: bool) -> list[Row]:
    """helm-docs' rows of a node: every leaf while no mapping or list above it is described, then only
    described ones; a described mapping or list is a row of its own."""
    if isinstance(node, yaml.ScalarNode):
        return [_row(prefix, _construct(node), doc)] if leaves or doc.description else []
    if not isinstance(node, yaml.MappingNode | yaml.SequenceNode):
        return []
    if not node.value:
        if not prefix or not (leaves or doc.description):
            return []
        return [_row(prefix, _construct(node), doc)]
    rows = []
    if doc.description:
        rows.append(_row(prefix, _construct(node), doc))
        leaves = False
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            rows += _rows(_key(prefix, str(key_node.value)), reader.doc(key_node), value_node, reader, leaves)
    else:
        for i, item in enumerate(node.value):
            rows += _rows(f"{prefix}[{i}]", reader.doc(item, item=True), item, reader, leaves)
    return rows


def _row(key: str, value: Any, doc: Doc) -> Row:
    kind = doc.type or next((name for t, name in _HELM_DOCS_TYPES if isinstance(value, t)), "string")
    default = doc.default or ("`nil`" if value is None else f"`{go_json(value)}`")
    return Row(key, kind, default, doc.description, doc.section)


def go_json(value: Any) -> str:
    """JSON as helm-docs writes a default (Go's encoding/json): compact, map keys sorted, no HTML escapes,
    floats in Go's shortest form (1 for 1.0, 0.00001 for 1e-05)."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{go_json(str(k))}:{go_json(v)}" for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    if isinstance(value, float) and not isinstance(value, bool) and value == value and abs(value) != float("inf"):
        if value == 0 or 1e-6 <= abs(value) < 1e21:
            text = format(Decimal(repr(value)), "f")
            return text.rstrip("0").rstrip(".") if "." in text else text
        return repr(value)
    if not isinstance(value, str | int | float | bool | type(None)):
        value = str(value)  # a timestamp: helm-docs shows its text
    return json.dumps(value, ensure_ascii=False)


def table(rows: tuple[Row, ...] | list[Row]) -> str:
    """The values table(s) as helm-docs' default template writes them (rows sorted by key; with sections, a
    `### name` table per section in order of first appearance, then "Other Values")."""
    ordered = sorted(rows, key=lambda r: r.key)

    def lines(chosen: list[Row]) -> str:
        return TABLE_HEADER + "".join(f"\n| {r.key} | {r.type} | {r.default} | {r.description} |" for r in chosen)

    sections = list(dict.fromkeys(r.section for r in ordered if r.section))
    if not sections:
        return lines(ordered)
    parts = [f"### {name}\n\n{lines([r for r in ordered if r.section == name])}" for name in sections]
    rest = [r for r in ordered if not r.section]
    if rest:
        parts.append(f"### {DEFAULT_SECTION}\n\n{lines(rest)}")
    return "\n\n".join(parts)


def _node(value: Value) -> dict[str, Any]:
    keywords = {k: v for k, v in value.doc.keywords.items() if k != "required"}
    node: dict[str, Any] = {}
    if value.children:
        node = {"type": "object", "additionalProperties": False, **_properties(value.children)}
    elif not any(k in keywords for k in _TYPED_BY_KEYWORDS):
        named = _JSON_TYPES.get(value.doc.type, "")
        node = {"type": named or next((_JSON_TYPES[n] for t, n in _HELM_DOCS_TYPES if isinstance(value.default, t)),
                                      "null")}
    if value.description:
        node["description"] = value.description
    node.update(keywords)
    return node


def _properties(values: tuple[Value, ...]) -> dict[str, Any]:
    body: dict[str, Any] = {"properties": {v.name: _node(v) for v in values}}
    required = [v.name for v in values if v.doc.keywords.get("required") is True]
    if required:
        body["required"] = required
    return body


def schema(values: Values, title: str) -> dict[str, Any]:
    """The JSON Schema (draft 7) of a values file: what Helm checks before rendering."""
    return {"$schema": SCHEMA_DIALECT, "title": title, "type": "object", "additionalProperties": False,
            **_properties(values.keys)}


def keys_in_section(values: Values, section: str) -> list[str]:
    """The table's keys of one section, in file order."""
    return [r.key for r in values.rows if r.section == section]
