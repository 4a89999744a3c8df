"""The one reader of OpenAI chat completion streams (server-sent events), and when their chunks came.

The bench and the exporter's canary feed it the raw pieces of an answer as they arrive and read the same
figures from it, timed on the same chunks, as `vllm bench serve` times them:
- TTFT ends at the first chunk with a choice: vLLM and SGLang send the role chunk when the first token
  exists, while a reasoning parser may hold the first tokens' text back;
- ITL is one gap per later chunk with a choice (a speculative step delivers several tokens in one chunk; the
  closing chunk with a finish reason and no text is a gap too);
- E2E ends at the last chunk with a choice (not at the usage chunk or [DONE]);
- the decode interval (seed 003's decode tok/s) runs from the first to the last chunk that carries generated
  tokens: content or reasoning text, or an engine step whose tokens decode to no text yet.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_SSE_FIELDS = {"event", "id", "retry"}
# One SSE line of this size is not a chunk of generated text: refused, so a server cannot grow the buffer.
MAX_LINE = 1 << 22


class BadStream(ValueError):
    """The answer is not a stream of OpenAI chat completion chunks."""


DONE: dict[str, Any] = {}  # what sse_event gives at `data: [DONE]`


def sse_event(raw: str) -> dict[str, Any] | None:
    """One line of a server-sent-events stream: its JSON `data:` event, `DONE` at `[DONE]`, None for
    blank lines, comments (keep-alive pings) and the other fields."""
    line = raw.strip()
    if not line or line.startswith(":") or line.split(":", 1)[0] in _SSE_FIELDS:
        return None
    if not line.startswith("data:"):
        raise BadStream(f"unexpected line {short(line)!r}")
    payload = line[5:].strip()
    if payload == "[DONE]":
        return DONE
    try:
        event = json.loads(payload)
    except (ValueError, RecursionError) as exc:
        raise BadStream(f"a chunk that is not JSON ({type(exc).__name__}): {short(payload)!r}") from None
    if not isinstance(event, dict):
        raise BadStream(f"unexpected event {short(payload)!r}")
    if "error" in event and "choices" not in event:
        raise BadStream(f"server error {short(json.dumps(event['error']))}")
    return event


class Events:
    """Decoded JSON `data:` events of a server-sent-events stream fed in raw pieces, up to `[DONE]`."""

    def __init__(self) -> None:
        self.buffer = b""
        self.done = False

    def feed(self, piece: bytes) -> list[dict[str, Any]]:
        self.buffer += piece
        *complete, self.buffer = self.buffer.split(b"\n")
        if len(self.buffer) > MAX_LINE:
            raise BadStream(f"a line longer than {MAX_LINE} bytes")
        return self._decode(complete)

    def close(self) -> list[dict[str, Any]]:
        """The events of a last line without a line end."""
        rest, self.buffer = self.buffer, b""
        return self._decode([rest]) if rest.strip() and not self.done else []

    def _decode(self, lines: list[bytes]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for raw in lines:
            if self.done:
                break
            event = sse_event(raw.decode("utf-8", errors="replace"))
            if event is DONE:
                self.done = True
            elif event is not None:
                events.append(event)
        return events


def delta(chunk: dict[str, Any]) -> tuple[str, str, str | None, bool]:
    """Answer text, reasoning text, finish reason, and whether the chunk carries generated tokens.

    Engines stream one chunk per engine step even when its tokens decode to no text yet (a partial
    UTF-8 sequence, a skipped special token): such a chunk has `content: ""` and still marks token
    arrival. The opening chunk that announces the role carries no token unless it has text."""
    choices = chunk.get("choices") or []
    if not isinstance(choices, list):
        raise BadStream(f"choices that are not a list: {short(json.dumps(choices))!r}")
    if not choices:
        return "", "", None, False
    choice = choices[0]
    step = choice.get("delta") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or not isinstance(step, dict | None):
        raise BadStream(f"a choice without a delta object: {short(json.dumps(choice))!r}")
    step = step or {}
    keys = ("content", "reasoning_content", "reasoning")
    reasoning = "".join(str(step.get(k) or "") for k in keys[1:])
    content = str(step.get("content") or "")
    tokens = bool(content or reasoning) or ("role" not in step and any(step.get(k) is not None for k in keys))
    return content, reasoning, choice.get("finish_reason"), tokens


class ChatStream:
    """One streamed chat completion read as it arrives: its text, reasoning, finish reason, usage (as the
    server sent it: the caller checks it is a count) and when each chunk came on `clock`."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.events = Events()
        self.choices: list[float] = []  # when each chunk with a choice came
        self.arrivals: list[float] = []  # when each chunk with generated tokens came
        self.parts: list[str] = []
        self.thoughts: list[str] = []
        self.finish_reason: str | None = None
        self.prompt_tokens: Any = None
        self.completion_tokens: Any = None

    @property
    def done(self) -> bool:
        """[DONE] came: nothing after it is read."""
        return self.events.done

    def feed(self, piece: bytes) -> None:
        for chunk in self.events.feed(piece):
            now = self.clock()
            self._usage(chunk)
            if chunk.get("choices"):
                self.choices.append(now)
            text, reasoning, finish, tokens = delta(chunk)
            if finish:
                self.finish_reason = finish
            # Reasoning tokens are generated tokens too: they count for timing, not as the answer.
            if tokens:
                self.parts.append(text)
                self.thoughts.append(reasoning)
                self.arrivals.append(now)

    def close(self) -> None:
        """The answer ended: a last line without a line end still gives its usage."""
        for chunk in self.events.close():
            self._usage(chunk)

    def _usage(self, chunk: dict[str, Any]) -> None:
        self.prompt_tokens, self.completion_tokens = usage(chunk, self.prompt_tokens, self.completion_tokens)

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def reasoning(self) -> str:
        return "".join(self.thoughts)

    def ttft(self, sent_at: float) -> float | None:
        return self.choices[0] - sent_at if self.choices else None

    def decode_s(self) -> float | None:
        """From the first to the last chunk with generated tokens."""
        return self.arrivals[-1] - self.arrivals[0] if self.arrivals else None

    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.choices, self.choices[1:], strict=False)]

    def ended_at(self) -> float | None:
        """When the last chunk with a choice came (where E2E ends)."""
        return self.choices[-1] if self.choices else None


def usage(chunk: dict[str, Any], prompt: Any, completion: Any) -> tuple[Any, Any]:
    """(prompt_tokens, completion_tokens) from a chunk's or a completion's `usage`, else those given."""
    found = chunk.get("usage")
    if not isinstance(found, dict):
        return prompt, completion
    return found.get("prompt_tokens", prompt), found.get("completion_tokens", completion)


def decode_rate(completion_tokens: int | None, decode_s: float | None) -> float | None:
    """(completion_tokens - 1) / decode interval: the first token belongs to prefill (TTFT)."""
    if not completion_tokens or completion_tokens < 2 or not decode_s or decode_s <= 0:
        return None
    return (completion_tokens - 1) / decode_s


def short(text: str, limit: int = 160) -> str:
    """`text` on one line, cut to `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
