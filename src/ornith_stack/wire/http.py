"""HTTP to engines and the stack's services under one policy, and its synchronous call.

The policy, once for this call and the bench's asynchronous one (wire/session.py): a request has a total
deadline (connect, headers and body, however slowly their bytes come), its body a byte limit (after
gunzipping), and every failure is one `WireError` whose `reason` says what went wrong (REASONS), so callers
count and word failures without knowing the library.

`fetch` (and `request`, to read a body as it arrives: the canary's stream) is the synchronous call, on raw
sockets: a watchdog thread shuts each socket at its deadline and every read waits at most until then, so a
server that trickles its headers or its body (slowloris) cannot hold the caller past it, whatever the framing
(Connection: close, HTTP/1.0, chunked). The exporter, the canary, `status`, `up` and the tuner use it; it
needs only the standard library, so none of them loads aiohttp or httpx (the exporter starts in half the time).
Header size is bounded by http.client (64 KiB a line, 100 lines).
"""

from __future__ import annotations

import base64
import contextlib
import heapq
import http.client
import ipaddress
import json as jsonlib
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ornith_stack.urls import redact

# Why a request failed: nothing answered at the address (connect); the deadline passed (timeout); the
# exchange broke after connecting, or what answered is not HTTP (broken); the body ended short of its
# length (truncated), was larger than the limit (too_large), or could not be gunzipped (bad_encoding).
REASONS = ("connect", "timeout", "broken", "truncated", "too_large", "bad_encoding")
# Body limits every caller shares: an engine's /metrics is about 100 KiB (vLLM; SGLang with every histogram
# about 60 KiB), a JSON answer (/v1/models, /version, /server_info, a chat completion) a few KiB; past these
# it is not such an answer. Of an error page only the start is shown.
METRICS_BYTES = 8 << 20
JSON_BYTES = 4 << 20
ERROR_BYTES = 4 << 10
USER_AGENT = "ornith-stack"


class WireError(Exception):
    """A request that failed; `reason` is one of REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def bearer(api_key: str | None) -> dict[str, str]:
    """The request headers that carry an engine's API key (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def basic_auth(user: str, password: str) -> dict[str, str]:
    """The request header of HTTP basic authentication (RFC 7617: user:password, UTF-8, base64)."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")}


def size(limit: int) -> str:
    """A byte limit as a person reads it: 4 MiB, 4 KiB, 100 bytes."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if limit >= 1 << shift and limit % (1 << shift) == 0:
            return f"{limit >> shift} {unit}"
    return f"{limit} bytes"


def too_large(where: str, limit: int) -> WireError:
    return WireError("too_large", f"{where}an answer of more than {size(limit)}")


# -- synchronous: one watchdog thread, raw sockets ------------------------------------------------------
class _Guard:
    """One socket under the watchdog: `fired` once the watchdog shut it at its deadline."""

    __slots__ = ("deadline", "sock", "fired")

    def __init__(self, deadline: float, sock: socket.socket) -> None:
        self.deadline, self.fired = deadline, False
        self.sock: socket.socket | None = sock  # None once released: nothing to shut

    def __lt__(self, other: _Guard) -> bool:
        return self.deadline < other.deadline


class Watchdog:
    """One thread for the whole process that shuts every watched socket at its deadline.

    It holds its own reference to the socket, so it can stop a read however http.client frames the
    answer (with `Connection: close` or HTTP/1.0 the connection object lets go of its socket), and
    one thread serves every request, so watching costs no thread per request."""

    def __init__(self) -> None:
        self._heap: list[_Guard] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, sock: socket.socket, deadline: float) -> _Guard:
        guard = _Guard(deadline, sock)
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="http-watchdog", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, guard)
            self._cond.notify()
        return guard

    def release(self, guard: _Guard) -> None:
        with self._cond:
            guard.sock = None  # popped from the heap when its deadline comes

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._heap and (self._heap[0].sock is None or self._heap[0].deadline <= time.monotonic()):
                    guard = heapq.heappop(self._heap)
                    if guard.sock is not None:
                        guard.fired = True
                        _shut(guard.sock)
                        guard.sock = None
                self._cond.wait(self._heap[0].deadline - time.monotonic() if self._heap else None)


WATCHDOG = Watchdog()


@dataclass
class Reply:
    """An HTTP answer whose headers are in; its body comes in chunks, each read by the deadline."""

    status: int
    response: http.client.HTTPResponse
    sock: socket.socket
    guard: _Guard
    deadline: float
    where: str

    def header(self, name: str) -> str:
        return (self.response.getheader(name) or "").strip().lower()

    @property
    def peer(self) -> str:
        """The address and port that answered, every loopback address as one (a server listening on
        all of them is one server however it is named: localhost, 127.0.0.1, ::1)."""
        try:
            host, port = self.sock.getpeername()[:2]
            address = ipaddress.ip_address(host.partition("%")[0])
        except (OSError, ValueError):
            return self.where
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return f"{'loopback' if address.is_loopback else address}:{port}"

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives (still gzipped if sent so); WireError timeout past the deadline,
        truncated when the answer ends short of its Content-Length (or of its last chunk)."""
        while True:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0 or self.guard.fired:
                raise WireError("timeout", f"{self.where}: body not complete within the deadline")
            self.sock.settimeout(remaining)  # every recv waits at most until the deadline
            try:
                chunk = self.response.read1(64 * 1024)
            except (OSError, http.client.HTTPException) as exc:
                raise _failure(exc, self.where, self.guard, self.deadline) from None
            if not chunk:
                break
            yield chunk
        if self.guard.fired:  # the watchdog's shutdown reads as the end of the body
            raise WireError("timeout", f"{self.where}: body not complete within the deadline")
        if self.response.length:  # bytes still owed by Content-Length
            raise WireError(
                "truncated", f"{self.where}: body closed {self.response.length} bytes short of its Content-Length"
            )

    def read(self, limit: int, cut: bool = False) -> bytes:
        """The whole body, gunzipped when sent so; past `limit` bytes (after gunzipping) it is cut there
        (`cut`: an error page, an answer whose status alone matters) or refused (too_large). A gzip stream
        that stops before its end is truncated."""
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if self.header("Content-Encoding") == "gzip" else None
        chunks: list[bytes] = []
        got = 0
        for chunk in self.chunks():
            if inflate is not None:
                try:
                    chunk = inflate.decompress(chunk, limit + 1 - got)  # a gzip bomb inflates no further
                except zlib.error as exc:
                    raise WireError("bad_encoding", f"{self.where}: bad gzip body: {exc}") from None
            got += len(chunk)
            chunks.append(chunk)
            if got > limit and cut:
                return b"".join(chunks)[:limit]
            if got > limit:
                raise too_large(f"{self.where}: ", limit)
        if inflate is not None and not inflate.eof:
            raise WireError("truncated", f"{self.where}: gzip body ends before its end")
        return b"".join(chunks)


@contextlib.contextmanager
def request(
    url: str, deadline: float, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None
) -> Iterator[Reply]:
    """Send one request and give its answer once the headers are in; connect, headers and body all done
    by `deadline` (time.monotonic()). A user:password@ in the URL is sent as Basic authentication.
    Failures are WireError."""
    parts = urlsplit(url)
    where = redact(url)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise WireError("timeout", f"{where}: no time left before the deadline")
    try:
        address = (parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80))
    except ValueError as exc:
        raise WireError("connect", f"{where}: {exc}") from None
    sent = {"Accept-Encoding": "gzip", "User-Agent": USER_AGENT, **(headers or {})}
    if parts.username is not None:
        token = f"{parts.username}:{parts.password or ''}".encode()
        sent["Authorization"] = "Basic " + base64.b64encode(token).decode()
    guard: _Guard | None = None
    sock: socket.socket | None = None
    response: http.client.HTTPResponse | None = None
    try:
        try:
            sock = socket.create_connection(address, timeout=remaining)
        except OSError as exc:
            if time.monotonic() >= deadline or isinstance(exc, TimeoutError):
                raise WireError("timeout", f"{where}: not connected within the deadline") from None
            raise WireError("connect", f"{where}: {type(exc).__name__}: {exc}") from None
        guard = WATCHDOG.watch(sock, deadline)
        if parts.scheme == "https":
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=address[0])
            guard.sock = sock
        conn = http.client.HTTPConnection(*address, timeout=remaining)
        conn.sock = sock  # ours: the watchdog shuts it whatever http.client does with the connection
        conn.request(method, (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), body, sent)
        response = conn.getresponse()
        if guard.fired:  # headers cut at the deadline can look complete to http.client
            raise WireError("timeout", f"{where}: headers not complete within the deadline")
        yield Reply(response.status, response, sock, guard, deadline, where)
    except (OSError, http.client.HTTPException) as exc:
        raise _failure(exc, where, guard, deadline) from None
    finally:
        if guard is not None:
            WATCHDOG.release(guard)
        if response is not None:
            response.close()
        if sock is not None:
            sock.close()


@dataclass(frozen=True)
class Answer:
    """A whole answer: its status, its body (gunzipped) and the address that answered (Reply.peer)."""

    status: int
    body: bytes
    peer: str

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not (RecursionError too for JSON nested past Python's
        limit, which callers of hostile servers catch)."""
        return jsonlib.loads(self.body)


def fetch(
    url: str,
    deadline_s: float,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    limit: int = JSON_BYTES,
    *,
    json: Any = None,
    cut: bool = False,
) -> Answer:
    """One request and its whole answer within `deadline_s` seconds from now, headers and body included;
    the body cut or refused past `limit` bytes (Reply.read). `json` is sent as a JSON body. Failures are
    WireError."""
    if json is not None:
        body = jsonlib.dumps(json).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
    with request(url, time.monotonic() + deadline_s, method, body, headers) as reply:
        return Answer(reply.status, reply.read(limit, cut), reply.peer)


def _failure(exc: BaseException, where: str, guard: _Guard | None, deadline: float) -> WireError:
    if (guard is not None and guard.fired) or time.monotonic() >= deadline or isinstance(exc, TimeoutError):
        return WireError("timeout", f"{where}: not complete within the deadline")
    if isinstance(exc, http.client.IncompleteRead):
        return WireError("truncated", f"{where}: the answer ended early ({exc})")
    return WireError("broken", f"{where}: {type(exc).__name__}: {exc}")


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
