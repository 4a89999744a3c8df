"""Reading input the user controls, with limits: regular files only, size caps, bounded nesting.

Every file a command reads on the user's behalf (profiles, model configs, checkpoint indexes) and every
YAML value typed on the command line goes through here, so a FIFO, a device, a link to /dev/zero, a
deeply nested value or a YAML alias bomb is one error line instead of a hang, a crash or gigabytes.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from ornith_stack.errors import UserError, shown

# A configuration file (profile, config.json, safetensors index) is kilobytes; 64 MiB is far beyond any.
MAX_CONFIG_BYTES = 64 << 20
# Nesting no configuration needs; Python's recursion limit (1000) is far above it.
MAX_DEPTH = 64


def read_text(path: Path, limit: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of regular file `path`, refusing FIFOs, devices, folders and files over `limit` bytes."""
    try:
        with open_regular(path) as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise UserError(f"cannot read {_name(path)}: {exc.strerror}") from None
    if len(data) > limit:
        raise UserError(f"{_name(path)} is larger than {limit:,} bytes; not a configuration file")
    return _utf8(data, _name(path))


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for binary reading once it is proven a regular file (a FIFO would block, a device
    never end); the caller closes it. Errors are UserErrors naming the file."""
    require_regular(path)
    try:
        # O_NONBLOCK: a FIFO swapped in after the check cannot block the open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UserError(f"{_name(path)} is missing") from None
    except OSError as exc:
        raise UserError(f"cannot read {_name(path)}: {exc.strerror}") from None
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        raise UserError(f"{_name(path)} is not a regular file; refusing to read it")
    return handle


def read_lines(path: Path, line_limit: int, total_limit: int) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of regular file `path` (gzip-compressed when it ends in .gz), as
    UTF-8, refusing a line over `line_limit` bytes and more than `total_limit` bytes in all (decompressed)."""
    total = 0
    try:
        with open_regular(path) as raw, (gzip.GzipFile(fileobj=raw) if path.suffix == ".gz" else raw) as handle:
            for number in itertools.count(1):
                line = handle.readline(line_limit + 1)
                if not line:
                    return
                total += len(line)
                if len(line) > line_limit and not line.endswith(b"\n"):
                    raise UserError(f"{_name(path)}:{number}: a line longer than {line_limit:,} bytes")
                if total > total_limit:
                    raise UserError(f"{_name(path)} holds more than {total_limit:,} bytes")
                yield number, _utf8(line, f"{_name(path)}:{number}")
    except (OSError, EOFError, zlib.error) as exc:
        raise UserError(f"cannot read {_name(path)}: {getattr(exc, 'strerror', None) or exc}") from None


def _utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{where}: not UTF-8 text") from None


def require_regular(path: Path) -> None:
    """Refuse `path` unless it is (a link to) a regular file: a FIFO would block, a device never end."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UserError(f"{_name(path)} is missing") from None
    except OSError as exc:
        raise UserError(f"cannot read {_name(path)}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{_name(path)} is not a regular file (a folder, FIFO or device); refusing to read it")


def read_json_object(path: Path, limit: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A JSON file whose top level is an object (config.json, an index); errors name the file."""
    return _mapping(parse_json(read_text(path, limit), _name(path)), path, "a JSON object")


def parse_json(text: str, where: str) -> Any:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise UserError(f"{where}: JSON nested deeper than {MAX_DEPTH} levels") from None
    _check_depth(data, where)
    return data


def read_yaml_mapping(path: Path, limit: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A YAML file whose top level is a mapping; errors name the file and line."""
    return _mapping(parse_yaml(read_text(path, limit), _name(path)), path, "a mapping")


def _mapping(data: Any, path: Path, kind: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise UserError(f"{_name(path)}: expected {kind} at the top level, got {type(data).__name__}")
    return data


def parse_yaml(text: str, where: str, value: bool = False) -> Any:
    """`text` as YAML with safe types, at most MAX_DEPTH levels deep, with no alias to a mapping or list.

    Errors name `where` and the line of a file, or say "not a valid YAML value" for one `value`.
    """
    try:
        return yaml.load(text, Loader=_LimitedLoader)  # noqa: S506 - _LimitedLoader is a SafeLoader
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or exc
        if value:
            raise UserError(f"{where}: not a valid YAML value ({problem})") from None
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{where}:{line} is not valid YAML: {problem}") from None


class _LimitedLoader(yaml.SafeLoader):
    """SafeLoader whose composer refuses deep nesting and aliases of collections (the 'billion laughs').

    An alias of a scalar repeats one string; an alias of a mapping or list multiplies the document.
    """

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            anchored = self.anchors.get(event.anchor)
            if anchored is not None and not isinstance(anchored, yaml.ScalarNode):
                raise yaml.composer.ComposerError(
                    None, None, f"alias *{event.anchor} repeats a mapping or list; write it out instead",
                    event.start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _check_depth(data: Any, where: str) -> None:
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise UserError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children)


def _name(path: Path) -> str:
    return shown(str(path), 200).strip("'\"")
