"""A total deadline for one HTTP request, status line and headers included.

httpx's timeouts bound each socket read, so a server that trickles one header byte at a time never trips
them; the client's own deadline check runs only once the body streams. This transport's sockets cut every
read and write at the deadline of the request running in the calling thread (httpx's sync client does a
request's I/O in the thread that sent it), so no answer outlives `--timeout`. Header size is bounded by
httpcore: h11 refuses status lines and headers past 100 KiB.
"""

from __future__ import annotations

import contextlib
import threading
import time
import typing
from collections.abc import Iterator

import httpcore
import httpx

_CURRENT = threading.local()


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Every socket read and write of this thread ends `seconds` from now at the latest."""
    previous = getattr(_CURRENT, "at", None)
    _CURRENT.at = time.monotonic() + seconds
    try:
        yield
    finally:
        _CURRENT.at = previous


def _left(timeout: float | None, expired: type[httpcore.TimeoutException]) -> float | None:
    """`timeout` cut to what is left of this thread's deadline; `expired` once it has passed."""
    at = getattr(_CURRENT, "at", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise expired("the total deadline (--timeout) passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: typing.Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: typing.Iterable[typing.Any] | None = None) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_tcp(host, port, left, local_address, socket_options))

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: typing.Iterable[typing.Any] | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.connect_unix_socket(path, _left(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def transport(limits: httpx.Limits) -> httpx.HTTPTransport:
    """httpx's own transport (TLS, pool limits, error mapping) on sockets that keep the thread's deadline."""
    made = httpx.HTTPTransport(limits=limits)
    made._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(), max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
        network_backend=_Backend())
    return made
