"""A streaming OpenAI-compatible client that times every token, and the engine's /metrics reader, on the
wire layer (wire/session.py's Session for the requests, wire/stream.py's reader for the chunks and their times).

Timing follows seed 003's streaming client: the request is streamed with `stream_options.include_usage`
so the server reports the true completion token count (speculative engines send several tokens in one
chunk, so counting chunks would undercount; a stream without usage is counted with the model's tokenizer
where one is given), and decode tok/s = (completion_tokens - 1) / (time of last token - time of first
token).

TTFT, ITL and E2E are `vllm bench serve`'s (wire/stream.py times them, for the exporter's canary too), and
TPOT = (E2E - TTFT) / (completion_tokens - 1).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ornith_stack.bench.result import Extra, Sample, TaskSample
from ornith_stack.deployment import METRICS_PATH
from ornith_stack.errors import UserError
from ornith_stack.wire.http import ERROR_BYTES, JSON_BYTES, METRICS_BYTES, WireError
from ornith_stack.wire.metrics import Samples, parse
from ornith_stack.wire.session import Session, Transport
from ornith_stack.wire.stream import BadStream, ChatStream, decode_rate, short, usage

FLUSH_PATHS = ("/flush_cache", "/reset_prefix_cache")


@dataclass
class RequestSample:
    """One timed request: every field the report and the JSON need, nothing derived elsewhere."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    decode_s: float | None = None  # time of last token - time of first token
    e2e_s: float | None = None
    chunks: int = 0  # chunks that carried generated tokens
    # The server answered 200 and the stream began: a gateway has committed the request to a replica and can no
    # longer retry it elsewhere, tokens or not.
    accepted: bool = False
    itl_s: list[float] = field(default_factory=list)  # gaps between token chunks
    finish_reason: str | None = None
    text: str = ""
    reasoning: str = ""
    started_at: float = 0.0  # wall clock (epoch seconds) when the request was sent
    error: str | None = None
    extra: Extra = field(default_factory=Extra)

    @property
    def decode_tok_s(self) -> float | None:
        return decode_rate(_count(self.completion_tokens), self.decode_s)

    @property
    def tpot_s(self) -> float | None:
        """(E2E - TTFT) / (completion_tokens - 1), the peers' time per output token."""
        n = self.completion_tokens
        if self.error or not n or n < 2 or self.ttft_s is None or self.e2e_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (n - 1)

    def record(self, repeat: int | None = None) -> Sample:
        """The sample as the result keeps it (`repeat`: which recorded run of a load level)."""
        return Sample(**self._kept(), repeat=repeat)

    def task_record(self, problem_id: str, passed: bool | None, extracted: str | None, check: str) -> TaskSample:
        """The sample of a task problem with the checker's verdict."""
        return TaskSample(**self._kept(), id=problem_id, passed=passed, extracted=extracted, check=check)

    def _kept(self) -> dict[str, Any]:
        """The fields both records keep; counts the server sent that are not whole numbers are None
        (usage_problem has made them the request's error)."""
        return {"prompt_tokens": _count(self.prompt_tokens), "completion_tokens": _count(self.completion_tokens),
                "ttft_s": self.ttft_s, "decode_s": self.decode_s, "e2e_s": self.e2e_s, "chunks": self.chunks,
                "itl_s": tuple(self.itl_s), "finish_reason": None if self.finish_reason is None else str(self.finish_reason),
                "text": self.text, "reasoning": self.reasoning, "started_at": self.started_at, "error": self.error,
                "extra": self.extra, "decode_tok_s": self.decode_tok_s, "tpot_s": self.tpot_s}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# What SGLang's Model Gateway lists at /v1/models when its workers did not tell it their model name: it asks
# SGLang's /server_info, which vLLM does not serve (sglang-router 0.3.2 in front of vLLM 0.32 on CPU, measured).
GATEWAY_UNKNOWN_MODEL = "unknown"


@dataclass(frozen=True)
class ServerInfo:
    model: str
    max_model_len: int | None
    max_total_tokens: int | None = None  # SGLang's KV pool: prompt + output of all running requests


class Stopped(Exception):
    """Raised inside a stream when the run was interrupted (Ctrl-C, or `stop` set from another thread)."""


T = TypeVar("T")
# A request that failed (the deadline included), or an answer that is not what was asked for.
_FAILED: tuple[type[Exception], ...] = (WireError, BadStream)


class EngineClient:
    """Talks to one OpenAI-compatible endpoint through one asynchronous HTTP client (aiohttp, as vLLM's and
    SGLang's bench clients, on an event loop this object owns; wire/session.py says why): every request of a
    load level is a task on that loop, so a thousand streams cost no thread each and start when their slot
    frees, not when a thread gets the GIL. Network failures become one-line UserErrors; the synchronous
    methods run one request on the loop, `run` runs a whole coroutine (serving.run_load)."""

    def __init__(self, url: str, timeout_s: float = 600.0, stop: threading.Event | None = None,
                 transport: Transport | None = None,
                 clock: Callable[[], float] = time.perf_counter, api_key: str | None = None,
                 connections: int | None = None, count_tokens: Callable[[str], int] | None = None) -> None:
        """`connections`: the HTTP pool's size, the run's largest concurrency (None: unbounded), so no
        request waits for a connection after its clock started. `count_tokens`: the model's tokenizer,
        for streams that carry no usage."""
        self.url = url.rstrip("/")
        # Injected so tests can drive token arrival times without sleeping.
        self.clock = clock
        if not self.url.startswith(("http://", "https://")):
            raise UserError(f"--url {url!r}: expected http://HOST:PORT (the engine's OpenAI-compatible address)")
        self.stop = stop or threading.Event()
        self.deadline_s = timeout_s  # total time one request may take, first byte to last
        self.count_tokens = count_tokens
        # One loop for the client's life: the connection pool belongs to the loop it first ran on. Its
        # SIGINT handling cancels the running coroutine, which keeps the samples gathered so far.
        self._loop = asyncio.Runner()
        # The total deadline holds for each request, headers included, however slowly the bytes come.
        self._http = Session(timeout_s, connections, api_key, transport)

    def close(self) -> None:
        # A KeyboardInterrupt raised inside a request leaves the tasks that waited on it pending; cancelled
        # first, they end while the pool closes instead of raising it again.
        for task in asyncio.all_tasks(self._loop.get_loop()):
            task.cancel()
        try:
            self._loop.run(self._http.close())
        finally:
            self._loop.close()

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the client's event loop and return its result. Ctrl-C cancels it: a coroutine
        that keeps its samples on cancellation returns them, any other ends in KeyboardInterrupt."""
        return self._loop.run(work)

    # -- one request from synchronous code ------------------------------------------------------------
    def server_info(self, model: str | None = None) -> ServerInfo:
        """The served model name and its max model length from /v1/models."""
        data = self.run(self._get_json("/v1/models"))
        cards = data.get("data") if isinstance(data, dict) else None
        if not isinstance(cards, list) or not cards or not isinstance(cards[0], dict) or "id" not in cards[0]:
            raise UserError(f"{self.url}/v1/models did not list a model: is this an OpenAI-compatible server?")
        names = [str(c.get("id")) for c in cards]
        if names == [GATEWAY_UNKNOWN_MODEL]:
            # The gateway forwards the request's own model name to the workers, which check it.
            if not model:
                raise UserError(f"{self.url}/v1/models lists only the model {GATEWAY_UNKNOWN_MODEL!r}: SGLang's Model "
                                "Gateway in front of workers it could not ask for their model name (vLLM's); pass "
                                "--model with the workers' served name")
            return ServerInfo(model=model, max_model_len=None)
        card = next((c for c in cards if c.get("id") == model), None) if model else cards[0]
        if card is None:
            raise UserError(f"{self.url} does not serve model {model!r}; it serves: {', '.join(names)}")
        length = card.get("max_model_len")
        if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length <= 0):
            raise UserError(f"{self.url}/v1/models gives max_model_len {short(repr(length), 40)}: expected a "
                            "positive whole number of tokens; is this an OpenAI-compatible engine?")
        return ServerInfo(model=str(card["id"]), max_model_len=length)

    def pool_tokens(self, info_paths: tuple[str, ...]) -> int | None:
        """SGLang's KV pool size (`max_total_num_tokens`, what --max-total-tokens caps) from the first
        info endpoint that answers; None where the engine has no such endpoint or field."""
        for path in info_paths:
            try:
                status, text = self.run(self._get(path, JSON_BYTES))
                payload = json.loads(text) if status == 200 else None
            except (WireError, ValueError, RecursionError):  # BadStream is a ValueError
                continue
            found = _find_key(payload, "max_total_num_tokens")
            if isinstance(found, int) and found > 0:
                return found
        return None

    def flush_cache(self) -> str | None:
        """Empty the engine's prefix cache, as z-lab/dflash does before each run: the first of SGLang's
        /flush_cache and vLLM's /reset_prefix_cache (served in its dev mode) that answers 200, or None."""
        for path in FLUSH_PATHS:
            try:
                if self.run(self._send("POST", path, ERROR_BYTES, cut=True))[0] == 200:
                    return path
            except _FAILED:
                continue
        return None

    def metrics(self) -> Samples | None:
        """A parsed /metrics scrape, or None when the engine exports none (SGLang without the flag)."""
        try:
            status, text = self.run(self._get(METRICS_PATH, METRICS_BYTES))
        except _FAILED:
            return None
        if status != 200:
            return None
        try:
            return parse(text)
        except UserError as exc:
            raise UserError(f"{self.url}{METRICS_PATH}: {exc}") from None

    def stream_chat(self, body: dict[str, Any]) -> RequestSample:
        """`astream_chat` from synchronous code; `stop` set from another thread ends it as interrupted."""
        return self.run(self._watched(self.astream_chat(body)))

    def complete_chat(self, body: dict[str, Any]) -> RequestSample:
        """`acomplete_chat` from synchronous code."""
        return self.run(self._watched(self.acomplete_chat(body)))

    async def _watched(self, request: Coroutine[Any, Any, RequestSample]) -> RequestSample:
        """One request, cancelled (an interrupted sample) when `stop` is set; Ctrl-C cancels it and goes on
        as KeyboardInterrupt."""
        task = asyncio.ensure_future(request)
        try:
            while not task.done():
                if self.stop.is_set():
                    task.cancel()
                    break
                await asyncio.wait({task}, timeout=0.2)
            return await task
        except asyncio.CancelledError:
            self.stop.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise

    # -- requests on the loop -------------------------------------------------------------------------
    async def astream_chat(self, body: dict[str, Any]) -> RequestSample:
        """Send one streaming chat completion and time it; errors are kept in the sample, not raised.

        A request ends with an error (the run goes on) when the server refuses it, the stream is not
        OpenAI chunks, the total deadline passes (an endless stream, keep-alive pings, trickled headers),
        the run is stopped (cancelled: "interrupted"), or `usage` contradicts the stream."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        sample = RequestSample(started_at=time.time())
        if self.stop.is_set():
            sample.error = "interrupted"
            return sample
        t0 = self.clock()
        stream = ChatStream(self.clock)
        try:
            async with self._http.open("POST", self.url + "/v1/chat/completions", json=body) as response:
                if response.status != 200:
                    text = await response.read(ERROR_BYTES, cut=True)
                    sample.error = f"HTTP {response.status}: {short(text.decode('utf-8', errors='replace'))}"
                    return sample
                sample.accepted = True
                async for piece in response.pieces:
                    if self.stop.is_set():
                        raise Stopped
                    stream.feed(piece)
                    if stream.done:
                        break
                stream.close()
        except (Stopped, asyncio.CancelledError):
            sample.error = "interrupted"
        except WireError as exc:
            sample.error = self._failure(exc)
        except BadStream as exc:
            sample.error = f"not an OpenAI chat completion stream: {exc}"
        except Exception as exc:  # any malformed chunk fails this request only
            sample.error = f"not an OpenAI chat completion stream: {type(exc).__name__}: {exc}"
        ended = self.clock()
        sample.text, sample.reasoning, sample.finish_reason = stream.text, stream.reasoning, stream.finish_reason
        sample.prompt_tokens, sample.completion_tokens = stream.prompt_tokens, stream.completion_tokens
        sample.chunks = len(stream.arrivals)
        sample.ttft_s, sample.decode_s, sample.itl_s = stream.ttft(t0), stream.decode_s(), stream.itl()
        # E2E ends at the last chunk with a choice, not after the usage chunk and [DONE].
        last = stream.ended_at()
        sample.e2e_s = (last if last is not None and sample.error is None else ended) - t0
        if sample.completion_tokens is None and sample.error is None and self.count_tokens is not None:
            # No usage in the stream: count the generated text with the model's tokenizer, as vLLM does.
            sample.completion_tokens = self.count_tokens(sample.reasoning + sample.text)
            sample.extra = replace(sample.extra, completion_tokens_from="tokenizer")
        if sample.error is None:
            sample.error = usage_problem(sample, body.get("max_tokens"))
        return sample

    async def acomplete_chat(self, body: dict[str, Any]) -> RequestSample:
        """Send one non-streaming chat completion: E2E time, usage, the answer, and the engine's own count
        of this request's verification steps where it reports one (SGLang's meta_info.spec_verify_ct).
        No TTFT or decode interval exists without a stream. Errors are kept in the sample, not raised."""
        body = {**body, "stream": False}
        sample = RequestSample(started_at=time.time())
        if self.stop.is_set():
            sample.error = "interrupted"
            return sample
        t0 = self.clock()
        try:
            status, text = await self._send("POST", "/v1/chat/completions", JSON_BYTES, json=body)
            sample.e2e_s = self.clock() - t0
            if status != 200:
                sample.error = f"HTTP {status}: {short(text)}"
                return sample
            _read_completion(json.loads(text), sample)
        except (Stopped, asyncio.CancelledError):
            sample.error = "interrupted"
        except WireError as exc:
            sample.error = self._failure(exc)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as exc:
            sample.error = f"not an OpenAI chat completion: {type(exc).__name__}: {exc}"
        if sample.error is None:
            sample.error = usage_problem(sample, body.get("max_tokens"))
        return sample

    def _expired_message(self) -> str:
        return f"no whole answer within the {self.deadline_s:g} s deadline (--timeout)"

    def _failure(self, exc: WireError) -> str:
        """A request's failure in one line; one cut by the deadline (or a read timeout) says so."""
        return self._expired_message() if exc.reason == "timeout" else str(exc)

    async def _get(self, path: str, limit: int) -> tuple[int, str]:
        """GET `path`: (status, body), within the total deadline (--timeout) however slowly the body comes,
        and refused past `limit` bytes. Raises WireError or Stopped."""
        return await self._send("GET", path, limit)

    async def _send(self, method: str, path: str, limit: int, cut: bool = False, json: Any = None) -> tuple[int, str]:
        """(status, body) of one request, within the total deadline however slowly the answer comes (its
        headers included), and refused past `limit` bytes (`cut`: cut there). Raises WireError or Stopped."""
        status, body = await self._http.fetch(method, self.url + path, limit, cut, json, check=self._check_stop)
        return status, body.decode("utf-8", errors="replace")

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise Stopped

    async def _get_json(self, path: str) -> Any:
        try:
            status, text = await self._get(path, JSON_BYTES)
        except WireError as exc:
            if exc.reason == "connect":
                raise UserError(f"cannot reach {self.url}{path}: {exc}; is the engine up?") from None
            # Past the deadline, too large, or not HTTP (the parsers refuse over-long status and header lines).
            raise UserError(f"{self.url}{path}: {self._failure(exc)}; is this an OpenAI-compatible engine?") from None
        if status != 200:
            raise UserError(f"{self.url}{path} answered HTTP {status} ({short(text, 60)}); "
                            "is this an OpenAI-compatible engine?")
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            raise UserError(f"{self.url}{path} did not answer JSON: {short(text)}") from None


def _read_completion(payload: Any, sample: RequestSample) -> None:
    """A non-streaming chat completion into `sample`: answer, reasoning, finish reason, usage, and the
    verification steps of SGLang's meta_info."""
    if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list) or not payload["choices"]:
        raise ValueError(f"no choices in {short(json.dumps(payload))!r}")
    choice = payload["choices"][0]
    message = choice.get("message") or {}
    sample.text = str(message.get("content") or "")
    sample.reasoning = str(message.get("reasoning_content") or message.get("reasoning") or "")
    sample.finish_reason = choice.get("finish_reason")
    meta = choice.get("meta_info")
    if isinstance(meta, dict) and _count(meta.get("spec_verify_ct")) is not None:
        sample.extra = replace(sample.extra, spec_verify_ct=_count(meta["spec_verify_ct"]))
    sample.prompt_tokens, sample.completion_tokens = usage(payload, sample.prompt_tokens, sample.completion_tokens)


def usage_problem(sample: RequestSample, max_tokens: Any) -> str | None:
    """Why the usage the server reported cannot be true of the stream it sent, or None."""
    completion, prompt = sample.completion_tokens, sample.prompt_tokens
    if completion is None:
        return ("the stream carried no usage (does the server support stream_options.include_usage?); "
                "--tokenizer counts its tokens instead")
    if not isinstance(completion, int) or isinstance(completion, bool) or completion < 0:
        return f"usage.completion_tokens is {completion!r}, not a token count"
    if prompt is not None and (not isinstance(prompt, int) or isinstance(prompt, bool) or prompt < 0):
        return f"usage.prompt_tokens is {prompt!r}, not a token count"
    if completion < sample.chunks:
        return f"usage says {completion} completion tokens but the stream carried {sample.chunks} token chunks"
    if isinstance(max_tokens, int) and completion > max_tokens:
        return f"usage says {completion} completion tokens, more than the {max_tokens} asked for"
    return None


def _find_key(payload: Any, key: str) -> Any:
    """`key` at the top of a JSON object or inside its nested objects and lists (SGLang moved the pool
    size into `internal_states` in later versions)."""
    if isinstance(payload, dict):
        if key in payload:
            return payload[key]
        children: Iterable[Any] = payload.values()
    elif isinstance(payload, list):
        children = payload
    else:
        return None
    for child in children:
        found = _find_key(child, key)
        if found is not None:
            return found
    return None
