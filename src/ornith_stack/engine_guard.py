"""vLLM's missing guard: an ASGI middleware that asks for the API key on every route but health and metrics.

vLLM 0.24.0 checks its key ($VLLM_API_KEY or --api-key) only on paths under /v1, /v2 and /inference
(GUARDED_PREFIX, vllm/entrypoints/serve/utils/server_utils.py): `POST /invocations` (SageMaker's chat),
`/tokenize`, `/detokenize`, `/pooling`, `/classify`, `/score`, `/rerank`, `/server_info`, `/load` and, in dev
mode, `/pause`, `/sleep`, `/collective_rpc`... answer without it. vLLM's own `--middleware CLASS` option
(api_server.py: `app.add_middleware(imported)` for a class) adds this one, which the entrypoint passes with
the key: a request without `Authorization: Bearer <the key>` gets vLLM's own 401 answer, except on
/health, /metrics and /ping, which probes and the exporter read without a key, as vLLM's own guard leaves them.

It reads the key from $VLLM_API_KEY, as vLLM does, when the app is built; without one it guards nothing.
Standalone (the standard library only), so that an image without ornith-stack can carry this one file.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

KEY_VARIABLE = "VLLM_API_KEY"
# Paths served without the key (and everything under them): the health probes and the metrics scrape.
OPEN_PATHS = ("/health", "/metrics", "/ping")
UNAUTHORIZED = b'{"error":"Unauthorized"}'

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def is_open(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in OPEN_PATHS)


def bearer_matches(headers: list[tuple[bytes, bytes]], digest: bytes) -> bool:
    """Whether the Authorization header is `Bearer <the key whose SHA-256 is digest>` (compared in constant
    time, as vLLM compares)."""
    value = next((v for k, v in headers if k.lower() == b"authorization"), b"")
    scheme, _, token = value.decode("latin-1").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(hashlib.sha256(token.encode()).digest(), digest)


class RequireKey:
    """The middleware vLLM's `--middleware ornith_stack.engine_guard.RequireKey` adds."""

    def __init__(self, app: App) -> None:
        self.app = app
        key = os.environ.get(KEY_VARIABLE, "")
        self.digest = hashlib.sha256(key.encode()).digest() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            self.digest is None
            or scope["type"] not in ("http", "websocket")
            or scope.get("method") == "OPTIONS"
            or is_open(scope["path"].removeprefix(scope.get("root_path", "")))
            or bearer_matches(scope.get("headers", []), self.digest)
        ):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(UNAUTHORIZED)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": UNAUTHORIZED})
