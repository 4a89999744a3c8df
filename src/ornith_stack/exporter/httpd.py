"""A small HTTP/1.1 server its own clients cannot starve: one event loop reads every request head, a
bounded pool does the work.

The wsgiref server it replaces gave each connection a thread and no timeout: 500 idle connections made
504 threads, one-byte-every-10-s senders held theirs for minutes, and 1,024 of them under a 1,024
open-file limit left /metrics unanswered (issue 31). Here an idle or slow connection costs one socket
and a little memory: its request head must arrive whole within `Limits.read_timeout` (keep-alive waits
included), and past `Limits.max_connections` the connection that has waited longest without a request
in progress is closed to make room, so a new scraper always gets in. Only complete requests reach the
handler; it awaits what it waits for (the engines' scrapes) without holding a thread.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import urlsplit

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    # Seconds for a whole request head to arrive, from when the connection starts waiting for one.
    read_timeout: float = 10.0
    # Seconds for an answer to be taken by the client.
    write_timeout: float = 10.0
    # Connections held open at once; far below the usual 1,024 open files, with room for the targets.
    max_connections: int = 256
    # Bytes of one request head (request line and headers).
    max_head_bytes: int = 16 * 1024


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # the path of the request target, as sent (no normalisation: `//metrics` is not `/metrics`)
    query: str
    headers: dict[str, str]  # names in lower case

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


@dataclass(frozen=True)
class Response:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    # Content-Length is sent unless this is False (a HEAD answer that does not compute its body).
    length: bool = True


Handler = Callable[[Request], Awaitable[Response]]


class BadRequest(ValueError):
    pass


def parse_head(head: bytes) -> tuple[Request, bool]:
    """A request head (up to its blank line) as a Request and whether the connection may be kept."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.0", "HTTP/1.1") or not parts[0].isalpha():
        raise BadRequest(f"bad request line {lines[0][:80]!r}")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(f"bad header line {line[:80]!r}")
        headers[name.lower()] = value.strip()
    if target.startswith("/"):
        path, _, query = target.partition("?")
    elif target.startswith(("http://", "https://")):  # absolute form, which a server must accept
        split = urlsplit(target)
        path, query = split.path or "/", split.query
    else:
        path, query = target, ""
    # A body is never read: a request announcing one is answered, then its connection closed.
    has_body = headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers
    keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close" and not has_body
    return Request(method, path, query, headers), keep


def encode(response: Response, keep: bool, head_only: bool) -> bytes:
    status = HTTPStatus(response.status)
    lines = [f"HTTP/1.1 {status.value} {status.phrase}", *(f"{k}: {v}" for k, v in response.headers)]
    if response.length:
        lines.append(f"Content-Length: {len(response.body)}")
    if not keep:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else response.body)


class _Connection:
    __slots__ = ("writer", "busy")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer, self.busy = writer, False


class BoundedServer:
    """Serves `handler` on a listening socket until the task running `serve` is cancelled."""

    def __init__(self, handler: Handler, limits: Limits = Limits()) -> None:
        self.handler, self.limits = handler, limits
        # Open connections, the longest waiting first (dicts keep insertion order).
        self._open: dict[_Connection, None] = {}

    @property
    def connections(self) -> int:
        return len(self._open)

    async def serve(self, sock: socket.socket, ready: Callable[[], None] | None = None) -> None:
        server = await asyncio.start_server(self._connection, sock=sock, limit=self.limits.max_head_bytes)
        async with server:
            if ready is not None:
                ready()
            await server.serve_forever()

    def _admit(self, conn: _Connection) -> bool:
        """Make room for a new connection: past the cap the one waiting longest without a request in
        progress is closed; False when every one is busy (the new one is refused)."""
        if len(self._open) < self.limits.max_connections:
            self._open[conn] = None
            return True
        oldest = next((c for c in self._open if not c.busy), None)
        if oldest is None:
            return False
        del self._open[oldest]
        oldest.writer.transport.abort()
        self._open[conn] = None
        return True

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(writer)
        if not self._admit(conn):
            writer.transport.abort()
            return
        try:
            while await self._one_request(conn, reader):
                # Waiting for the next request again: to the back of the eviction order.
                self._open.pop(conn, None)
                self._open[conn] = None
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a client gone, too slow or sending too much: its connection only
        finally:
            self._open.pop(conn, None)
            writer.transport.abort()

    async def _one_request(self, conn: _Connection, reader: asyncio.StreamReader) -> bool:
        """Read one request and answer it; whether the connection stays open for another."""
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.limits.read_timeout)
        conn.busy = True
        try:
            request, keep = parse_head(head)
        except BadRequest:
            request, keep = None, False
        if request is None:
            response = Response(400, [("Content-Type", "text/plain")], b"bad request\n")
        else:
            try:
                response = await self.handler(request)
            except Exception:  # a bug answers 500 to one request; the server goes on
                log.exception("answering %s %s failed", request.method, request.path)
                response, keep = Response(500, [("Content-Type", "text/plain")], b"internal error\n"), False
        head_only = request is not None and request.method == "HEAD"
        conn.writer.write(encode(response, keep, head_only))
        await asyncio.wait_for(conn.writer.drain(), self.limits.write_timeout)
        conn.busy = False
        return keep
