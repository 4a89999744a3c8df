"""A streaming OpenAI-compatible client that times every token, and the engine's /metrics reader.

Timing follows seed 003's streaming client: the request is streamed with `stream_options.include_usage`
so the server reports the true completion token count (speculative engines send several tokens in one
chunk, so counting chunks would undercount), TTFT is the time to the first chunk that carries text, and
decode tok/s = (completion_tokens - 1) / (time of last token - time of first token).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from ornith_stack.engines.exposition import Samples, parse
from ornith_stack.errors import UserError


@dataclass
class RequestSample:
    """One timed request: every field the report and the JSON need, nothing derived elsewhere."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    decode_s: float | None = None  # time of last token - time of first token
    e2e_s: float | None = None
    chunks: int = 0
    finish_reason: str | None = None
    text: str = ""
    reasoning: str = ""
    started_at: float = 0.0  # wall clock (epoch seconds) when the request was sent
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def decode_tok_s(self) -> float | None:
        return decode_rate(self.completion_tokens, self.decode_s)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "decode_tok_s": self.decode_tok_s}


def decode_rate(completion_tokens: int | None, decode_s: float | None) -> float | None:
    """(completion_tokens - 1) / decode interval: the first token belongs to prefill (TTFT)."""
    if not completion_tokens or completion_tokens < 2 or not decode_s or decode_s <= 0:
        return None
    return (completion_tokens - 1) / decode_s


@dataclass(frozen=True)
class ServerInfo:
    model: str
    max_model_len: int | None


class BadStream(ValueError):
    """The answer is not a stream of OpenAI chat completion chunks."""


class Stopped(Exception):
    """Raised inside a stream when the run was interrupted (Ctrl-C) from the main thread."""


class EngineClient:
    """Talks to one OpenAI-compatible endpoint; network failures become one-line UserErrors."""

    def __init__(self, url: str, timeout_s: float = 600.0, stop: threading.Event | None = None,
                 transport: httpx.BaseTransport | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.url = url.rstrip("/")
        # Injected so tests can drive token arrival times without sleeping.
        self.clock = clock
        if not self.url.startswith(("http://", "https://")):
            raise UserError(f"--url {url!r}: expected http://HOST:PORT (the engine's OpenAI-compatible address)")
        self.stop = stop or threading.Event()
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits, transport=transport)

    def close(self) -> None:
        self._http.close()

    def server_info(self, model: str | None = None) -> ServerInfo:
        """The served model name and its max model length from /v1/models."""
        data = self._get_json("/v1/models")
        cards = data.get("data") if isinstance(data, dict) else None
        if not isinstance(cards, list) or not cards or not isinstance(cards[0], dict) or "id" not in cards[0]:
            raise UserError(f"{self.url}/v1/models did not list a model: is this an OpenAI-compatible server?")
        card = next((c for c in cards if c.get("id") == model), None) if model else cards[0]
        if card is None:
            names = ", ".join(str(c.get("id")) for c in cards)
            raise UserError(f"{self.url} does not serve model {model!r}; it serves: {names}")
        length = card.get("max_model_len")
        return ServerInfo(model=str(card["id"]), max_model_len=int(length) if length else None)

    def metrics(self) -> Samples | None:
        """A parsed /metrics scrape, or None when the engine exports none (SGLang without the flag)."""
        try:
            response = self._http.get(self.url + "/metrics")
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        try:
            return parse(response.text)
        except UserError as exc:
            raise UserError(f"{self.url}/metrics: {exc}") from None

    def stream_chat(self, body: dict[str, Any]) -> RequestSample:
        """Send one streaming chat completion and time it; errors are kept in the sample, not raised."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        sample = RequestSample(started_at=time.time())
        t0 = self.clock()
        t_first = t_last = None
        parts: list[str] = []
        thoughts: list[str] = []
        try:
            with self._http.stream("POST", self.url + "/v1/chat/completions", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    sample.error = f"HTTP {response.status_code}: {_short(response.text)}"
                    return sample
                for chunk in _sse_events(response):
                    if self.stop.is_set():
                        raise Stopped
                    now = self.clock()
                    usage = chunk.get("usage")
                    if isinstance(usage, dict):
                        sample.prompt_tokens = usage.get("prompt_tokens", sample.prompt_tokens)
                        sample.completion_tokens = usage.get("completion_tokens", sample.completion_tokens)
                    text, reasoning, finish, tokens = _delta(chunk)
                    if finish:
                        sample.finish_reason = finish
                    # Reasoning tokens are generated tokens too: they count for timing, not as the answer.
                    if tokens:
                        sample.chunks += 1
                        parts.append(text)
                        thoughts.append(reasoning)
                        t_first = t_first if t_first is not None else now
                        t_last = now
        except Stopped:
            sample.error = "interrupted"
        except httpx.HTTPError as exc:
            sample.error = f"{type(exc).__name__}: {exc}"
        except ValueError as exc:  # a stream that is not JSON server-sent events
            sample.error = f"not an OpenAI chat completion stream: {exc}"
        sample.e2e_s = self.clock() - t0
        sample.text = "".join(parts)
        sample.reasoning = "".join(thoughts)
        if t_first is not None and t_last is not None:
            sample.ttft_s = t_first - t0
            sample.decode_s = t_last - t_first
        if sample.error is None and sample.completion_tokens is None:
            sample.error = "the stream carried no usage (does the server support stream_options.include_usage?)"
        return sample

    def _get_json(self, path: str) -> Any:
        try:
            response = self._http.get(self.url + path)
        except httpx.HTTPError as exc:
            raise UserError(f"cannot reach {self.url}{path}: {exc or type(exc).__name__}; is the engine up?") from None
        if response.status_code != 200:
            raise UserError(f"{self.url}{path} answered HTTP {response.status_code} ({_short(response.text, 60)}); "
                            "is this an OpenAI-compatible engine?")
        try:
            return response.json()
        except ValueError:
            raise UserError(f"{self.url}{path} did not answer JSON: {_short(response.text)}") from None


def _sse_events(response: httpx.Response):
    """Decoded JSON events of a server-sent-events stream, up to `[DONE]`."""
    for line in response.iter_lines():
        line = line.strip()
        if not line or line.startswith(":"):
            continue
        if not line.startswith("data:"):
            raise BadStream(f"unexpected line {_short(line)!r}")
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        event = json.loads(payload)
        if not isinstance(event, dict):
            raise BadStream(f"unexpected event {_short(payload)!r}")
        if "error" in event and "choices" not in event:
            raise BadStream(f"server error {_short(json.dumps(event['error']))}")
        yield event


def _delta(chunk: dict[str, Any]) -> tuple[str, str, str | None, bool]:
    """Answer text, reasoning text, finish reason, and whether the chunk carries generated tokens.

    Engines stream one chunk per engine step even when its tokens decode to no text yet (a partial
    UTF-8 sequence, a skipped special token): such a chunk has `content: ""` and still marks token
    arrival. The opening chunk that announces the role carries no token unless it has text."""
    choices = chunk.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return "", "", None, False
    delta = choices[0].get("delta") or {}
    keys = ("content", "reasoning_content", "reasoning")
    reasoning = "".join(str(delta.get(k) or "") for k in keys[1:])
    content = str(delta.get("content") or "")
    tokens = bool(content or reasoning) or (
        "role" not in delta and any(delta.get(k) is not None for k in keys)
    )
    return content, reasoning, choices[0].get("finish_reason"), tokens


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
