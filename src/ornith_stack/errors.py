"""Errors a user can fix. The CLI prints them as one line and exits 2; anything else is a bug."""

from __future__ import annotations

import re

# An error line quotes at most this much of the user's input, and is at most LINE_LIMIT characters.
QUOTE_LIMIT = 80
LINE_LIMIT = 1000
_BREAKS = re.compile(r"\s*[\r\n\v\f\x85\u2028\u2029]+\s*")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")


class UserError(Exception):
    """A mistake in input the user controls: a name, a file, a flag, an unreachable engine."""


def shown(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`value`'s repr for an error message, cut to `limit` characters (input can be megabytes long)."""
    text = repr(value) if len(str(value)) <= limit * 4 else repr(str(value)[: limit * 4])
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(str(value)):,} characters)"


def one_line(message: str, limit: int = LINE_LIMIT) -> str:
    """`message` as one line of UTF-8: line breaks become '; ', control characters are dropped, long text is cut."""
    text = _CONTROL.sub("", _BREAKS.sub("; ", message.strip()))
    # Undecodable bytes of a command line (surrogates) shown escaped: a strict UTF-8 stream refuses them.
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "…"
