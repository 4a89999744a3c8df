"""The streaming client against scripted servers: token timing, usage, and garbage answers."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from ornith_stack.bench.client import EngineClient
from ornith_stack.errors import UserError

GAP = 0.05  # seconds between scripted chunks


class FakeClock:
    """Time that moves only when the scripted engine says so: exact timings, no sleeping."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


CLOCK = FakeClock()


class Paced(httpx.SyncByteStream):
    """A response body that arrives line by line, GAP seconds apart, like a decoding engine."""

    def __init__(self, lines: list[str], gap: float = GAP) -> None:
        self.lines, self.gap = lines, gap

    def __iter__(self) -> Iterator[bytes]:
        for line in self.lines:
            CLOCK.now += self.gap
            yield line.encode()


def _event(delta: dict | None = None, usage: dict | None = None, finish: str | None = None) -> str:
    event: dict = {"object": "chat.completion.chunk", "choices": []}
    if delta is not None:
        event["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    if usage is not None:
        event["usage"] = usage
    return f"data: {json.dumps(event)}\n\n"


def _client(handler) -> EngineClient:
    return EngineClient("http://engine.test", transport=httpx.MockTransport(handler), clock=CLOCK)


def _stream(lines: list[str]):
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        return httpx.Response(200, stream=Paced(lines), headers={"content-type": "text/event-stream"})
    return handler


def test_tokens_are_counted_from_usage_not_from_chunks() -> None:
    # A speculative engine sends several tokens per chunk: 4 token chunks carry 13 tokens.
    lines = [
        _event({"role": "assistant", "content": ""}),  # role announcement: no token yet
        _event({"content": "Hello"}),
        _event({"content": ""}),  # a step whose tokens decode to no text still marks arrival
        _event({"content": " big"}),
        _event({"content": " world"}, finish="length"),
        _event(usage={"prompt_tokens": 7, "completion_tokens": 13}),
        "data: [DONE]\n\n",
    ]
    sample = _client(_stream(lines)).stream_chat({"model": "m", "messages": []})
    assert sample.error is None
    assert (sample.prompt_tokens, sample.completion_tokens, sample.chunks) == (7, 13, 4)
    assert sample.text == "Hello big world" and sample.finish_reason == "length"
    # First token arrives with the 2nd line, the last with the 5th: 3 gaps of decode.
    assert sample.ttft_s == pytest.approx(2 * GAP)
    assert sample.decode_s == pytest.approx(3 * GAP)
    assert sample.decode_tok_s == pytest.approx(12 / sample.decode_s)


def test_reasoning_tokens_count_for_timing_but_not_as_the_answer() -> None:
    lines = [_event({"reasoning_content": "hmm"}), _event({"content": "#### 4"}),
             _event(usage={"prompt_tokens": 3, "completion_tokens": 5}), "data: [DONE]\n\n"]
    sample = _client(_stream(lines)).stream_chat({})
    assert sample.text == "#### 4" and sample.reasoning == "hmm" and sample.chunks == 2


def test_a_stream_without_usage_is_an_error_sample() -> None:
    lines = [_event({"content": "hi"}), "data: [DONE]\n\n"]
    sample = _client(_stream(lines)).stream_chat({})
    assert sample.error and "usage" in sample.error


def test_a_stream_of_garbage_is_an_error_sample_not_a_crash() -> None:
    sample = _client(_stream(["<html>oops</html>\n"])).stream_chat({})
    assert sample.error and "not an OpenAI chat completion stream" in sample.error


def test_an_http_error_is_kept_in_the_sample() -> None:
    sample = _client(lambda r: httpx.Response(400, text="ignore_eos is not supported")).stream_chat({})
    assert sample.error == "HTTP 400: ignore_eos is not supported"


def test_models_endpoint_gives_name_and_max_model_len() -> None:
    cards = {"object": "list", "data": [{"id": "ornith", "max_model_len": 262144}]}
    info = _client(lambda r: httpx.Response(200, json=cards)).server_info()
    assert (info.model, info.max_model_len) == ("ornith", 262144)


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (httpx.Response(200, text="<html>hello</html>"), "did not answer JSON"),
        (httpx.Response(200, json={"data": []}), "did not list a model"),
        (httpx.Response(404, text="Not Found"), "answered HTTP 404"),
    ],
)
def test_a_server_that_is_not_an_openai_engine_is_one_clear_error(response: httpx.Response, message: str) -> None:
    with pytest.raises(UserError, match=message):
        _client(lambda r: response).server_info()


def test_an_engine_that_is_down_is_one_clear_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused")
    with pytest.raises(UserError, match="cannot reach .* is the engine up"):
        _client(refuse).server_info()
