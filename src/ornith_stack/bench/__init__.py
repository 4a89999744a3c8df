"""`ornith-stack bench`: the seeds' tables (decode, speedup, acceptance, pass rates, TTFT sweep,
concurrency) measured on any OpenAI-compatible endpoint, compared with a baseline run and the seed."""

from ornith_stack.bench.run import run_bench
from ornith_stack.bench.suites import SUITES, BenchConfig

__all__ = ["SUITES", "BenchConfig", "run_bench"]
