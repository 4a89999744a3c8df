"""Capacity planner: numbers in, numbers out (no GPU, no engine, no network).

`plan_request(PlanRequest)` runs the accounting of the request's engine (its adapter's); `request_for_profile` builds
the request from a profile (its flags through the engine adapter, its shape from `sizing/configs/`).
The doctor calls the same functions with what it observed (real GPU memory, checkpoint bytes).
"""

from __future__ import annotations

from typing import Any

from ornith_stack.engines import ADAPTERS
from ornith_stack.errors import UserError
from ornith_stack.planner.options import PlanOptions, build_request
from ornith_stack.planner.profile_request import request_for_profile
from ornith_stack.profiles.model import Profile
from ornith_stack.sizing.model import GIB, Plan, PlanRequest, Problem
from ornith_stack.sizing.shapes import ModelShape, load_shape, shipped_shapes


def plan_request(req: PlanRequest) -> Plan:
    """The accounting of the request's engine (its adapter's, engines/*/accounting.py)."""
    if req.engine not in ADAPTERS:
        raise UserError(f"unknown engine {req.engine!r}; choose one of: {', '.join(ADAPTERS)}")
    return ADAPTERS[req.engine].plan(req)


def plan_profile(profile: Profile, **kwargs: Any) -> Plan:
    return plan_request(request_for_profile(profile, **kwargs))


__all__ = [
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
