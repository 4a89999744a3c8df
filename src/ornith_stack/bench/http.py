"""The bench's HTTP layer: one request opened, its status and its body as raw pieces, on an asyncio loop.

aiohttp carries the bench's requests, as it carries `vllm bench serve`'s and SGLang's `bench_serving`'s: against a
loopback engine with known timing (tests/synthetic_engine.py: 384 streams of 128 tokens at concurrency 64, one
token every 10 ms) on a loaded 2-core machine, httpx's AsyncClient (httpcore 1.0.9) spent 6 CPU seconds and 36 s
of wall time reading what aiohttp read in 1.2 CPU seconds and 9 s (truth: 7.9 s); the client, not the engine, set
the figures. An httpx transport can be given instead (the unit tests' httpx.MockTransport): the same parsing and
timing run on either.

Neither layer bounds a request's total time: the client wraps each request in asyncio.timeout (headers included,
however slowly their bytes come). Header size is bounded by the parsers (aiohttp: 8190 bytes a line; h11: 100 KiB).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import httpx

# What a failed request raises in either layer.
HTTP_ERRORS: tuple[type[Exception], ...] = (httpx.HTTPError, aiohttp.ClientError)
# The engine could not be reached at all (nothing answered at the address).
UNREACHABLE: tuple[type[Exception], ...] = (httpx.ConnectError, aiohttp.ClientConnectorError)


@dataclass
class Answer:
    status: int
    pieces: AsyncIterator[bytes]  # the body as it arrives


class Layer(Protocol):
    def open(self, method: str, url: str, json: Any = None) -> contextlib.AbstractAsyncContextManager[Answer]: ...
    async def close(self) -> None: ...


class AiohttpLayer:
    """One aiohttp session with a pool of `connections` (None: unbounded), made on the loop that first uses it."""

    def __init__(self, connections: int | None, headers: dict[str, str] | None, read_s: float) -> None:
        self.connections, self.headers, self.read_s = connections, headers, read_s
        self.session: aiohttp.ClientSession | None = None

    @contextlib.asynccontextmanager
    async def open(self, method: str, url: str, json: Any = None) -> AsyncIterator[Answer]:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.connections or 0),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=self.read_s),
                headers=self.headers, auto_decompress=True)
        async with self.session.request(method, url, json=json) as response:
            yield Answer(response.status, response.content.iter_any())

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


class HttpxLayer:
    """httpx's AsyncClient on a given transport."""

    def __init__(self, transport: httpx.AsyncBaseTransport, headers: dict[str, str] | None, read_s: float) -> None:
        self.client = httpx.AsyncClient(transport=transport, headers=headers, timeout=httpx.Timeout(read_s, connect=10.0))

    @contextlib.asynccontextmanager
    async def open(self, method: str, url: str, json: Any = None) -> AsyncIterator[Answer]:
        async with self.client.stream(method, url, json=json) as response:
            yield Answer(response.status_code, response.aiter_bytes())

    async def close(self) -> None:
        await self.client.aclose()


def layer(transport: httpx.AsyncBaseTransport | None, connections: int | None, api_key: str | None,
          read_s: float) -> Layer:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    if transport is not None:
        return HttpxLayer(transport, headers, read_s)
    return AiohttpLayer(connections, headers, read_s)


def describe(exc: BaseException) -> str:
    """A failed request in one line."""
    return f"{type(exc).__name__}: {str(exc) or 'no detail'}"


def timed_out(exc: BaseException) -> bool:
    """A read or write that the layer's own per-read timeout cut."""
    return isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout | aiohttp.ServerTimeoutError)
