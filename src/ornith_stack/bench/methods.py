"""The seeds' measurement methods by name: each sets the suites, tasks, prompts and sampling the seed
used, so `--method seed000` or `--method seed004` reproduces that seed's table.

- seed000: single stream, greedy, thinking off, 640-token generations; GSM8K and HumanEval task runs
  give the headline decode tok/s and speedup; essay prompts with ignore_eos are a separate figure.
- seed004: thinking on, temperature 0.6, top-p 0.95, top-k 20, up to 4,096 new tokens, 128 samples per
  task, z-lab/dflash prompt formatting and its server path's problem order (rows in file order, the first
  `concurrency` of them warm-up), MT-Bench first turn only; acceptance per request at
  concurrency 1 (on SGLang from the request's own spec_verify_ct, so other traffic such as the
  exporter's canary cannot leak into it) and throughput at concurrency 1, 8 and 32 per task.
"""

from __future__ import annotations

from dataclasses import replace

from ornith_stack.bench.datasets import SEED000_TASKS, TASKS
from ornith_stack.bench.suites import BenchConfig
from ornith_stack.errors import UserError
from ornith_stack.profiles.model import Sampling

METHODS = ("custom", "seed000", "seed004")
SEED004_SAMPLES = 128
SEED004_SAMPLING = Sampling(temperature=0.6, top_p=0.95, top_k=20)


def apply_method(config: BenchConfig, name: str) -> BenchConfig:
    """`config` with the method's settings; `custom` keeps the flags as given."""
    if name == "custom":
        return config
    if name == "seed000":
        return replace(config, method=name, suites=("decode", "tasks"), tasks=SEED000_TASKS,
                       prompt_format="seed000", sampling=None, thinking=False, max_tokens=640,
                       task_max_tokens=640, task_concurrency=())
    if name == "seed004":
        limit = min(config.task_limit or SEED004_SAMPLES, SEED004_SAMPLES)
        return replace(config, method=name, suites=("tasks",), tasks=TASKS, prompt_format="dflash", task_order=config.task_order or "server",
                       sampling=SEED004_SAMPLING, thinking=True, task_max_tokens=4096, task_limit=limit,
                       requested_task_samples=SEED004_SAMPLES, task_concurrency=(1, 8, 32),
                       per_request_steps=True)
    raise UserError(f"--method {name!r}: choose from {', '.join(METHODS)}")
