"""A profile computed for any GPU of the table: the seed's recipe sized to the card, laid out over the host.

A recipe is a seed's model, draft, engine and flags, as its shipped profiles hold them; each of those
profiles fixes the seed's headroom at its own tp (seed 000: --mem-fraction-static 0.85 at tp 1,
0.80 at tp 2). For a GPU and a count the layout tries tp 1, 2, 4, 8 with the flags of the shipped
profile nearest below that tp, less the flags the GPU cannot run (engines/capabilities.py), with the caps sized
to the card by the engine's own accounting (`card_caps`: SGLang's running requests, state slots and KV
pool; vLLM's per-GPU KV pin), and asks that accounting whether it starts on the memory the engine finds
(sizing/engine_memory.py). It then runs count // tp data-parallel replicas of the tp that serves the most
requests at once (replicas x running requests), or with `latency` of the largest tp that starts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from ornith_stack.engines import ADAPTERS, adapter_for
from ornith_stack.errors import UserError
from ornith_stack.gpus import GpuModel
from ornith_stack.planner import plan_request, request_for_profile
from ornith_stack.profiles import from_data, load_profile
from ornith_stack.profiles.model import Profile
from ornith_stack.sizing.common import tp_divisibility
from ornith_stack.sizing.model import Caps, Plan, PlanRequest
from ornith_stack.sizing.shapes import load_shape

TP_SIZES = (1, 2, 4, 8)
# Context lengths `profiles new` weighs (the model's window first), each a power of two: the serving default
# is the longest at which one replica runs at least USEFUL_RUNNING requests; `profiles new` picks any.
CONTEXT_CHOICES = (262_144, 131_072, 65_536, 32_768)
# Running requests per replica the serving default keeps: 8 is the middle load of the project's bench (1, 8, 32
# concurrent) and where the seed's H200 throughput has left single-stream decode behind (FACTS 13: 268 tok/s
# at 1, 1,058 at 8 with seed 000's caps).
USEFUL_RUNNING = 8
# Below this a profile is said loudly to serve too few: seed 000's own --max-running-requests 4 is the
# fewest its author served; with fewer, a fifth user waits for a whole generation.
MIN_RUNNING = 4
# GeForce boards at tp > 1: NCCL's peer-to-peer path over PCIe hangs (all_reduce on 2 and 8 RTX 4090s:
# NVIDIA/nccl-tests issue 117, tinygrad/open-gpu-kernel-modules issue 45, where NCCL_P2P_DISABLE=1 runs); NCCL
# then goes through host shared memory. The doctor warns when a GeForce host's profile lacks it.
GEFORCE_NCCL_ENV = {"NCCL_P2P_DISABLE": "1"}
# The shortest --context-length accepted: a prompt and its answer (the accounting's MIN_KV_TOKENS).
MIN_CONTEXT = 4096
_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
# What a layout is chosen for: the most requests served at once over the host (replicas x running
# requests per replica), or the lowest per-token latency (the largest tp that fits, its weights and
# decode spread over the most GPUs).
OBJECTIVES = ("throughput", "latency")


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
    caps: Caps  # the caps sized to this card (running requests per replica, KV tokens)
    changes: tuple[str, ...] = ()  # flags dropped or sized for the card, one line each
    objective: str = "throughput"
    considered: tuple[str, ...] = ()  # every tp tried: "tp 2: 4 x 38 running" or why not
    context: int = 0  # tokens per request (the engine's context flag)
    context_chosen: str = ""  # why this context: given, or the serving default's reason
    # (context length, running requests per replica, layout) at each context weighed, the model's window first.
    trade: tuple[tuple[int, int], ...] = ()

    @property
    def tp(self) -> int:
        return self.plan.tp

    @property
    def replicas(self) -> int:
        return self.profile.serve.replicas

    @property
    def running(self) -> int:
        """Requests served at once over the host: replicas x each replica's running-request limit."""
        return self.replicas * self.caps.running

    @property
    def idle(self) -> int:
        return self.count - self.tp * self.replicas

    @property
    def placed(self) -> bool:
        # "unknown" (no problem found, a figure is a guess: an inferred draft shape) is placed and said so.
        return self.caps.running > 0 and not self.plan.problems


def recipe(key: str) -> Recipe:
    if key not in RECIPES:
        raise UserError(f"unknown model {key!r}; choose one of: {', '.join(RECIPES)}")
    return RECIPES[key]


def recipe_of(profile: Profile) -> str:
    """The recipe whose model, draft and engine `profile` serves (a shipped seed profile or one computed from
    it); the default recipe when none does."""
    def key(p: Profile) -> tuple[object, ...]:
        return p.engine.kind, p.model.shape, p.draft.shape if p.draft else None

    for r in RECIPES.values():
        if profile.name in r.profiles or any(key(load_profile(n)) == key(profile) for n in r.profiles):
            return r.key
    return DEFAULT_RECIPE


def compute_layout(recipe_key: str, gpu: GpuModel, count: int, name: str,
                   objective: str = "throughput", context_length: int | None = None) -> Layout:
    """The layout of `recipe_key` on `count` x `gpu` at `context_length` tokens per request: for throughput
    the tp whose replicas x running requests is largest (ties: the smaller tp, more replicas), for latency
    the largest tp that fits; UserError naming what would start when none does. Without a context length,
    the serving default: the longest of CONTEXT_CHOICES (the model's window first) at which a replica runs
    USEFUL_RUNNING requests, else the one that runs the most. `trade` keeps every context weighed."""
    if objective not in OBJECTIVES:
        raise UserError(f"--layout must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if not 1 <= count <= gpu.per_host:
        raise UserError(f"--count must be from 1 to {gpu.per_host}: one host holds at most {gpu.per_host}x "
                        f"{gpu.name}, got {count}")
    chosen = recipe(recipe_key)
    bases = sorted(((load_profile(n), n) for n in chosen.profiles), key=lambda b: _tp(b[0]))
    window = load_shape(bases[0][0].model.shape or "").max_position_embeddings
    if context_length is not None and not MIN_CONTEXT <= context_length <= window:
        raise UserError(f"--context-length must be from {MIN_CONTEXT:,} (a prompt and its answer) to the model's "
                        f"window of {window:,} tokens, got {context_length:,}")
    if context_length is not None:
        picked, why = _layout_at(chosen, bases, gpu, count, name, objective, context_length), "given (--context-length)"
    else:
        picked, why = _serving_default(chosen, bases, gpu, count, name, objective, window)
    return replace(picked, context_chosen=why, trade=context_trade(_request(picked.profile, gpu, picked.tp)))


def _serving_default(chosen: Recipe, bases: list[tuple[Profile, str]], gpu: GpuModel, count: int, name: str,
                     objective: str, window: int) -> tuple[Layout, str]:
    """The longest context (the model's window first) at which a replica runs USEFUL_RUNNING requests, else
    the one that runs the most; the refusal at the full window when none starts."""
    placed: list[Layout] = []
    refusal: UserError | None = None
    for ctx in _contexts(window):
        try:
            layout = _layout_at(chosen, bases, gpu, count, name, objective, ctx)
        except UserError as exc:
            refusal = refusal or exc
            continue
        if layout.caps.running >= USEFUL_RUNNING:
            return layout, (f"the serving default: the longest context at which a replica runs at least "
                            f"{USEFUL_RUNNING} requests" + (" (the model's full window)" if ctx == window else
                            f"; the full window is an explicit choice: --context-length {window}"))
        placed.append(layout)
    if not placed:
        assert refusal is not None
        raise refusal
    best = max(placed, key=lambda c: (c.caps.running, c.context))
    return best, (f"the serving default: no context runs {USEFUL_RUNNING} requests per replica on this card; "
                  "this one runs the most")


def _contexts(window: int) -> list[int]:
    return [window, *(c for c in CONTEXT_CHOICES if c < window)]


def context_trade(req: PlanRequest) -> tuple[tuple[int, int], ...]:
    """(context length, running requests per replica) on the request's card at the model's window and each
    shorter CONTEXT_CHOICES, with the caps a computed profile would get there (0: not one request)."""
    adapter = ADAPTERS[req.engine]
    return tuple((ctx, adapter.card_caps(req.with_settings(max_model_len=ctx)).running)
                 for ctx in _contexts(req.shape.max_position_embeddings))


def trade_line(trade: tuple[tuple[int, int], ...], window: int) -> str:
    """"full window 262,144: 2; 131,072: 6; 65,536: 8; 32,768: 8" (running requests per replica)."""
    return "; ".join(f"{'full window ' if ctx == window else ''}{ctx:,}: {n}" for ctx, n in trade)


def _layout_at(chosen: Recipe, bases: list[tuple[Profile, str]], gpu: GpuModel, count: int, name: str,
               objective: str, context: int) -> Layout:
    shape = load_shape(bases[0][0].model.shape or "")
    candidates = [_candidate(chosen, bases, gpu, max(count, tp), tp, name, objective, context)
                  for tp in TP_SIZES if tp <= gpu.per_host and not tp_divisibility(shape, tp)]
    considered = tuple(_considered(c, count) for c in candidates)
    fitting = [c for c in candidates if c.placed and c.tp <= count]
    if fitting:
        if objective == "latency":
            best = max(fitting, key=lambda c: c.tp)
        else:
            best = max(fitting, key=lambda c: (c.running, -c.tp))
        return replace(best, count=count, considered=considered, context=context)
    larger = next((c for c in candidates if c.placed), None)
    raise UserError(_refusal(chosen, gpu, count, candidates, larger.tp if larger else None))


def _considered(c: Layout, count: int) -> str:
    if not c.placed:
        why = c.caps.why if c.caps.running <= 0 else "; ".join(p.line() for p in c.plan.problems[:1])
        return f"tp {c.tp}: does not start ({why})"
    if c.tp > count:
        return f"tp {c.tp}: needs {c.tp} GPUs"
    return f"tp {c.tp}: {count // c.tp} replica(s) x {c.caps.running} running = {count // c.tp * c.caps.running}"


def _tp(profile: Profile) -> int:
    return adapter_for(profile).settings(profile).tp


def _candidate(chosen: Recipe, bases: list[tuple[Profile, str]], gpu: GpuModel, count: int, tp: int,
               name: str, objective: str, context: int) -> Layout:
    base, base_name = next(((p, n) for p, n in reversed(bases) if _tp(p) <= tp), bases[0])
    replicas = count // tp
    adapter = adapter_for(base)
    args, changes = adapter.runnable_args(dict(base.serve.args), gpu.compute_capability)
    args[adapter.tp_flag] = tp
    if context < load_shape(base.model.shape or "").max_position_embeddings:
        args[adapter.context_flag] = context  # the full window is the engine's default (and the seed's value)
    draft = from_data(_profile_data(base, chosen, gpu, tp, replicas, name, args), Path(f"{name}.yaml"))
    request = _request(draft, gpu, tp)
    caps = adapter.card_caps(request)
    sized = {**{k: v for k, v in args.items() if caps.flags.get(k, 0) is not None},
             **{k: v for k, v in caps.flags.items() if v is not None}}
    profile = from_data(_profile_data(base, chosen, gpu, tp, replicas, name, sized), Path(f"{name}.yaml"))
    changes += [_cap_line(flag, base.serve.args.get(flag), value, caps) for flag, value in caps.flags.items()
                if str(base.serve.args.get(flag)) != str(value) and (value is not None or flag in base.serve.args)]
    return Layout(chosen, gpu, count, profile, plan_request(_request(profile, gpu, tp)), base_name, caps,
                  tuple(changes), objective)


def _request(profile: Profile, gpu: GpuModel, tp: int) -> PlanRequest:
    return request_for_profile(profile, gpu_memory_gib=gpu.memory_gib, gpu_count=tp,
                               compute_capability=gpu.compute_capability, unified_memory=gpu.unified_memory)


def _cap_line(flag: str, before: object, value: object, caps: Caps) -> str:
    if value is None:
        return f"dropped --{flag} {before}: the engine sizes it on this card"
    was = f" (the seed's {before})" if before is not None else ""
    return f"--{flag} {value}{was}: {caps.reasons.get(flag, 'sized to this card')}"


def _profile_data(base: Profile, chosen: Recipe, gpu: GpuModel, tp: int, replicas: int, name: str,
                  args: dict[str, Any]) -> dict[str, Any]:
    data = base.model_dump(mode="json", exclude_none=True)
    data["name"] = name
    shape = f"{replicas} x tp {tp}" if replicas > 1 else f"tp {tp}"
    data["description"] = f"{chosen.summary} on {replicas * tp}x {gpu.name} ({shape}), computed from profile {base.name}."
    data["engine"] = {"kind": base.engine.kind, "version": base.engine.version}  # the image pin comes from images.yaml
    data["hardware"] = {
        "description": f"{replicas * tp}x {gpu.name}",
        "gpu": {"model": gpu.name, "count": replicas * tp, "memory_gib": gpu.memory_gib,
                "compute_capability": gpu.compute_capability, "memory_bandwidth_gbps": gpu.memory_bandwidth_gbps,
                "models": gpu.profile_models},
        "cpu_arch": [gpu.host_arch],
    }
    data["serve"] = {**data["serve"], "args": args, "replicas": replicas}
    if gpu.geforce and tp > 1:
        data["serve"]["env"] = {**data["serve"].get("env", {}), **GEFORCE_NCCL_ENV}
    expected = data.pop("expected", None)
    if expected and expected.get("acceptance_length"):  # the draft's acceptance does not depend on the GPU
        data["expected"] = {"source": expected["source"], "acceptance_length": expected["acceptance_length"]}
    return data


def _refusal(chosen: Recipe, gpu: GpuModel, count: int, tried: list[Layout], fix: int | None) -> str:
    have = f"{_WORDS.get(count, count)} {gpu.name}" if count > 1 else f"one {gpu.name}"
    first = next((c for c in tried if c.tp <= count), tried[0])
    why = first.caps.why if first.caps.running <= 0 else "; ".join(p.line() for p in first.plan.problems[:2])
    memory = f"{gpu.memory_gib:g} GiB available" if gpu.unified_memory else f"{gpu.memory_gib:g} GiB each"
    head = f"{have} ({memory}) cannot start {chosen.summary}: at tp {first.tp}, {why}"
    if fix is None:
        most = _WORDS.get(gpu.per_host, gpu.per_host)
        others = [r for r in RECIPES.values() if r.key != chosen.key and _starts(r, gpu, count)]
        instead = "".join(f"; --model {r.key} ({r.summary}) starts here" for r in others)
        if gpu.per_host == 1:
            return f"{head}; one host holds one: choose a GPU with more memory (--gpu){instead}"
        return f"{head}; not even {most} of them in one host would: choose a GPU with more memory (--gpu){instead}"
    serve = next(c for c in tried if c.tp == fix).caps.running
    return (f"{head}; {_WORDS.get(fix, fix)} of them, tp {fix}, would ({serve} running requests per replica; "
            f"--count {fix})")


def _starts(chosen: Recipe, gpu: GpuModel, count: int) -> bool:
    """Whether `chosen` has a layout on `count` x `gpu` (a refusal names the recipes that do)."""
    try:
        compute_layout(chosen.key, gpu, count, "x")
    except UserError:
        return False
    return True


def profile_document(layout: Layout, command: str) -> str:
    """The computed profile as a profile file: how it was made and the planner's verdict, then the YAML."""
    data = layout.profile.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    data["engine"] = {"kind": layout.profile.engine.kind, "version": layout.profile.engine.version}
    return "".join(f"# {line}\n" for line in layout_lines(layout, command)) + yaml.safe_dump(data, sort_keys=False)


def layout_lines(layout: Layout, command: str | None = None) -> list[str]:
    """What `profiles new` says about a layout, and what the profile file's header keeps."""
    plan = layout.plan
    lines = [f"Computed by `{command}`"] if command else []
    lines += [
        f"from the recipe {layout.recipe.key} ({layout.recipe.summary}), flags of profile {layout.base},",
        f"for {layout.count}x {layout.gpu.name} ({layout.gpu.memory_gib:g} GiB each, sm{layout.gpu.compute_capability}"
        f", {layout.gpu.interconnect}; GPU table key {layout.gpu.key}).",
        f"Layout for {layout.objective}: {layout.replicas} replica(s) x tp {layout.tp}, "
        f"{layout.running} requests at once over the host ({layout.caps.running} per replica). Tried: "
        + "; ".join(layout.considered) + ".",
        f"Planner ({plan.engine} {plan.engine_version}): {plan.verdict}; per replica {plan.kv_cache_tokens:,} KV "
        f"tokens, {layout.caps.why}.",
    ]
    lines += context_lines(layout)
    adapter = adapter_for(layout.profile)
    logged = adapter.expected_log(plan)
    if logged:
        lines.append(logged)
    lines += layout.changes
    backend = adapter.attention_backend_line(dict(layout.profile.serve.args), layout.gpu.compute_capability,
                                             bool(adapter.settings(layout.profile).speculative_method))
    if backend:
        lines.append(f"{backend[0].upper()}{backend[1:]} on this GPU.")
    if layout.gpu.unified_memory:
        lines.append(f"Unified memory: sized on the {layout.gpu.memory_gib:g} GiB an idle host gives the GPU (MemAvailable "
                     "+ SwapFree: what the doctor reads, and what SGLang sizes from on an integrated GPU); what other "
                     "processes take later comes out of the pools, and the doctor plans on what it reads.")
    if layout.tp > 1 and layout.gpu.geforce:
        lines.append("NCCL_P2P_DISABLE=1 in serve.env: GeForce boards have no peer-to-peer over PCIe and NCCL's "
                     "P2P all-reduce hangs on them; NCCL goes through host shared memory.")
    if layout.tp > 1 and layout.gpu.interconnect == "pcie":
        lines.append(f"tp {layout.tp} all-reduces over PCIe every layer: --layout latency gains less here than on "
                     "NVLink.")
    if layout.idle:
        lines.append(f"{layout.idle} GPU(s) stay idle: {layout.count} is not a multiple of tp {layout.tp}.")
    lines += [f"Unknown: {u}" for u in plan.unknowns]
    return lines


def context_lines(layout: Layout) -> list[str]:
    """The context the profile serves, why, the trade against running requests, and a loud warning when a
    replica runs fewer than MIN_RUNNING requests."""
    if not layout.context:
        return []
    window = layout.plan.max_model_len if not layout.trade else layout.trade[0][0]
    lines = [f"Context: {layout.context:,} tokens per request, {layout.context_chosen}.",
             f"Running requests per replica by context on this card: {trade_line(layout.trade, window)}."]
    if layout.caps.running < MIN_RUNNING:
        better = next((ctx for ctx, n in layout.trade if n >= MIN_RUNNING), None)
        fix = (f"--context-length {better} runs {dict(layout.trade)[better]}" if better
               else "a card with more memory or more GPUs (--gpu, --count) runs more")
        lines.append(f"WARNING: {layout.caps.running} running request(s) per replica at {layout.context:,} tokens, "
                     f"fewer than {MIN_RUNNING} (seed 000's own cap): one more user waits for a whole answer; {fix}.")
    return lines
