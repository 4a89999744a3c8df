"""A real vLLM on CPU serving the tiny checkpoints: what every other integration test builds on.

Run: pytest -m integration -k engine
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from local_engine import LOG_TAIL_LINES, EngineStartError, LocalEngine, running_engine

from ornith_stack.engines import adapter_for
from ornith_stack.wire.metrics import parse

pytestmark = pytest.mark.integration

VLLM = adapter_for("vllm")
# Repetition gives the ngram proposer something to match, so drafts are made and some accepted.
PROMPT = "Repeat after me: one two three, one two three, one two three, one two three."


def chat(engine: LocalEngine, enable_thinking: bool = False, max_tokens: int = 48) -> dict:
    response = httpx.post(
        f"{engine.base_url}{VLLM.chat_path}",
        json={
            "model": engine.model_name,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
            "ignore_eos": True,  # a random model may stop at once; the tests need tokens to count
            "chat_template_kwargs": {"enable_thinking": enable_thinking},
        },
        timeout=120,
    )
    response.raise_for_status()
    return response.json()


def expected_prompt_tokens(model_dir: Path, enable_thinking: bool) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "user", "content": PROMPT}]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
    )
    return len(tokenizer(text)["input_ids"])


def scrape(engine: LocalEngine):
    response = httpx.get(f"{engine.base_url}{VLLM.metrics_path}", timeout=30)
    response.raise_for_status()
    return parse(response.text)


def test_engine_chat_without_thinking_reports_completion_tokens(vllm_ngram: LocalEngine, tiny_models) -> None:
    body = chat(vllm_ngram, enable_thinking=False)
    assert body["usage"]["completion_tokens"] == 48
    # The prompt the engine counted is the template's thinking-off rendering (empty think pair),
    # so chat_template_kwargs reached the chat template.
    assert body["usage"]["prompt_tokens"] == expected_prompt_tokens(tiny_models.qwen3_moe, False)
    assert expected_prompt_tokens(tiny_models.qwen3_moe, False) != expected_prompt_tokens(
        tiny_models.qwen3_moe, True
    )


def test_engine_metrics_count_generated_tokens_and_ngram_drafts(vllm_ngram: LocalEngine) -> None:
    before = scrape(vllm_ngram).total(VLLM.metrics.generation_tokens) or 0.0
    for _ in range(3):
        chat(vllm_ngram, max_tokens=64)
    samples = scrape(vllm_ngram)
    assert samples.total(VLLM.metrics.generation_tokens) >= before + 3 * 64
    assert samples.total("vllm:spec_decode_num_drafts_total") > 0
    counters = VLLM.spec_counters(samples)
    assert counters is not None and counters.steps > 0 and counters.drafted >= counters.steps


def test_engine_hybrid_serves_chat_without_speculation(vllm_hybrid: LocalEngine) -> None:
    body = chat(vllm_hybrid, max_tokens=16)
    assert body["usage"]["completion_tokens"] == 16
    samples = scrape(vllm_hybrid)
    assert samples.total(VLLM.metrics.generation_tokens) >= 16
    assert VLLM.spec_counters(samples) is None  # the cpu-demo profile's ngram is removed for it


def test_engine_that_cannot_start_fails_with_its_log_tail(tmp_path: Path) -> None:
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    (not_a_model / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(EngineStartError) as caught, running_engine(not_a_model, timeout_s=300):
        pytest.fail("the engine must not become healthy")
    message = str(caught.value)
    assert "exited with status" in message and f"last {LOG_TAIL_LINES} lines" in message
    tail = message.split("\n", 1)[1].splitlines()
    assert 1 < len(tail) <= LOG_TAIL_LINES
    assert "no-such-architecture" in message  # the engine's own reason, from its log
