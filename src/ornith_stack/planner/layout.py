"""A profile computed for any GPU of the table: the seed's recipe at the smallest tp that fits, replicated.

A recipe is a seed's model, draft, engine and flags, as its shipped profiles hold them; each of those
profiles fixes the seed's headroom at its own tp (seed 000: --mem-fraction-static 0.85 at tp 1,
0.80 at tp 2). For a GPU and a count the layout tries tp 1, 2, 4, 8 with the flags of the shipped
profile nearest below that tp, asks the engine's accounting whether it fits on that GPU's memory,
and runs count // tp data-parallel replicas of the smallest tp that fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError
from ornith_stack.gpus import GpuModel
from ornith_stack.planner import plan_profile
from ornith_stack.planner.model import Plan
from ornith_stack.profiles import from_data, load_profile
from ornith_stack.profiles.model import Profile

TP_SIZES = (1, 2, 4, 8)
_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


@dataclass(frozen=True)
class Recipe:
    key: str
    summary: str
    profiles: tuple[str, ...]  # the seed's shipped profiles, each the seed's flags at its tp


RECIPES = {
    r.key: r
    for r in (
        Recipe("ornith-1.5-35b-dflash", "Ornith-1.5-35B-A3B + DFlash in SGLang 0.5.17 (seed 000)", ("gpu96", "a100x2")),
        Recipe("ornith-1.0-35b-bf16", "Ornith 1.0 35B BF16 in vLLM 0.24.0 (seed 003)", ("spark",)),
        Recipe("ornith-1.5-122b-dflash2", "Ornith-1.5-122B + DFlash 2 in SGLang 0.5.21 (seed 004)", ("gb300x2",)),
    )
}
DEFAULT_RECIPE = "ornith-1.5-35b-dflash"


@dataclass(frozen=True)
class Layout:
    recipe: Recipe
    gpu: GpuModel
    count: int  # GPUs on the host
    profile: Profile  # tp x replicas of them
    plan: Plan  # one replica's plan, per GPU
    base: str  # the shipped profile whose flags it uses

    @property
    def tp(self) -> int:
        return self.plan.tp

    @property
    def replicas(self) -> int:
        return self.profile.serve.replicas

    @property
    def idle(self) -> int:
        return self.count - self.tp * self.replicas


def recipe(key: str) -> Recipe:
    if key not in RECIPES:
        raise UserError(f"unknown model {key!r}; choose one of: {', '.join(RECIPES)}")
    return RECIPES[key]


def compute_layout(recipe_key: str, gpu: GpuModel, count: int, name: str) -> Layout:
    """The layout of `recipe_key` on `count` x `gpu`; UserError naming what would fit when none does."""
    if not 1 <= count <= gpu.per_host:
        raise UserError(f"--count must be from 1 to {gpu.per_host}: one host holds at most {gpu.per_host}x "
                        f"{gpu.name}, got {count}")
    chosen = recipe(recipe_key)
    bases = sorted(((load_profile(n), n) for n in chosen.profiles), key=lambda b: _tp(b[0]))
    tried: list[Layout] = []
    for tp in (t for t in TP_SIZES if t <= max(count, gpu.per_host)):
        layout = _candidate(chosen, bases, gpu, max(count, tp), tp, name)
        # "unknown" (no problem found, a figure is a guess: the 122B's draft shape) is chosen and said so.
        placed = not layout.plan.problems
        if placed and tp <= count:
            return layout
        if placed and tp <= gpu.per_host:
            raise UserError(_refusal(chosen, gpu, count, layout.plan, tried, fix=tp))
        tried.append(layout)
    raise UserError(_refusal(chosen, gpu, count, tried[0].plan, tried, fix=None))


def _tp(profile: Profile) -> int:
    return adapter_for(profile).settings(profile).tp


def _candidate(chosen: Recipe, bases: list[tuple[Profile, str]], gpu: GpuModel, count: int, tp: int,
               name: str) -> Layout:
    base, base_name = next(((p, n) for p, n in reversed(bases) if _tp(p) <= tp), bases[0])
    replicas = count // tp
    profile = from_data(_profile_data(base, chosen, gpu, tp, replicas, name), Path(f"{name}.yaml"))
    return Layout(chosen, gpu, count, profile, plan_profile(profile, gpu_memory_gib=gpu.memory_gib, gpu_count=tp),
                  base_name)


def _profile_data(base: Profile, chosen: Recipe, gpu: GpuModel, tp: int, replicas: int, name: str) -> dict[str, Any]:
    data = base.model_dump(mode="json", exclude_none=True)
    data["name"] = name
    shape = f"{replicas} x tp {tp}" if replicas > 1 else f"tp {tp}"
    data["description"] = f"{chosen.summary} on {replicas * tp}x {gpu.name} ({shape}), computed from profile {base.name}."
    data["engine"] = {"kind": base.engine.kind, "version": base.engine.version}  # the image pin comes from images.yaml
    data["hardware"] = {
        "description": f"{replicas * tp}x {gpu.name}",
        "gpu": {"model": gpu.name, "count": replicas * tp, "memory_gib": gpu.memory_gib,
                "compute_capability": gpu.compute_capability, "memory_bandwidth_gbps": gpu.memory_bandwidth_gbps,
                "models": [gpu.key]},
        "cpu_arch": [gpu.host_arch],
    }
    args = dict(base.serve.args)
    args[adapter_for(base).tp_flag] = tp
    data["serve"] = {**data["serve"], "args": args, "replicas": replicas}
    expected = data.pop("expected", None)
    if expected and expected.get("acceptance_length"):  # the draft's acceptance does not depend on the GPU
        data["expected"] = {"source": expected["source"], "acceptance_length": expected["acceptance_length"]}
    return data


def _refusal(chosen: Recipe, gpu: GpuModel, count: int, plan: Plan, tried: list[Layout], fix: int | None) -> str:
    have = f"{_WORDS.get(count, count)} {gpu.name}" if count > 1 else f"one {gpu.name}"
    why = "; ".join(p.line() for p in (tried[0].plan.problems if tried else plan.problems)[:2])
    head = f"{have} ({gpu.memory_gib:g} GiB each) cannot hold {chosen.summary}: {why}"
    if fix is None:
        most = _WORDS.get(gpu.per_host, gpu.per_host)
        return f"{head}; not even {most} of them in one host would: choose a GPU with more memory (--gpu)"
    return f"{head}; {_WORDS.get(fix, fix)} of them, tp {fix}, would (--count {fix})"


def profile_document(layout: Layout, command: str) -> str:
    """The computed profile as a profile file: how it was made and the planner's verdict, then the YAML."""
    data = layout.profile.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    data["engine"] = {"kind": layout.profile.engine.kind, "version": layout.profile.engine.version}
    plan = layout.plan
    lines = [
        f"Computed by `{command}`",
        f"from the recipe {layout.recipe.key} ({layout.recipe.summary}), flags of profile {layout.base},",
        f"for {layout.count}x {layout.gpu.name} ({layout.gpu.memory_gib:g} GiB each, GPU table key {layout.gpu.key}).",
        f"Planner ({plan.engine} {plan.engine_version}): {plan.verdict} at tp {layout.tp}, {layout.replicas} replica(s); per replica "
        f"{plan.kv_cache_tokens:,} KV tokens, max concurrency {plan.max_concurrency:.2f}x at {plan.max_model_len:,} tokens.",
    ]
    if layout.idle:
        lines.append(f"{layout.idle} GPU(s) stay idle: {layout.count} is not a multiple of tp {layout.tp}.")
    head = "".join(f"# {line}\n" for line in lines)
    return head + yaml.safe_dump(data, sort_keys=False)
