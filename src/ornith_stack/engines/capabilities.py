"""Engine flags tied to a GPU generation, checked against the card a profile runs on.

Read in SGLang's sources (0.5.17 and 0.5.21 wheels, $ORNITH_SGLANG0517_SRC / $ORNITH_SGLANG0521_SRC):
- `--attention-backend trtllm_mha`: 0.5.21 arg_groups/attention_hook.py refuses it unless the GPU is
  Hopper (sm90), Blackwell (sm10x) or sm12x ("TRTLLM MHA backend ... requires Hopper (SM90), Blackwell
  (SM100), or SM120 GPUs"); it forces 64-token pages (overrides.py `_mla_backend_page_constraints`).
- `--attention-backend fa3`: FlashAttention 3 is built for Hopper only (sgl_kernel flash_ops, sm90).
- `--attention-backend fa4`: FlashAttention 4 (fmha_sm100) is Blackwell data-center only (sm10x).
- `--enable-flashinfer-allreduce-fusion` (0.5.21: `--flashinfer-allreduce-fusion-backend auto`):
  layers/flashinfer_comm_fusion.py `_resolve_backend`: "FlashInfer allreduce fusion requires SM90 or
  SM10X NVIDIA GPUs."
- `--kv-cache-dtype fp8_e4m3` / `fp8_e5m2`: FP8 arithmetic needs sm89 or later.
A flag the card cannot run is dropped (the engine then picks its own default) and the profile says so.

Which attention backend SGLang picks when the profile names none, for Qwen3.5 with a speculative
algorithm (server_args.py `_get_default_attn_backend` and overrides.py `_qwen3_5_hybrid_overrides`, 0.5.17):
sm90 fa3; sm10x triton (trtllm_mha is skipped with DFlash, and the Qwen3.5 override then chooses
triton over flashinfer); every other generation flashinfer. 0.5.21 resolves alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ornith_stack.sizing.settings import ArgValue

Sm = tuple[int, int]


def _hopper(sm: Sm) -> bool:
    return sm[0] == 9


def _blackwell_dc(sm: Sm) -> bool:
    return sm[0] == 10


@dataclass(frozen=True)
class FlagRule:
    flag: str
    value: str | None  # None: the flag whatever its value (a switch)
    runs_on: Callable[[Sm], bool]
    needs: str  # what the engine says it needs
    source: str  # where the engine says it


RULES = (
    FlagRule("attention-backend", "trtllm_mha", lambda sm: sm[0] in (9, 10, 12),
             "Hopper (sm90), Blackwell (sm10x) or sm12x", "SGLang arg_groups/attention_hook.py"),
    FlagRule("attention-backend", "fa3", _hopper, "Hopper (sm90): FlashAttention 3", "sgl_kernel flash_ops (sm90)"),
    FlagRule("attention-backend", "fa4", _blackwell_dc, "Blackwell data-center GPUs (sm10x): FlashAttention 4",
             "SGLang overrides.py `_fa4_page_constraint` (fmha_sm100)"),
    FlagRule("enable-flashinfer-allreduce-fusion", None, lambda sm: sm[0] in (9, 10),
             "SM90 or SM10X", "SGLang layers/flashinfer_comm_fusion.py"),
    FlagRule("flashinfer-allreduce-fusion-backend", None, lambda sm: sm[0] in (9, 10),
             "SM90 or SM10X", "SGLang layers/flashinfer_comm_fusion.py"),
    FlagRule("kv-cache-dtype", "fp8_e4m3", lambda sm: sm >= (8, 9), "sm89 or later (FP8)", "FP8 KV cache kernels"),
    FlagRule("kv-cache-dtype", "fp8_e5m2", lambda sm: sm >= (8, 9), "sm89 or later (FP8)", "FP8 KV cache kernels"),
    FlagRule("kv-cache-dtype", "fp8", lambda sm: sm >= (8, 9), "sm89 or later (FP8)", "FP8 KV cache kernels"),
)


@dataclass(frozen=True)
class Unrunnable:
    flag: str
    value: ArgValue
    rule: FlagRule
    sm: Sm

    def line(self) -> str:
        shown = f"--{self.flag}" + ("" if self.value is True else f" {self.value}")
        return (f"{shown} needs {self.rule.needs} ({self.rule.source}); this GPU is sm{self.sm[0]}{self.sm[1]}: "
                "the engine refuses to start with it")


def parse_sm(compute_capability: str | None) -> Sm | None:
    if not compute_capability:
        return None
    major, _, minor = compute_capability.partition(".")
    if not major.isdigit():
        return None
    return int(major), int(minor) if minor.isdigit() else 0


def unrunnable(args: dict[str, ArgValue], compute_capability: str | None) -> list[Unrunnable]:
    """The flags of `args` the GPU of `compute_capability` cannot run (nothing when it is unknown)."""
    sm = parse_sm(compute_capability)
    if sm is None:
        return []
    found = []
    for rule in RULES:
        value = args.get(rule.flag)
        if value is None or value is False:
            continue
        if rule.value is not None and str(value).lower() != rule.value:
            continue
        if not rule.runs_on(sm):
            found.append(Unrunnable(rule.flag, value, rule, sm))
    return found


def runnable_args(args: dict[str, ArgValue], compute_capability: str | None) -> tuple[dict[str, ArgValue], list[str]]:
    """`args` without the flags the GPU cannot run, and one line per flag dropped."""
    dropped = unrunnable(args, compute_capability)
    kept = {k: v for k, v in args.items() if k not in {d.flag for d in dropped}}
    lines = [f"dropped {d.line().replace(': the engine refuses to start with it', '')}" for d in dropped]
    if any(d.flag == "attention-backend" for d in dropped):
        # A page size the dropped backend forced goes with it: the engine's default backend pages by 1.
        if "page-size" in kept:
            lines.append(f"dropped --page-size {kept.pop('page-size')} (it belonged to the dropped backend)")
    return kept, lines


def default_attention_backend(compute_capability: str | None, speculative: bool) -> str | None:
    """The attention backend SGLang picks for Qwen3.5 when the profile names none, and why."""
    sm = parse_sm(compute_capability)
    if sm is None:
        return None
    if sm[0] == 9:
        return "fa3 (SGLang's default on Hopper)"
    if sm[0] == 10:
        return ("triton (SGLang 0.5.17 on Blackwell: trtllm_mha is not used with DFlash, and the Qwen3.5 "
                "override falls back to triton)" if speculative else "trtllm_mha with 64-token pages (SGLang's "
                "default on Blackwell)")
    return "flashinfer (SGLang's default on this generation)"


def attention_backend_line(args: dict[str, ArgValue], compute_capability: str | None, speculative: bool) -> str | None:
    """Which attention backend the profile's engine gets on this GPU, as one line."""
    named = args.get("attention-backend")
    if named:
        return f"attention backend {named} (the profile's --attention-backend)"
    picked = default_attention_backend(compute_capability, speculative)
    return f"attention backend {picked}" if picked else None
