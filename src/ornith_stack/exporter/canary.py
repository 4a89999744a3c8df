"""The canary: a small fixed request with a known answer, sent to every target on an interval.

Greedy, thinking off, streamed: its time to first token, its decode speed and whether the answer was
right tell a broken deployment (zeroed draft rows, wrong chat template, a stuck engine) from a slow one.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field

import httpx

from ornith_stack.engines import EngineAdapter
from ornith_stack.exporter.scrape import Target

PROMPT = "What is 17 + 25? Reply with the number only."
ANSWER = re.compile(r"(?<!\d)42(?!\d)")
MAX_TOKENS = 16


@dataclass
class CanaryState:
    success: bool = False
    correct: bool = False
    ttft: float | None = None
    decode_rate: float | None = None
    finished_at: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    error: str | None = None


def request_body(model: str) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
        # Both engines pass this to the chat template; Ornith/Qwen3.5 would otherwise think first.
        "chat_template_kwargs": {"enable_thinking": False},
    }


def run_once(client: httpx.Client, base: str, timeout: float) -> CanaryState:
    """One canary request; any failure is a state with success False and the reason, never an exception."""
    state = CanaryState()
    try:
        models = client.get(base + "/v1/models", timeout=timeout).json()
        model = models["data"][0]["id"]
        chat_path = EngineAdapter.chat_path  # OpenAI-compatible on every engine
        start = time.monotonic()
        first = last = None
        text: list[str] = []
        tokens = 0
        with client.stream("POST", base + chat_path, json=request_body(model), timeout=timeout) as response:
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            for line in response.iter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("usage"):
                    tokens = int(chunk["usage"].get("completion_tokens") or 0)
                # Time every chunk that carries output: a token may decode to no text on its own
                # (a partial UTF-8 sequence), yet it was generated.
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    last = time.monotonic()
                    first = first or last
                    text.append((delta.get("content") or "") + (delta.get("reasoning_content") or ""))
                if time.monotonic() - start > timeout:
                    raise TimeoutError(f"no complete answer within {timeout:g}s")
        if first is None:
            raise ValueError("the answer was empty")
        state.success = True
        state.correct = bool(ANSWER.search("".join(text)))
        state.ttft = first - start
        if tokens > 1 and last is not None and last > first:
            state.decode_rate = (tokens - 1) / (last - first)
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError, TimeoutError) as exc:
        state.error = f"{type(exc).__name__}: {exc}"
    state.finished_at = time.time()
    return state


class Canary:
    """Background thread sending the canary to each target every `interval` seconds."""

    def __init__(self, targets: list[Target], interval: float = 30.0, timeout: float = 30.0) -> None:
        self.targets, self.interval, self.timeout = targets, interval, timeout
        self._states = {t.url: CanaryState() for t in targets}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="canary", daemon=True)
        self._client = httpx.Client()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def run_round(self) -> None:
        for target in self.targets:
            result = run_once(self._client, target.url, self.timeout)
            outcome = "failed" if not result.success else "correct" if result.correct else "wrong"
            with self._lock:
                previous = self._states[target.url]
                if result.success and result.decode_rate is None:
                    # An answer of one token has no decode phase: keep the last measured speed.
                    result.decode_rate = previous.decode_rate
                result.counts = dict(previous.counts)
                result.counts[outcome] = result.counts.get(outcome, 0) + 1
                self._states[target.url] = result

    def snapshot(self) -> list[tuple[Target, CanaryState]]:
        with self._lock:
            return [(t, self._states[t.url]) for t in self.targets]

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.run_round()
            self._stop.wait(self.interval)
