"""Capacity planner: numbers in, numbers out (no GPU, no engine, no network).

`plan_request(PlanRequest)` runs the accounting of the request's engine; `request_for_profile` builds
the request from a profile (its flags through the engine adapter, its shape from `planner/configs/`).
The doctor calls the same functions with what it observed (real GPU memory, checkpoint bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ornith_stack.errors import UserError
from ornith_stack.planner import sglang, vllm
from ornith_stack.planner.model import GIB, Plan, PlanRequest, Problem
from ornith_stack.planner.options import PlanOptions, build_request
from ornith_stack.planner.profile_request import request_for_profile
from ornith_stack.planner.shapes import ModelShape, load_shape, shipped_shapes
from ornith_stack.profiles.model import Profile

# One accounting per engine kind, keyed like the engine adapters.
ACCOUNTING: dict[str, Callable[[PlanRequest], Plan]] = {"vllm": vllm.plan, "sglang": sglang.plan}


def plan_request(req: PlanRequest) -> Plan:
    if req.engine not in ACCOUNTING:
        raise UserError(f"unknown engine {req.engine!r}; choose one of: {', '.join(ACCOUNTING)}")
    return ACCOUNTING[req.engine](req)


def plan_profile(profile: Profile, **kwargs: Any) -> Plan:
    return plan_request(request_for_profile(profile, **kwargs))


__all__ = [
    "ACCOUNTING",
    "GIB",
    "ModelShape",
    "Plan",
    "PlanRequest",
    "PlanOptions",
    "Problem",
    "build_request",
    "load_shape",
    "plan_profile",
    "plan_request",
    "request_for_profile",
    "shipped_shapes",
]
