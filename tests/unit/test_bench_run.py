"""A whole bench run against a scripted engine: the three outputs, the seed-shaped table, Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from test_bench_client import LoopbackEngine

from ornith_stack.bench import BenchConfig, run_bench
from ornith_stack.bench.report import write_outputs
from ornith_stack.bench.result import Suites, load_result
from ornith_stack.bench.sandbox import Limits
from ornith_stack.profiles import load_profile

DATA = Path(__file__).parents[2] / "src/ornith_stack/bench/data"
ANSWERS = {json.loads(line)["question"]: json.loads(line)["answer"]
           for name in ("gsm8k.jsonl", "file_order/gsm8k.jsonl") for line in (DATA / name).read_text().splitlines()}
TOKENS_PER_CHUNK = 4  # the fake drafts 3 tokens per step and all are accepted: 4 tokens a step


class FakeEngine:
    """vLLM-shaped: /v1/models, /metrics with generation and speculative counters, streaming chat.

    GSM8K questions get the right answer, code questions a wrong one; `interrupt_at` raises
    KeyboardInterrupt in the Nth chat request, as Ctrl-C would in the middle of a stream."""

    def __init__(self, interrupt_at: int | None = None, other_traffic: int = 0, max_model_len: int = 4096) -> None:
        self.lock = threading.Lock()
        self.max_model_len = max_model_len
        self.flush_path = "/reset_prefix_cache"  # vLLM's, in its dev mode
        self.flushes: list[tuple[str, int]] = []  # (path, chat requests before it)
        self.generated = self.steps = self.accepted = self.requests = 0
        self.interrupt_at = interrupt_at
        self.other_traffic = other_traffic  # tokens another client generates alongside each request

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "fake", "max_model_len": self.max_model_len}]})
        if request.url.path == "/metrics":
            return httpx.Response(200, text=self.exposition())
        if request.url.path in ("/flush_cache", "/reset_prefix_cache"):
            with self.lock:
                self.flushes.append((request.url.path, self.requests))
            return httpx.Response(200 if request.url.path == self.flush_path else 404)
        return self.chat(json.loads(request.content))

    def exposition(self) -> str:
        with self.lock:
            counters = {"vllm:generation_tokens": self.generated, "vllm:spec_decode_num_drafts": self.steps,
                        "vllm:spec_decode_num_accepted_tokens": self.accepted}
        return "".join(f"# TYPE {name} counter\n{name}_total{{model_name=\"fake\"}} {value}\n"
                       for name, value in counters.items())

    def chat(self, body: dict) -> httpx.Response:
        with self.lock:
            self.requests += 1
            if self.requests == self.interrupt_at:
                raise KeyboardInterrupt
        content = body["messages"][0]["content"]
        answer = next((f"Adding up.\n#### {a}" for q, a in ANSWERS.items() if q in content), None)
        answer = answer or "```python\ndef wrong():\n    return None\n```"
        tokens = body["max_tokens"] if body.get("ignore_eos") else min(body["max_tokens"], 40)
        words = answer.split(" ")
        chunks = [" ".join(words[i::max(tokens // TOKENS_PER_CHUNK, 1)]) for i in range(tokens // TOKENS_PER_CHUNK)]
        with self.lock:
            self.generated += tokens + self.other_traffic
            self.steps += tokens // TOKENS_PER_CHUNK
            self.accepted += tokens - tokens // TOKENS_PER_CHUNK
        prompt_tokens = int(len(content.split()) * 1.25) + 12
        lines = [f"data: {json.dumps({'choices': [{'delta': {'role': 'assistant', 'content': ''}}]})}\n\n"]
        text_chunks = [answer] + [""] * (len(chunks) - 1) if not body.get("ignore_eos") else chunks
        lines += [f"data: {json.dumps({'choices': [{'delta': {'content': c}, 'finish_reason': None}]})}\n\n"
                  for c in text_chunks]
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}
        lines += [f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n", "data: [DONE]\n\n"]
        return httpx.Response(200, stream=_Paced(lines))


class _Paced(httpx.AsyncByteStream):
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    async def __aiter__(self):
        for line in self.lines:
            await asyncio.sleep(0.002)
            yield line.encode()


def _config(**changes) -> BenchConfig:
    base = {"url": "http://fake.test", "max_tokens": 16, "samples": 3, "warmup": 1,
            "prompt_lengths": (256, 1024, 8192), "concurrency": (1, 3), "task_limit": 2, "task_max_tokens": 40,
            "sandbox": Limits(wall_s=5)}
    return BenchConfig(**(base | changes))


def test_all_suites_write_json_markdown_and_plots_shaped_like_the_seed(tmp_path: Path) -> None:
    engine = FakeEngine()
    result = run_bench(_config(), load_profile("a100x2"), transport=httpx.MockTransport(engine))
    paths = write_outputs(result, tmp_path)

    # bench.json holds the whole result: read back (as a --baseline is), it is the same result.
    assert load_result(paths["json"]) == result
    data = json.loads(paths["json"].read_text())
    suites = data["suites"]
    assert len(suites["decode"]["samples"]) == 3
    assert all(s["completion_tokens"] == 16 and s["extra"]["engine_generation_tokens"] == 16
               for s in suites["decode"]["samples"])
    assert [len(t["samples"]) for t in suites["tasks"]["tasks"].values()] == [2, 2]
    # Sustained concurrency: 4 x level requests per run, 3 recorded runs per level.
    assert [len(level["samples"]) for level in suites["concurrency"]["levels"]] == [12, 36]
    assert all(len(level["runs"]) == 3 for level in suites["concurrency"]["levels"])
    # 8192 does not fit a 4096-token window: it runs at the largest prompt that does.
    assert suites["ttft_sweep"]["dropped_lengths"] == [8192]
    assert [p["target_prompt_tokens"] for p in suites["ttft_sweep"]["points"]] == [256, 1024, 4096 - 16 - 40]

    table = paths["markdown"].read_text()
    assert "| configuration | decode tok/s | speedup | accepted tokens (GSM8K / HumanEval) | GSM8K | HumanEval |" in table
    # The seed's own rows (seed 000's table) ...
    assert "| seed 000: base model | 202.5 | 1.00x | — | 93.3% | 87.5% |" in table
    assert "| seed 000: a100x2 | 470.2 | 2.32x | 6.1 / 7.7 | 90.0% | 90.0% |" in table
    # ... and this run's: 4 tokens per verification step, the right GSM8K answers, wrong code.
    assert re.search(r"\| this run \| [\d,.]+ \| [\d.]+x \(vs seed base model\) \| 4\.0 / 4\.0 \| "
                     r"100\.0% \(2/2\) \| 0\.0% \(0/2\) \|", table), table
    assert "Roofline: 2.95B active parameters" in table

    for key in ("sweep_plot", "tasks_plot"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ctrl_c_keeps_the_samples_gathered_so_far(tmp_path: Path) -> None:
    # Request 1 is the warm-up, 2 and 3 are decode samples, Ctrl-C lands in the 4th.
    engine = FakeEngine(interrupt_at=4)
    result = run_bench(_config(samples=10), None, transport=httpx.MockTransport(engine))
    assert result.interrupted is True
    assert result.suites.decode is not None and len(result.suites.decode.samples) == 2
    assert result.suites.tasks is None
    paths = write_outputs(result, tmp_path)
    assert "**Interrupted**" in paths["markdown"].read_text()
    assert len(json.loads(paths["json"].read_text())["suites"]["decode"]["samples"]) == 2


def test_an_endpoint_that_only_fails_stops_after_the_warm_up_and_says_why(tmp_path: Path) -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "x"}]})
        if request.url.path == "/metrics":
            return httpx.Response(404)
        return httpx.Response(500, text="Internal Server Error")

    result = run_bench(_config(), None, transport=httpx.MockTransport(broken))
    assert result.aborted == "every warm-up request failed: HTTP 500: Internal Server Error"
    assert result.suites == Suites()
    assert "**Stopped before the suites**: every warm-up request failed" in write_outputs(result, tmp_path)["markdown"].read_text()


def test_failed_requests_are_kept_counted_and_make_the_command_fail(tmp_path: Path, capsys) -> None:
    """A real loopback server answering, in turn, well, 429, 500, garbage, never ending, lying in usage:
    every request gets its own verdict, the good ones are measured, the report lists what failed and
    the exit status is 1."""
    from ornith_stack.cli import main

    script = ["ok", "429", "ok", "500", "ok", "garbage", "ok", "endless", "ok", "lies"]
    server = LoopbackEngine(script)
    try:
        out = tmp_path / "out"
        rc = main(["bench", "--url", server.url, "--suite", "decode", "--samples", "9", "--warmup", "1",
                   "--max-tokens", "8", "--timeout", "1", "--out", str(out)])
    finally:
        server.close()
    assert rc == 1 and "5 request(s) failed" in capsys.readouterr().err
    result = json.loads((out / "bench.json").read_text())
    decode = result["suites"]["decode"]
    assert [s["error"] is None for s in decode["samples"]] == [False, True, False, True, False, True, False, True, False]
    assert decode["errors"] == 5 and decode["decode_tok_s"]["n"] == 4
    assert result["failures"]["count"] == 5
    report = (out / "bench.md").read_text()
    assert "**5 request(s) failed**" in report
    for reason in ("HTTP 429: slow down", "HTTP 500", "a chunk that is not JSON", "deadline", "usage says 2"):
        assert reason in report


def test_a_bad_out_directory_is_refused_before_the_run(tmp_path: Path, capsys) -> None:
    from ornith_stack.cli import main

    server = LoopbackEngine(["ok"])
    blocker = tmp_path / "file"
    blocker.write_text("x")
    try:
        rc = main(["bench", "--url", server.url, "--suite", "decode", "--out", str(blocker / "out")])
        calls = server.calls
    finally:
        server.close()
    assert rc == 2 and "error: --out" in capsys.readouterr().err
    assert calls == 0  # nothing was measured and lost


def test_ctrl_c_stops_a_concurrent_suite_within_seconds_and_keeps_finished_samples(tmp_path: Path) -> None:
    """Streams that never end hold every concurrency slot; Ctrl-C (SIGINT to the `ornith-stack bench` process,
    as a terminal sends it) ends the run at once, and the requests that finished before are written."""
    server = LoopbackEngine(["ok"] * 9 + ["endless", "endless"])
    out = tmp_path / "out"
    # Its own process, as the user runs it. The endless streams end at the 30 s deadline if Ctrl-C is not honoured.
    argv = [sys.executable, "-m", "ornith_stack", "bench", "--url", server.url, "--out", str(out), "--suite", "serving",
            "--random-output-len", "8", "--num-prompts", "10", "--max-concurrency", "2", "--repeats", "1",
            "--warmup", "0", "--timeout", "30"]
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_as_from_a_terminal)
        # Sizing the prompts takes 3 requests; Ctrl-C once both endless streams hold the two slots.
        _interrupt_when(lambda: server.calls >= 11 or proc.poll() is not None, lambda: proc.send_signal(signal.SIGINT))
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        waited = time.monotonic() - sent
    finally:
        server.close()
    assert proc.returncode == 130 and "interrupted: wrote the samples gathered so far" in err, err[-2000:]
    assert waited < 10, f"the run went on for {waited:.1f} s after Ctrl-C"
    result = load_result(out / "bench.json")
    assert result.interrupted is True and result.suites.serving is not None
    samples = result.suites.serving.levels[0].samples
    assert len(samples) == 6 and all(s.error is None for s in samples)


def _as_from_a_terminal() -> None:
    """SIGINT delivered and handled, as in a terminal. A process started in the background by a shell without job
    control ignores SIGINT, and its children inherit that: a worker of this test runner was seen with SIGINT
    ignored (SigIgn in /proc), and an ignored SIGINT also keeps Python from installing its KeyboardInterrupt
    handler, so the run went on to its deadline. The bench itself leaves an ignored SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _interrupt_when(condition, interrupt) -> None:
    while not condition():
        time.sleep(0.02)
    time.sleep(0.2)
    interrupt()


def test_a_busy_engine_is_called_out_in_the_report(tmp_path: Path) -> None:
    # Another client generating alongside each measured request: the engine's counter over the same
    # interval no longer matches the stream, and the report says so instead of hiding it.
    quiet = run_bench(_config(suites=("decode",)), None, transport=httpx.MockTransport(FakeEngine()))
    assert "Warning" not in write_outputs(quiet, tmp_path / "quiet")["markdown"].read_text()
    busy = run_bench(_config(suites=("decode",)), None, transport=httpx.MockTransport(FakeEngine(other_traffic=16)))
    decode = busy.suites.decode
    assert decode is not None and decode.engine_decode_tok_s.median and decode.decode_tok_s.median
    assert decode.engine_decode_tok_s.median > 1.5 * decode.decode_tok_s.median
    assert "**Warning**: the engine counted" in write_outputs(busy, tmp_path / "busy")["markdown"].read_text()


def test_the_command_turns_an_engine_that_is_down_into_one_error_line(tmp_path: Path, capsys) -> None:
    from ports import free_port

    from ornith_stack.cli import main

    rc = main(["bench", "--url", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("error: cannot reach") and "Traceback" not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_seed004_method_reports_acceptance_per_task_and_throughput_at_1_8_32(tmp_path: Path) -> None:
    from ornith_stack.bench.methods import apply_method

    engine = FakeEngine(max_model_len=32768)
    config = apply_method(_config(task_limit=2, repeats=1), "seed004")
    result = run_bench(config, None, transport=httpx.MockTransport(engine))
    assert result.suites.tasks is not None
    tasks = result.suites.tasks.tasks
    assert list(tasks) == ["gsm8k", "math500", "humaneval", "mbpp", "mt-bench"]
    # The fake engine accepts 3 drafts per step: 4 tokens a step in both definitions.
    assert all(t.acceptance and t.acceptance.per_request_mean == pytest.approx(4.0) for t in tasks.values())
    assert all(t.acceptance and t.acceptance.token_weighted == pytest.approx(4.0) for t in tasks.values())
    assert all([x.concurrency for x in t.throughput] == [1, 8, 32] for t in tasks.values())
    assert tasks["mt-bench"].checked == 0 and tasks["gsm8k"].passed == 2
    # Thinking on, seed 004's sampling and budget in every task request.
    table = write_outputs(result, tmp_path)["markdown"].read_text()
    assert "| task | acceptance length | concurrency 1 tok/s | concurrency 8 tok/s | concurrency 32 tok/s |" in table
    assert "| acceptance (per-request mean) | acceptance (token-weighted) |" in table
    # Server order draws from the first 160 rows of each set (128 measured after up to 32 warm-up).
    assert "The method asks 128 samples per task; --task-limit ran fewer: GSM8K 2 of 160, MATH-500 2 of 160" in table
    assert "thinking on; sampling: temperature 0.6, top-p 0.95, top-k 20; up to 4096 new tokens" in table
    # Without a limit the shipped sets give 128 each and MT-Bench all 80 of its questions.
    whole = {name: replace(t, n=80 if name == "mt-bench" else 128, available=80 if name == "mt-bench" else 128)
             for name, t in tasks.items()}
    result = replace(result, suites=replace(result.suites, tasks=replace(result.suites.tasks, tasks=whole)))
    table = write_outputs(result, tmp_path)["markdown"].read_text()
    assert ("The method asks 128 samples per task; these sets hold fewer and all of them ran: MT-Bench 80 "
            "(MT-Bench has no more questions).") in table


def test_serving_suite_reports_percentiles_and_spread(tmp_path: Path) -> None:
    result = run_bench(_config(suites=("serving",), random_input_len=64, random_output_len=8, num_prompts=6,
                               max_concurrency=(1, 3), repeats=3, goodput={"ttft": 10000.0}),
                       None, transport=httpx.MockTransport(FakeEngine()))
    assert result.suites.serving is not None
    levels = result.suites.serving.levels
    assert [len(level.runs) for level in levels] == [3, 3]
    assert all(r.completed == 6 and r.total_output_tokens == 48 for level in levels for r in level.runs)
    assert all(r.goodput == pytest.approx(r.request_throughput) for level in levels for r in level.runs)
    paths = write_outputs(result, tmp_path)
    table = paths["markdown"].read_text()
    assert "### rate inf, max concurrency 3: latency percentiles" in table
    assert "| metric | mean | median | p90 | p99 | n |" in table
    assert paths["serving_plot"].read_bytes()[:4] == b"\x89PNG"


class _Recording(FakeEngine):
    """FakeEngine that keeps the user message and max_tokens of every chat request."""

    def __init__(self, max_model_len: int = 4096) -> None:
        super().__init__(max_model_len=max_model_len)
        self.sent: list[tuple[str, int]] = []

    def chat(self, body: dict) -> httpx.Response:
        with self.lock:
            self.sent.append((body["messages"][0]["content"], body["max_tokens"]))
        return super().chat(body)


def test_serving_sends_the_dataset_prompts_in_order_as_vllm_bench_serves_a_custom_dataset(tmp_path: Path) -> None:
    dataset = tmp_path / "prompts.jsonl"
    # The second line as SGLang's bench_serving custom dataset writes it: the first turn is the user message.
    sglang_line = {"conversations": [{"role": "user", "content": "second"}, {"role": "assistant", "content": "ok"}],
                   "output_tokens": 12}
    dataset.write_text('{"prompt": "first"}\n\n' + json.dumps(sglang_line) + "\n")
    engine = _Recording()
    result = run_bench(_config(suites=("serving",), dataset_path=dataset, random_output_len=8, num_prompts=5,
                               max_concurrency=(1,), repeats=2, warmup=1),
                       None, transport=httpx.MockTransport(engine))
    # The bench's own warm-up, the level's warm-up, then two runs of the same five requests: the file's
    # lines in order, starting over, a line's output_tokens winning over --random-output-len.
    run = [("first", 8), ("second", 12), ("first", 8), ("second", 12), ("first", 8)]
    assert engine.sent[2:] == run + run
    serving = result.suites.serving
    assert serving is not None and serving.dataset == str(dataset) and serving.levels[0].runs[0].total_output_tokens == 48
    assert f"5 prompts from `{dataset}`" in write_outputs(result, tmp_path / "out")["markdown"].read_text()


@pytest.mark.parametrize(("text", "message"), [
    ('{"text": "no prompt"}\n', "line 1 lacks prompt"),
    ('{"prompt": "x", "output_tokens": 0}\n', "output_tokens is 0, not a positive token count"),
    ("not json\n", ":1: not JSON"),
    ("\n", "the file holds no JSON lines"),
])
def test_a_bad_dataset_is_one_clear_error_before_any_request(tmp_path: Path, capsys, text: str, message: str) -> None:
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text(text)
    _refused_dataset(tmp_path, capsys, dataset, message)


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _line_of_gigabytes(path: Path) -> Path:
    """One line of 4 GiB: the opening of a prompt, then zero bytes (sparse: no disk is spent)."""
    with path.open("wb") as handle:
        handle.write(b'{"prompt": "')
        handle.truncate(4 << 30)
    return path


def _link_to_dev_zero(path: Path) -> Path:
    path.symlink_to("/dev/zero")
    return path


@pytest.mark.parametrize(("make", "message"), [
    (_fifo, "is not a regular file"),
    (_link_to_dev_zero, "is not a regular file"),
    (_line_of_gigabytes, ":1: a line longer than 16,777,216 bytes"),
])
def test_a_dataset_that_is_no_file_or_has_an_endless_line_is_refused(tmp_path: Path, capsys, make, message: str) -> None:
    _refused_dataset(tmp_path, capsys, make(tmp_path / "prompts.jsonl"), message)


def _refused_dataset(tmp_path: Path, capsys, dataset: Path, message: str) -> None:
    """The bench with --dataset-path DATASET against a live engine: one error line, exit 2, no request sent
    and nothing written to --out."""
    from ornith_stack.cli import main

    server = LoopbackEngine(["ok"])
    try:
        rc = main(["bench", "--url", server.url, "--suite", "serving", "--dataset-path", str(dataset),
                   "--out", str(tmp_path / "out")])
        calls = server.calls
    finally:
        server.close()
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert calls == 0 and not (tmp_path / "out").exists()


class FakeSGLang(FakeEngine):
    """SGLang-shaped: sglang: counters, and a non-streaming chat answer with meta_info.spec_verify_ct when
    asked for it (return_meta_info), as 0.5.17's chat route gives it. Every request also counts
    `other_traffic` tokens and 10 steps of someone else's (the exporter's canary, say)."""

    def __init__(self, other_traffic: int = 0) -> None:
        super().__init__(other_traffic=other_traffic, max_model_len=32768)
        self.bodies: list[dict] = []

    def exposition(self) -> str:
        with self.lock:
            counters = {"sglang:generation_tokens": self.generated, "sglang:spec_verify_calls": self.steps}
        return "".join(f"# TYPE {name} counter\n{name}_total{{model_name=\"fake\",tp_rank=\"0\"}} {value}\n"
                       for name, value in counters.items())

    def chat(self, body: dict) -> httpx.Response:
        with self.lock:
            self.bodies.append(body)
        if body.get("stream"):
            return super().chat(body)
        tokens = min(body["max_tokens"], 40)
        steps = tokens // TOKENS_PER_CHUNK
        with self.lock:
            self.generated += tokens + self.other_traffic
            self.steps += steps + 10 * bool(self.other_traffic)
        message = {"role": "assistant", "content": "Adding up.\n#### 0", "reasoning_content": "thinking"}
        meta = {"prompt_tokens": 20, "completion_tokens": tokens, "spec_verify_ct": steps}
        return httpx.Response(200, json={
            "choices": [{"index": 0, "message": message, "finish_reason": "length"}
                        | ({"meta_info": meta} if body.get("return_meta_info") else {})],
            "usage": {"prompt_tokens": 20, "completion_tokens": tokens, "total_tokens": 20 + tokens}})


def test_seed004_on_sglang_takes_each_request_s_own_steps_whatever_else_runs(tmp_path: Path) -> None:
    """Acceptance per request from SGLang's spec_verify_ct: other traffic moving the engine's counters
    around each request (here 3x the request's tokens) leaves seed 004's acceptance at 4.0."""
    from ornith_stack.bench.methods import apply_method

    engine = FakeSGLang(other_traffic=120)
    config = apply_method(_config(task_limit=2, repeats=1), "seed004")
    result = run_bench(config, None, transport=httpx.MockTransport(engine))
    assert result.engine == "sglang" and result.suites.tasks is not None
    tasks = result.suites.tasks.tasks
    assert all(t.acceptance and t.acceptance.per_request_mean == pytest.approx(4.0) for t in tasks.values())
    assert all(t.acceptance and t.acceptance.token_weighted == pytest.approx(4.0) for t in tasks.values())
    # The acceptance requests asked for meta_info without streaming; the throughput levels streamed.
    asked = [b for b in engine.bodies if b.get("return_meta_info")]
    assert len(asked) == 2 * len(tasks) and not any(b["stream"] for b in asked)
    # Streamed: the run's warm-up; per task and level, dflash's warm-up (the first 1, 8 and 32 rows), then
    # the task's two problems again at concurrency 8 and at 32.
    assert sum(1 for b in engine.bodies if b.get("stream")) == 1 + len(tasks) * (1 + 8 + 32) + len(tasks) * 2 * 2


def test_a_run_that_cannot_fit_the_served_context_is_refused_before_any_request(tmp_path: Path) -> None:
    """Seed 004 asks 4,096 new tokens: on a 4,096-position engine every request would come back HTTP 400."""
    from ornith_stack.bench.methods import apply_method
    from ornith_stack.errors import UserError

    engine = _Recording(max_model_len=4096)
    with pytest.raises(UserError) as refused:
        run_bench(apply_method(_config(), "seed004"), None, transport=httpx.MockTransport(engine))
    message = str(refused.value)
    assert "the tasks suite asks 4097 tokens per request" in message and "--method seed004" in message
    assert "serves 4096" in message and "--max-model-len" in message and "--context-length" in message
    serving = _config(suites=("serving",), random_input_len=4000, random_output_len=128)
    with pytest.raises(UserError, match="--random-input-len/--random-output-len"):
        run_bench(serving, None, transport=httpx.MockTransport(engine))
    assert engine.sent == []
    # What fits runs: a smaller serving workload on the same engine is not refused.
    run_bench(_config(suites=("serving",), random_input_len=64, random_output_len=8, num_prompts=2, repeats=1,
                      max_concurrency=(1,)), None, transport=httpx.MockTransport(engine))
    assert engine.sent


def test_seed004_draws_problems_as_dflash_s_server_path(tmp_path: Path) -> None:
    """Rows in file order: at each concurrency c the first c rows warm up, the next ones are measured."""
    from ornith_stack.bench.methods import apply_method

    engine = _Recording(max_model_len=32768)
    config = apply_method(_config(task_limit=3, repeats=1, tasks=("gsm8k",)), "seed004")
    result = run_bench(config, None, transport=httpx.MockTransport(engine))
    rows = [json.loads(line)["question"] for line in (DATA / "file_order/gsm8k.jsonl").read_text().splitlines()]
    sent = [next(i for i, q in enumerate(rows) if q in content) for content, _ in engine.sent if any(q in content for q in rows)]
    assert sent[:4] == [0, 1, 2, 3]  # warm-up row 0, then rows 1-3 one at a time
    assert sorted(sent[4:12]) == list(range(8)) and sorted(sent[12:15]) == [8, 9, 10]
    assert sorted(sent[15:47]) == list(range(32)) and sorted(sent[47:]) == [32, 33, 34]
    assert result.suites.tasks is not None
    assert [s.id for s in result.suites.tasks.tasks["gsm8k"].samples] == ["gsm8k/1", "gsm8k/2", "gsm8k/3"]
    assert result.suites.tasks.order == "server"
    # Before each level's warm-up the prefix cache is emptied (SGLang's path tried first, then vLLM's).
    flushed = [n for path, n in engine.flushes if path == "/reset_prefix_cache"]
    assert flushed[:3] == [1, 1 + 4, 1 + 4 + 11] and len(flushed) == 5 * 3  # after the run's one warm-up
    assert "Problem order: dflash's server path" in write_outputs(result, tmp_path)["markdown"].read_text()
    # The shuffled draw stays an option: the shipped draw's first rows, no warm-up per level.
    engine = _Recording(max_model_len=32768)
    shuffled = apply_method(_config(task_limit=3, repeats=1, tasks=("gsm8k",), task_order="shuffled"), "seed004")
    run_bench(shuffled, None, transport=httpx.MockTransport(engine))
    drawn = [json.loads(line)["question"] for line in (DATA / "gsm8k.jsonl").read_text().splitlines()][:3]
    measured = [c for c, _ in engine.sent if any(q in c for q in drawn)]
    assert len(measured) == 3 * 3 and all(drawn[0] in c for c in measured[:1])


def test_non_streaming_answers_that_are_not_chat_completions_fail_that_request_only() -> None:
    from ornith_stack.bench.client import EngineClient

    answers = iter([httpx.Response(200, json={"choices": []}), httpx.Response(200, text="not json"),
                    httpx.Response(503, text="overloaded")])
    client = EngineClient("http://fake.test", transport=httpx.MockTransport(lambda request: next(answers)))
    errors = [client.complete_chat({"model": "m", "messages": [], "max_tokens": 4}).error for _ in range(3)]
    assert errors[0] is not None and errors[0].startswith("not an OpenAI chat completion: ValueError: no choices")
    assert errors[1] is not None and errors[1].startswith("not an OpenAI chat completion")
    assert errors[2] == "HTTP 503: overloaded"


def test_an_unknown_task_order_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ornith_stack.cli import main

    rc = main(["bench", "--url", "http://127.0.0.1:9", "--method", "seed004", "--task-order", "random",
               "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == "error: --task-order 'random': choose from server, shuffled"
    assert not (tmp_path / "out").exists()


class _FixedPromptTokens(FakeEngine):
    """An engine (or a proxy in front of one) whose usage.prompt_tokens is the same whatever the prompt."""

    def chat(self, body: dict) -> httpx.Response:
        return super().chat(body | {"messages": [{"role": "user", "content": "x"}]})


def test_an_engine_whose_prompt_tokens_do_not_grow_is_one_clear_error() -> None:
    from ornith_stack.errors import UserError

    with pytest.raises(UserError, match=r"prompt_tokens 13 for a prompt of 100 words and 13 for one of 400.*--dataset-path"):
        run_bench(_config(suites=("serving",), random_input_len=64, random_output_len=8, num_prompts=2, repeats=1,
                          max_concurrency=(1,)), None, transport=httpx.MockTransport(_FixedPromptTokens()))


def test_each_level_warms_up_a_full_round_and_empties_the_cache_before_each_run(tmp_path: Path) -> None:
    """Concurrency 3: three warm-up requests (every batch size the level runs), then the prefix cache emptied before
    each recorded run, not once per level (the warm-up sent the same prompts); each run has the client's CPU time."""
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(f'{{"prompt": "p{i}"}}\n' for i in range(5)))
    engine = FakeEngine()
    result = run_bench(_config(suites=("serving",), dataset_path=dataset, random_output_len=8, num_prompts=5,
                               max_concurrency=(3,), repeats=2, warmup=1), None, transport=httpx.MockTransport(engine))
    # Chat requests before each flush: the bench's warm-up (1), the level's (3 more), the first run (5 more).
    assert [n for path, n in engine.flushes if path == engine.flush_path] == [1, 4, 9]
    assert engine.requests == 1 + 3 + 5 + 5
    serving = result.suites.serving
    assert serving is not None
    runs = serving.levels[0].runs
    assert all(r.client_cpu_s and r.client_cpu_s > 0 and r.client_cpu_s_per_1k_tokens for r in runs)
    assert "client CPU s/1k tok" in write_outputs(result, tmp_path / "out")["markdown"].read_text()
