"""The canary: a small fixed request with a known answer, sent to every target on an interval.

Greedy, thinking off, streamed: its time to first token, its decode speed and whether the answer was
right tell a broken deployment (zeroed draft rows, wrong chat template, a stuck engine) from a slow one.
A model that cannot know the answer (random weights: the CPU demo's tiny model) gets the same requests with
the answer left unchecked (`check_answer=False`): a liveness signal a hung engine cannot fake either, since
its /metrics answer says nothing about whether tokens stream.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ornith_stack.engines import EngineAdapter
from ornith_stack.exporter.scrape import Target
from ornith_stack.wire.http import bearer, fetch, request
from ornith_stack.wire.stream import ChatStream
from ornith_stack.wire.stream import decode_rate as wire_decode_rate

PROMPT = "What is 17 + 25? Reply with the number only."
ANSWER = re.compile(r"(?<!\d)42(?!\d)")
MAX_TOKENS = 16
# The decode-speed request: long enough that the time between its first and last token measures the
# engine's decode, not one step's jitter. Fewer tokens than MIN_DECODE_TOKENS give no rate.
# ignore_eos (vLLM and SGLang both take it) makes the length fixed whatever the model says.
DECODE_PROMPT = "Count from 1 to 60 in digits, separated by spaces, and nothing else."
DECODE_MAX_TOKENS = 64
MIN_DECODE_TOKENS = 32
log = logging.getLogger(__name__)


@dataclass
class CanaryState:
    success: bool = False
    correct: bool | None = False  # None: the answer was not checked (liveness only)
    ttft: float | None = None
    decode_rate: float | None = None
    finished_at: float | None = None
    counts: dict[str, int] = field(default_factory=dict)
    error: str | None = None


@dataclass
class Stream:
    """What one streamed chat answer gave: its text, tokens and when its first and last chunks came."""

    text: str
    tokens: int
    ttft: float
    span: float  # seconds between the first and the last chunk with generated tokens


def request_body(model: str, prompt: str = PROMPT, max_tokens: int = MAX_TOKENS) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        # Both engines pass this to the chat template; Ornith/Qwen3.5 would otherwise think first.
        "chat_template_kwargs": {"enable_thinking": False},
    }


def stream_chat(url: str, body: dict, timeout: float, headers: dict[str, str] | None = None) -> Stream:
    """POST a streamed chat request and read it with the bench's stream reader (the same chunks timed),
    all within `timeout` seconds; anything malformed is ValueError, a failed request WireError."""
    start = time.monotonic()
    stream = ChatStream(time.monotonic)
    with request(url, start + timeout, "POST", json.dumps(body).encode(),
                 {"Content-Type": "application/json", "Accept": "text/event-stream", **(headers or {})}) as reply:
        if reply.status != 200:
            raise ValueError(f"HTTP {reply.status}")
        for piece in reply.chunks():
            stream.feed(piece)
            if stream.done:
                break
        stream.close()
    ttft = stream.ttft(start)
    if ttft is None:
        raise ValueError("the answer was empty")
    tokens = stream.completion_tokens
    counted = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else None
    return Stream(stream.reasoning + stream.text, counted or len(stream.arrivals), ttft, stream.decode_s() or 0.0)


def decode_rate(stream: Stream) -> float | None:
    """Tokens after the first per second, only from enough tokens to mean something."""
    if stream.tokens - 1 < MIN_DECODE_TOKENS:
        return None
    return wire_decode_rate(stream.tokens, stream.span)


def run_once(base: str, timeout: float, adapter: EngineAdapter, api_key: str = "",
             check_answer: bool = True) -> CanaryState:
    """One canary run; any failure is a state with success False and the reason, never an exception.
    Without `check_answer` a streamed answer is a success whatever it says, and `correct` stays None."""
    state = CanaryState()
    try:
        listing = fetch(base + adapter.models_path, timeout, headers=bearer(api_key))
        if listing.status != 200:
            raise ValueError(f"{adapter.models_path}: HTTP {listing.status}")
        model = listing.json()["data"][0]["id"]
        if not isinstance(model, str):
            raise ValueError(f"{adapter.models_path}: model id is not a string")
        answer = stream_chat(base + adapter.chat_path, request_body(model), timeout, bearer(api_key))
        state.success = True
        state.correct = bool(ANSWER.search(answer.text)) if check_answer else None
        state.ttft = answer.ttft
        decode = stream_chat(base + adapter.chat_path,
                             {**request_body(model, DECODE_PROMPT, DECODE_MAX_TOKENS), "ignore_eos": True}, timeout,
                             bearer(api_key))
        state.decode_rate = decode_rate(decode)
    except Exception as exc:  # whatever a target answers, the canary reports it and runs again
        state.error = f"{type(exc).__name__}: {exc}"
    state.finished_at = time.time()
    return state


def outcome_of(state: CanaryState) -> str:
    """The run's `outcome` label (catalogue.CANARY_OUTCOMES)."""
    if not state.success:
        return "failed"
    return "unchecked" if state.correct is None else "correct" if state.correct else "wrong"


class Canary:
    """Background thread sending the canary to each target every `interval` seconds.

    `adapter_of` names a target's engine (its routes); a target whose engine is not known yet is
    counted as a failed run.
    """

    def __init__(self, targets: list[Target], interval: float = 30.0, timeout: float = 30.0,
                 adapter_of: Callable[[Target], EngineAdapter | None] | None = None, check_answer: bool = True) -> None:
        self.targets, self.interval, self.timeout, self.check_answer = targets, interval, timeout, check_answer
        self.adapter_of = adapter_of or (lambda target: None)
        self._states = {t.url: CanaryState() for t in targets}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="canary", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def run_round(self) -> None:
        for target in self.targets:
            result = self._run_target(target)
            outcome = outcome_of(result)
            with self._lock:
                result.counts = dict(self._states[target.url].counts)
                result.counts[outcome] = result.counts.get(outcome, 0) + 1
                self._states[target.url] = result

    def _run_target(self, target: Target) -> CanaryState:
        try:
            adapter = self.adapter_of(target)
            if adapter is None:
                raise ValueError("the engine has not been recognised from its /metrics yet")
            return run_once(target.url, self.timeout, adapter, target.api_key, self.check_answer)
        except Exception as exc:
            log.warning("canary for %s: %s: %s", target.public, type(exc).__name__, exc)
            return CanaryState(error=f"{type(exc).__name__}: {exc}", finished_at=time.time())

    def snapshot(self) -> list[tuple[Target, CanaryState]]:
        with self._lock:
            return [(t, self._states[t.url]) for t in self.targets]

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_round()
            except Exception:  # the loop must outlive any bug; the stale timestamp shows it
                log.exception("canary round failed")
            self._stop.wait(self.interval)
