"""vLLM: its adapter, flags, metric names and panels, and the planner's accounting of its release."""

from ornith_stack.engines.vllm.adapter import VllmAdapter

__all__ = ["VllmAdapter"]
