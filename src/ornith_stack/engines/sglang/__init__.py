"""SGLang: its adapter, flags, metric names and panels, and the planner's accounting of its releases."""

from ornith_stack.engines.sglang.adapter import SglangAdapter

__all__ = ["SglangAdapter"]
