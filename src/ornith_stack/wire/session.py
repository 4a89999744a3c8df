"""The bench's HTTP layer on an asyncio loop, under wire/http.py's policy: each request within a total
deadline (asyncio.timeout around headers and body: the libraries bound only each read), its body within a
byte limit, every failure a WireError with the synchronous call's reasons.

aiohttp carries the requests, as it carries `vllm bench serve`'s and SGLang's `bench_serving`'s: against a
loopback engine with known timing (tests/synthetic_engine.py: 384 streams of 128 tokens at concurrency 64, one
token every 10 ms) on a loaded 2-core machine, httpx's AsyncClient (httpcore 1.0.9) spent 6 CPU seconds and
36 s of wall time reading what aiohttp read in 1.2 CPU seconds and 9 s (truth: 7.9 s); the client, not the
engine, set the figures. An httpx transport can be given instead (the unit tests' httpx.MockTransport): the
only use of httpx in the package, so the bench's parsing and timing run unchanged on canned answers. Header
size is bounded by the parsers (aiohttp: 8190 bytes a line; h11: 100 KiB).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import httpx

from ornith_stack.wire.http import USER_AGENT, WireError, bearer, too_large

Transport = httpx.AsyncBaseTransport  # a canned engine for tests (httpx.MockTransport)


# -- asynchronous: the bench's layer --------------------------------------------------------------------
@dataclass
class Streamed:
    """An answer on the loop whose headers are in; its body as raw pieces as they arrive."""

    status: int
    pieces: AsyncIterator[bytes]

    async def read(self, limit: int, cut: bool = False, check: Callable[[], None] | None = None) -> bytes:
        """The body; past `limit` bytes it is cut there (`cut`: an error page) or refused (too_large).
        `check` runs before each piece (the bench's stop)."""
        body = bytearray()
        async for piece in self.pieces:
            if check is not None:
                check()
            body += piece
            if len(body) > limit and cut:
                break
            if len(body) > limit:
                raise too_large("", limit)
        return bytes(body[:limit])


class _Layer(Protocol):
    def open(self, method: str, url: str, json: Any) -> contextlib.AbstractAsyncContextManager[Streamed]: ...
    async def close(self) -> None: ...


class _Aiohttp:
    """One aiohttp session with a pool of `connections` (None: unbounded), made on the loop that first uses it."""

    def __init__(self, connections: int | None, headers: dict[str, str], read_s: float) -> None:
        self.connections, self.headers, self.read_s = connections, headers, read_s
        self.session: aiohttp.ClientSession | None = None

    @contextlib.asynccontextmanager
    async def open(self, method: str, url: str, json: Any) -> AsyncIterator[Streamed]:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.connections or 0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=self.read_s),
                headers=self.headers,
                auto_decompress=True,
            )
        async with self.session.request(method, url, json=json) as response:
            yield Streamed(response.status, response.content.iter_any())

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


class _Httpx:
    """httpx's AsyncClient on a given transport (tests)."""

    def __init__(self, transport: Transport, headers: dict[str, str], read_s: float) -> None:
        self.client = httpx.AsyncClient(
            transport=transport, headers=headers, timeout=httpx.Timeout(read_s, connect=10.0)
        )

    @contextlib.asynccontextmanager
    async def open(self, method: str, url: str, json: Any) -> AsyncIterator[Streamed]:
        async with self.client.stream(method, url, json=json) as response:
            yield Streamed(response.status_code, response.aiter_bytes())

    async def close(self) -> None:
        await self.client.aclose()


class Session:
    """Requests on an asyncio loop, each within `deadline_s` seconds in all (asyncio.timeout around headers
    and body: the libraries bound only each read), failures as WireError. `connections`: the pool's size
    (None: unbounded); `transport`: an httpx transport instead of the network (tests)."""

    def __init__(
        self,
        deadline_s: float,
        connections: int | None = None,
        api_key: str | None = None,
        transport: Transport | None = None,
    ) -> None:
        self.deadline_s = deadline_s
        headers = {"User-Agent": USER_AGENT, **bearer(api_key)}
        self._layer: _Layer = (
            _Httpx(transport, headers, deadline_s)
            if transport is not None
            else _Aiohttp(connections, headers, deadline_s)
        )

    @contextlib.asynccontextmanager
    async def open(self, method: str, url: str, json: Any = None) -> AsyncIterator[Streamed]:
        """The answer once its headers are in; the deadline runs on while the caller reads the body."""
        try:
            async with asyncio.timeout(self.deadline_s), self._layer.open(method, url, json) as answer:
                yield answer
        except TimeoutError:
            raise WireError("timeout", f"not complete within the {self.deadline_s:g} s deadline") from None
        except (httpx.HTTPError, aiohttp.ClientError) as exc:
            raise WireError(_reason(exc), f"{type(exc).__name__}: {str(exc) or 'no detail'}") from None

    async def fetch(
        self,
        method: str,
        url: str,
        limit: int,
        cut: bool = False,
        json: Any = None,
        check: Callable[[], None] | None = None,
    ) -> tuple[int, bytes]:
        """(status, body) of one request; the body as Streamed.read gives it."""
        async with self.open(method, url, json) as answer:
            return answer.status, await answer.read(limit, cut, check)

    async def close(self) -> None:
        await self._layer.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, httpx.ConnectError | aiohttp.ClientConnectorError):
        return "connect"  # nothing answered at the address
    if isinstance(exc, httpx.TimeoutException | aiohttp.ServerTimeoutError):
        return "timeout"  # a read or write the layer's own per-read timeout cut
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "truncated"  # the body ended short of its Content-Length or its last chunk
    return "broken"
