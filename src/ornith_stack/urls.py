"""The one parser of engine addresses the user types (exporter --target, bench --url)."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit, urlunsplit

from ornith_stack.errors import UserError, shown

SCHEMES = ("http", "https")
MAX_URL = 2048
# Whitespace, control characters and the characters no URL carries unescaped.
_FORBIDDEN = re.compile(r"[\s\x00-\x1f\x7f<>\"\\^`{|}]")


def engine_url(text: str, option: str) -> str:
    """`text` as an http(s) base URL with a host and a port from 1 to 65535 (or the scheme's default).

    A bare `HOST:PORT` means http://HOST:PORT; the answer has no trailing slash. Anything else is a
    UserError naming `option` (`--target`, `--url`).
    """
    url = text.strip()
    example = f"e.g. {option} http://127.0.0.1:8000"
    if not url:
        raise UserError(f"{option}: empty URL; {example}")
    if len(url) > MAX_URL or _FORBIDDEN.search(url):
        raise UserError(f"{option} {shown(text)}: a URL has no spaces, control characters or quotes; {example}")
    if "://" not in url:
        url = "http://" + url
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # an unclosed [IPv6 bracket, a port that is not a number or out of range
        raise UserError(f"{option} {shown(text)}: not a URL ({exc}); {example}") from None
    if parts.scheme not in SCHEMES:
        raise UserError(f"{option} {shown(text)}: only {' and '.join(s + '://' for s in SCHEMES)} are supported")
    if not parts.hostname:
        raise UserError(f"{option} {shown(text)}: no host; {example}")
    if not _host_name(parts.hostname):
        raise UserError(f"{option} {shown(text)}: the host is not a name DNS can carry (labels of 1 to 63 "
                        f"characters, 253 in all) nor an address; {example}")
    if port == 0:
        raise UserError(f"{option} {shown(text)}: port 0 is not a port a server listens on; {example}")
    if parts.query or parts.fragment:
        raise UserError(f"{option} {shown(text)}: a base URL has no ?query or #fragment; {example}")
    return url.rstrip("/")


def _host_name(host: str) -> bool:
    """Whether the resolver (and the IDNA encoding every HTTP client applies first) takes `host`."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    try:
        encoded = host.encode("idna")
    except UnicodeError:  # a label empty or over 63 characters, or not encodable
        return False
    return len(encoded) <= 253


def redact(url: str) -> str:
    """`url` without a user:password@ part (whatever else it holds, even a port that is not a number)."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return url if host == parts.netloc else urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def is_loopback(bind: str) -> bool:
    """Whether a bind address (compose's ORNITH_BIND, ORNITH_MONITORING_BIND) reaches this machine only."""
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        return bind == "localhost"
