"""The streaming client against scripted servers: token timing, usage, and garbage answers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from ornith_stack.bench.client import EngineClient, ServerInfo
from ornith_stack.errors import UserError

GAP = 0.05  # seconds between scripted chunks


class FakeClock:
    """Time that moves only when the scripted engine says so: exact timings, no sleeping."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


CLOCK = FakeClock()


class Paced(httpx.AsyncByteStream):
    """A response body that arrives line by line, GAP seconds apart, like a decoding engine."""

    def __init__(self, lines: list[str], gap: float = GAP) -> None:
        self.lines, self.gap = lines, gap

    async def __aiter__(self) -> AsyncIterator[bytes]:
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
        _event({"role": "assistant", "content": ""}),  # sent with the first token; its text comes next
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
    # TTFT ends at the role chunk (1st line), as `vllm bench serve` measures it; decode runs from the
    # first text (2nd line) to the last (5th line): 3 gaps; ITL counts every gap between chunks.
    assert sample.ttft_s == pytest.approx(GAP)
    assert sample.decode_s == pytest.approx(3 * GAP)
    assert sample.itl_s == pytest.approx([GAP] * 4)
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


def test_through_a_gateway_that_lists_no_model_name_the_named_model_is_taken_and_none_is_refused() -> None:
    """SGLang's Model Gateway (sglang-router 0.3.2) in front of vLLM workers lists one model, "unknown"
    (tests/integration/test_gateway.py runs the real one)."""
    cards = {"object": "list", "data": [{"id": "unknown"}]}
    client = _client(lambda r: httpx.Response(200, json=cards))
    assert client.server_info("ornith") == ServerInfo(model="ornith", max_model_len=None)
    with pytest.raises(UserError, match="pass --model with the workers' served name"):
        client.server_info()
    with pytest.raises(UserError, match="does not serve model 'ornith'; it serves: other"):
        _client(lambda r: httpx.Response(200, json={"data": [{"id": "other"}]})).server_info("ornith")


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


@pytest.mark.parametrize("length", ["abc", [4096], 3.7, float("nan"), 0, True])
def test_a_max_model_len_that_is_not_a_token_count_is_refused(length: object) -> None:
    cards = json.dumps({"data": [{"id": "ornith", "max_model_len": length}]})  # NaN as JSON's NaN
    with pytest.raises(UserError, match="max_model_len .*expected a positive whole number"):
        _client(lambda r: httpx.Response(200, text=cards)).server_info()


def test_a_models_answer_past_its_size_cap_is_refused() -> None:
    huge = json.dumps({"data": [{"id": "ornith", "pad": "x" * (5 << 20)}]})
    with pytest.raises(UserError, match="more than 4 MiB"):
        _client(lambda r: httpx.Response(200, text=huge)).server_info()


def test_a_trickling_models_answer_ends_at_the_total_deadline() -> None:
    """A real loopback server sends /v1/models one byte every 0.2 s: per-read timeouts never fire, the
    total deadline (--timeout 1) does."""
    import threading
    import time

    from hostile import RawTarget, head, trickle

    body = json.dumps({"data": [{"id": "ornith", "max_model_len": 4096}]}).encode()
    server = RawTarget(lambda conn, stop: (conn.sendall(head(len(body))), trickle(body, stop, conn)))
    client = EngineClient(server.url, timeout_s=1.0, stop=threading.Event())
    started = time.monotonic()
    try:
        with pytest.raises(UserError, match="deadline"):
            client.server_info()
    finally:
        server.close()
        client.close()
    assert time.monotonic() - started < 3.0


def test_an_engine_that_is_down_is_one_clear_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused")
    with pytest.raises(UserError, match="cannot reach .* is the engine up"):
        _client(refuse).server_info()


# -- against a real loopback HTTP server ------------------------------------------------------------

import threading  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402


def sse_ok(tokens: int = 8, chunks: int = 4, usage_tokens: int | None = None, prompt_tokens: int = 5) -> list[str]:
    """A good stream with the `event:` and `id:` lines some servers add, and a keep-alive comment."""
    lines = [": keep-alive\n\n", "event: message\nid: 0\n" + _event({"role": "assistant", "content": ""})]
    lines += [f"id: {i + 1}\n" + _event({"content": f"w{i} "}) for i in range(chunks)]
    lines += [_event(usage={"prompt_tokens": prompt_tokens, "completion_tokens": tokens if usage_tokens is None else usage_tokens}),
              "data: [DONE]\n\n"]
    return lines


class LoopbackEngine(ThreadingHTTPServer):
    """An OpenAI-shaped server on 127.0.0.1 whose chat requests behave as `script` says, in turn:
    ok, 429, 500, garbage (a chunk that is not JSON), endless (keep-alive pings forever), trickle
    (bytes without a line end), lies (usage fewer tokens than chunks), cut (connection closed mid-stream)."""

    daemon_threads = True

    def __init__(self, script: list[str]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script, self.calls, self.headers_seen = script, 0, []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def next(self) -> str:
        with self.lock:
            self.calls += 1
            return self.script[(self.calls - 1) % len(self.script)]

    def close(self) -> None:
        self.closing.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackEngine

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": "loop", "max_model_len": 4096}]}), "application/json")
        else:
            self._send(404, "not found", "text/plain")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if self.path != "/v1/chat/completions":  # no cache to flush here
            return self._send(404, "not found", "text/plain")
        self.server.headers_seen.append(dict(self.headers))
        # Usage as a real engine counts it: the tokens asked for, a prompt that grows with its words.
        tokens = min(int(body.get("max_tokens") or 8), 8)
        words = sum(len(str(m.get("content", "")).split()) for m in body.get("messages") or [])
        self.good = sse_ok(tokens, min(tokens, 4), prompt_tokens=10 + words)
        kind = self.server.next()
        if kind in ("429", "500"):
            return self._send(int(kind), "slow down" if kind == "429" else "Internal Server Error", "text/plain")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        try:
            self._stream(kind)
        except OSError:  # the client gave up (deadline, Ctrl-C): expected
            pass

    def _stream(self, kind: str) -> None:
        write = self.wfile.write
        if kind == "ok":
            for line in self.good:
                write(line.encode())
        elif kind == "garbage":
            write(sse_ok()[2].encode() + b"data: {\"choices\": [{\"delta\": \n\n")
        elif kind == "lies":
            for line in sse_ok(usage_tokens=2):
                write(line.encode())
        elif kind == "cut":
            write(sse_ok()[2].encode())
        elif kind in ("endless", "trickle"):
            write(sse_ok()[2].encode())
            while not self.server.closing.wait(0.05):
                write(b": ping\n\n" if kind == "endless" else b"x")
                self.wfile.flush()
        self.wfile.flush()

    def _send(self, status: int, body: str, kind: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def loopback(request: pytest.FixtureRequest) -> Iterator[LoopbackEngine]:
    server = LoopbackEngine(request.param if hasattr(request, "param") else ["ok"])
    yield server
    server.close()


def test_a_real_stream_with_event_and_id_lines_and_an_api_key(loopback: LoopbackEngine) -> None:
    client = EngineClient(loopback.url, timeout_s=5, api_key="sk-test")
    sample = client.stream_chat({"model": "loop", "messages": [], "max_tokens": 8})
    assert sample.error is None and sample.text == "w0 w1 w2 w3 " and sample.completion_tokens == 8
    # 4 token chunks after the role chunk: 4 gaps, the first one from the role chunk.
    assert sample.chunks == 4 and len(sample.itl_s) == 4
    assert loopback.headers_seen[0]["Authorization"] == "Bearer sk-test"


@pytest.mark.parametrize(
    ("loopback", "message"),
    [
        (["429"], "HTTP 429: slow down"),
        (["500"], "HTTP 500: Internal Server Error"),
        (["garbage"], "a chunk that is not JSON"),
        (["endless"], "deadline"),
        (["trickle"], "deadline"),
        (["lies"], "usage says 2 completion tokens but the stream carried 4 token chunks"),
        (["cut"], "the stream carried no usage"),
    ],
    indirect=["loopback"],
)
def test_each_bad_answer_is_a_clear_error_of_that_request(loopback: LoopbackEngine, message: str) -> None:
    client = EngineClient(loopback.url, timeout_s=1.0)
    sample = client.stream_chat({"model": "loop", "messages": [], "max_tokens": 8})
    assert sample.error and message in sample.error
    # The client is still usable: the next request on the same client gets its own verdict.
    assert client.stream_chat({"model": "loop", "messages": [], "max_tokens": 8}).error


def test_an_endpoint_that_goes_down_is_an_error_sample() -> None:
    from ports import free_port

    sample = EngineClient(f"http://127.0.0.1:{free_port()}", timeout_s=2).stream_chat({"messages": []})
    assert sample.error and sample.error.startswith("ClientConnectorError")


def test_usage_more_than_asked_for_is_a_lie() -> None:
    lines = [_event({"content": "hi"}), _event(usage={"prompt_tokens": 3, "completion_tokens": 900}), "data: [DONE]\n\n"]
    sample = _client(_stream(lines)).stream_chat({"max_tokens": 16})
    assert sample.error == "usage says 900 completion tokens, more than the 16 asked for"


def test_stop_ends_a_stream_that_never_ends() -> None:
    server = LoopbackEngine(["endless"])
    try:
        stop = threading.Event()
        client = EngineClient(server.url, timeout_s=600, stop=stop)
        threading.Timer(0.3, stop.set).start()
        assert client.stream_chat({"messages": []}).error == "interrupted"
    finally:
        server.close()


# -- response headers: bounded in size and in time ----------------------------------------------------


def _endless_headers(sent: list[int]):
    """A server whose header block never ends, sent as fast as the client reads; `sent` counts the bytes."""
    def behaviour(conn, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        line = b"X-Pad: " + b"a" * 1000 + b"\r\n"
        while not stop.is_set():
            conn.sendall(line)
            sent[0] += len(line)
    return behaviour


def _trickled_headers(sent: list[int]):
    """A server that sends its headers one byte every 0.2 s: no per-read timeout ever fires."""
    from hostile import trickle

    def behaviour(conn, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        trickle(b"y" * 100_000, stop, conn)
    return behaviour


@pytest.mark.parametrize(("behaviour", "message"), [
    (_endless_headers, "/v1/models: ClientResponseError: 400, message='Too many headers received'"),
    (_trickled_headers, "/v1/models: no whole answer within the 2 s deadline (--timeout)"),
])
def test_endless_or_trickling_response_headers_are_one_error_line(tmp_path, capsys, behaviour, message: str) -> None:
    import time

    from hostile import RawTarget

    from ornith_stack.cli import main

    sent = [0]
    server = RawTarget(behaviour(sent))
    started = time.monotonic()
    try:
        rc = main(["bench", "--url", server.url, "--timeout", "2", "--out", str(tmp_path / "out")])
    finally:
        server.close()
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err
    assert time.monotonic() - started < 6
    # The client stops reading at aiohttp's cap on header lines: what the server got out is that plus socket buffers.
    assert sent[0] < 32 << 20
    assert not (tmp_path / "out").exists()


def test_trickling_headers_of_a_chat_answer_end_that_request_at_the_deadline() -> None:
    import time

    from hostile import RawTarget

    server = RawTarget(_trickled_headers([0]))
    client = EngineClient(server.url, timeout_s=1.0)
    started = time.monotonic()
    try:
        sample = client.stream_chat({"model": "m", "messages": [], "max_tokens": 8})
        chat = client.complete_chat({"model": "m", "messages": [], "max_tokens": 8})
    finally:
        server.close()
        client.close()
    assert sample.error == chat.error == "no whole answer within the 1 s deadline (--timeout)"
    assert time.monotonic() - started < 4
