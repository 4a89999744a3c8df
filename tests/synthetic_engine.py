"""A loopback OpenAI-compatible engine with known timing that records what it actually did, run in its own process
so the bench under test cannot slow it down: each chat request's first token is due FIRST_S after its body was
read, then one token every STEP_S, `max_tokens` in all, on an absolute schedule (a late wake-up does not push the
later tokens back). With N requests of T tokens at concurrency C (N a multiple of C) the nominal output rate is
N x T / ((N / C) x (FIRST_S + (T - 1) x STEP_S)) (`nominal()`).

On a busy machine the engine itself can write late, so the truth the clients are checked against is what it did:
it records, per request, the monotonic time it read the body and the time it wrote each token chunk; GET /trace
returns the requests finished since the last GET /trace and forgets them, and `truth()` turns them into the
figures a client should have measured (`Truth`).

`python tests/synthetic_engine.py` prints `port N` once it listens on 127.0.0.1, then serves until killed.
HTTP/1.1 with keep-alive, the stream sent chunked, as vLLM's server does; the usage chunk and [DONE] follow the
last token at once. The write path is a timer callback per token on a plain asyncio.Protocol (no coroutine, no
stream buffer), so the engine's own CPU per token stays one write."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from dataclasses import dataclass, field

FIRST_S = 0.040
STEP_S = 0.010
MODEL = "synthetic"


def nominal(requests: int, tokens: int, concurrency: int) -> float:
    """Output tok/s of `requests` requests of `tokens` tokens each at `concurrency`, had the engine kept its
    schedule and the client sent each request the moment a slot freed."""
    rounds = -(-requests // concurrency)
    return requests * tokens / (rounds * (FIRST_S + (tokens - 1) * STEP_S))


@dataclass(frozen=True)
class Truth:
    """What the engine did for one run's requests, as a client would report it: output tok/s over the span from
    the first body read to the last token written, the median TTFT (body read to first token written: a
    client's figure adds its connect and send) and TPOT; and how late it wrote its tokens against its schedule."""

    output_tok_s: float
    ttft_ms: float
    tpot_ms: float
    late_over_2ms: int
    tokens: int
    max_late_ms: float


def truth(trace: dict, requests: int) -> Truth:
    """The figures of the last `requests` requests of a GET /trace answer (the run's; the client's warm-up
    requests were all answered before the run's first was sent)."""
    run = sorted(trace["requests"], key=lambda r: r[0])[-requests:]
    assert len(run) == requests, f"the engine served {len(run)} requests, not {requests}"
    span = max(sent[-1] for _, sent in run) - min(start for start, _ in run)
    late = [sent[i] - (start + FIRST_S + i * STEP_S) for start, sent in run for i in range(len(sent))]
    return Truth(
        output_tok_s=sum(len(sent) for _, sent in run) / span,
        ttft_ms=1000 * statistics.median(sent[0] - start for start, sent in run),
        tpot_ms=1000 * statistics.median((sent[-1] - sent[0]) / (len(sent) - 1) for _, sent in run),
        late_over_2ms=sum(x > 0.002 for x in late),
        tokens=len(late),
        max_late_ms=1000 * max(late),
    )


def _chunk(payload: dict) -> bytes:
    data = f"data: {json.dumps(payload)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _token(first: bool, last: bool) -> bytes:
    delta = {"role": "assistant", "content": "w "} if first else {"content": "w "}
    return _chunk(
        {
            "id": "s",
            "object": "chat.completion.chunk",
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": "length" if last else None}],
        }
    )


# The three token chunks, made once: the engine's own CPU per token stays a write.
_FIRST, _NEXT, _LAST = _token(True, False), _token(False, False), _token(False, True)
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_DONE = b"data: [DONE]\n\n"
# Finished requests since the last GET /trace: [body read, [each token written]], monotonic seconds.
TRACE: list[tuple[float, list[float]]] = []


@dataclass
class _Stream:
    start: float
    tokens: int
    usage: dict
    sent: list[float] = field(default_factory=list)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: requests are read from the buffer one at a time; a chat request's tokens are
    written by timer callbacks at their due times, and the next request is read once the stream is done."""

    def __init__(self) -> None:
        self.buffer = b""
        self.stream: _Stream | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._next_request()

    def _next_request(self) -> None:
        while self.stream is None and (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            lines = self.buffer[:end].decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = next(
                (
                    int(v)
                    for k, _, v in (ln.partition(":") for ln in lines[1:])
                    if k.strip().lower() == "content-length"
                ),
                0,
            )
            if len(self.buffer) < end + 4 + length:
                return  # the body is still on its way
            raw, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
            start = time.monotonic()
            if method == "POST" and path.endswith("/chat/completions"):
                self._start(json.loads(raw), start)
            elif path == "/trace":
                self._json("200 OK", {"requests": TRACE[:]})
                TRACE.clear()
            elif path == "/v1/models":
                self._json(
                    "200 OK", {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 1 << 20}]}
                )
            else:
                self._json("404 Not Found", {"error": "not found"})

    def _start(self, body: dict, start: float) -> None:
        tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        usage = {
            "prompt_tokens": len(json.dumps(body.get("messages", ""))) // 4,
            "completion_tokens": tokens,
            "total_tokens": tokens,
        }
        self.stream = _Stream(start, tokens, usage)
        self.transport.write(_HEAD)
        self.loop.call_at(start + FIRST_S, self._tick)  # asyncio's loop.time() is time.monotonic()

    def _tick(self) -> None:
        s = self.stream
        if s is None or self.transport.is_closing():
            return  # the client went away mid-stream: nothing more to write or record
        i = len(s.sent)
        self.transport.write(_FIRST if i == 0 else _LAST if i == s.tokens - 1 else _NEXT)
        s.sent.append(time.monotonic())
        if len(s.sent) < s.tokens:
            self.loop.call_at(s.start + FIRST_S + len(s.sent) * STEP_S, self._tick)
            return
        usage = _chunk({"id": "s", "object": "chat.completion.chunk", "model": MODEL, "choices": [], "usage": s.usage})
        self.transport.write(usage + f"{len(_DONE):x}\r\n".encode() + _DONE + b"\r\n0\r\n\r\n")
        TRACE.append((s.start, s.sent))
        self.stream = None
        self._next_request()

    def _json(self, status: str, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.transport.write(
            f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n".encode()
            + data
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.stream = None


def _punctual() -> None:
    """Ahead of every other process where the system allows it: real-time FIFO (root or CAP_SYS_NICE; the
    engine sleeps between writes, and the kernel keeps 5% of each core for others anyway), else the highest
    nice priority, else as it is. It stands for a GPU engine, whose timing the client's CPU does not touch."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (OSError, AttributeError):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, -20)


async def _main() -> None:
    _punctual()
    server = await asyncio.get_running_loop().create_server(_Connection, "127.0.0.1", 0, backlog=1024)
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_main())
