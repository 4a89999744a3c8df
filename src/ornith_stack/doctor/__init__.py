"""Preflight doctor: observe the machine and the checkpoint, then ask the planner.

Rooms: `gpu` (the NVML probe), `checkpoint` (index and safetensors headers), `autoselect`
(`--profile auto`), `checks` (every check, `diagnose`) and `report` (findings, one line each;
`Report.ready` is False when any finding is a problem).
"""

from __future__ import annotations

from ornith_stack.doctor.checks import Options, diagnose
from ornith_stack.doctor.gpu import GpuInfo, NoGpu, probe_gpus
from ornith_stack.doctor.report import Finding, Report

__all__ = ["Finding", "GpuInfo", "NoGpu", "Options", "Report", "diagnose", "probe_gpus"]
