"""A loopback OpenAI-compatible engine with exactly known timing, run in its own process so the bench under test
cannot slow it down: each chat request's first token comes FIRST_S after its body was read, then one token every
STEP_S, `max_tokens` in all, on an absolute schedule (a late wake-up does not push the later tokens back). With N
requests of T tokens at concurrency C (N a multiple of C) the true output rate is
N x T / ((N / C) x (FIRST_S + (T - 1) x STEP_S)).

`python tests/synthetic_engine.py` prints `port N` once it listens on 127.0.0.1, then serves until killed.
HTTP/1.1 with keep-alive, the stream sent chunked, as vLLM's server does; the usage chunk and [DONE] follow the
last token at once. GET /stats says how late it wrote its tokens against that schedule (on a machine too busy to
run it on time the truth does not hold, whatever the clients measure)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time

FIRST_S = 0.040
STEP_S = 0.010
MODEL = "synthetic"


def truth(requests: int, tokens: int, concurrency: int) -> float:
    """Output tok/s of `requests` requests of `tokens` tokens each at `concurrency`, on this engine."""
    rounds = -(-requests // concurrency)
    return requests * tokens / (rounds * (FIRST_S + (tokens - 1) * STEP_S))


def _chunk(payload: dict) -> bytes:
    data = f"data: {json.dumps(payload)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _token(first: bool, last: bool) -> bytes:
    delta = {"role": "assistant", "content": "w "} if first else {"content": "w "}
    return _chunk({"id": "s", "object": "chat.completion.chunk", "model": MODEL,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": "length" if last else None}]})


# The three token chunks, made once: the engine's own CPU per token stays a write.
_FIRST, _NEXT, _LAST = _token(True, False), _token(False, False), _token(False, True)
# How late the engine wrote its tokens against the schedule: if it was late, the truth did not hold (GET /stats).
LATE = {"tokens": 0, "late_over_2ms": 0, "max_late_ms": 0.0}


async def _stream(writer: asyncio.StreamWriter, body: dict, start: float) -> None:
    tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for i in range(tokens):
        due = start + FIRST_S + i * STEP_S
        if (wait := due - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        writer.write(_FIRST if i == 0 else _LAST if i == tokens - 1 else _NEXT)
        late = 1000 * (time.monotonic() - due)
        LATE["tokens"] += 1
        LATE["late_over_2ms"] += late > 2
        LATE["max_late_ms"] = max(LATE["max_late_ms"], round(late, 1))
    usage = {"prompt_tokens": len(json.dumps(body.get("messages", ""))) // 4, "completion_tokens": tokens,
             "total_tokens": tokens}
    writer.write(_chunk({"id": "s", "object": "chat.completion.chunk", "model": MODEL, "choices": [],
                         "usage": usage}) + _chunk_done())
    await writer.drain()


def _chunk_done() -> bytes:
    data = b"data: [DONE]\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n"


def _json(writer: asyncio.StreamWriter, status: str, payload: dict) -> None:
    data = json.dumps(payload).encode()
    writer.write(f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n".encode()
                 + data)


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            length = next((int(v) for k, _, v in (ln.partition(":") for ln in lines[1:])
                           if k.strip().lower() == "content-length"), 0)
            raw = await reader.readexactly(length) if length else b""
            start = time.monotonic()
            if method == "POST" and path.endswith("/chat/completions"):
                await _stream(writer, json.loads(raw), start)
            elif path == "/stats":
                _json(writer, "200 OK", LATE)
            elif path == "/v1/models":
                _json(writer, "200 OK", {"object": "list", "data": [{"id": MODEL, "object": "model",
                                                                     "max_model_len": 1 << 20}]})
            else:
                _json(writer, "404 Not Found", {"error": "not found"})
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _main() -> None:
    # Its timing is the truth the clients are checked against: ahead of other work on a busy machine where the
    # system allows it (root, or CAP_SYS_NICE), else at normal priority.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    server = await asyncio.start_server(_serve, "127.0.0.1", 0, backlog=1024)
    print(f"port {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_main())
