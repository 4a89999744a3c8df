"""`--profile auto`: the profile whose GPU matches the detected ones and whose plan fits, and why."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ornith_stack.doctor.gpu import GpuInfo
from ornith_stack.errors import UserError
from ornith_stack.gpus import entry_matches, identify
from ornith_stack.planner import plan_request, request_for_profile
from ornith_stack.planner.layout import DEFAULT_RECIPE, Layout, compute_layout
from ornith_stack.profiles import load_profile, profile_names
from ornith_stack.profiles.model import Profile
from ornith_stack.sizing.model import Plan

# NVML reports a little less than the marketing size on some boards; accept 3% below the profile.
MEMORY_TOLERANCE = 0.97


def least_memory(gpus: list[GpuInfo]) -> float | None:
    """The smallest memory among GPUs whose memory is known; None when none is."""
    known = [g.memory_gib for g in gpus if g.memory_gib is not None]
    return min(known) if known else None


def matched_name(profile: Profile, gpu_name: str) -> str | None:
    """The GPU-table key of `gpu_name` when the profile runs on that GPU, else None."""
    gpu = profile.hardware.gpu
    return next((m for m in gpu.models if entry_matches(m, gpu_name)), None) if gpu else None


@dataclass(frozen=True)
class Choice:
    profile: Profile | None
    reason: str | None  # None when the operator named the profile
    layout: Layout | None = None  # set when auto computed the profile for this host (not a saved one)


def choose_profile(name: str, gpus: list[GpuInfo]) -> tuple[Profile | None, str | None]:
    """(profile, why it was picked); the reason is None when the operator named the profile."""
    choice = choose(name, gpus)
    return choice.profile, choice.reason


def choose(name: str, gpus: list[GpuInfo]) -> Choice:
    """The profile for `name` on these GPUs; for auto, the one that uses the host.

    Among saved profiles whose GPU matches: one whose plan fits, then the most GPUs, then the first by name. When the GPU table knows the GPU and the layout computed
    for the whole host (`profiles new`'s) serves more than that profile, auto takes the computed one: 8x H200
    get 8 replicas, not gpu96 on one GPU; one H200 gets 32 running requests and 285,608 KV tokens, not seed
    000's caps (4 and 40,960). `up` saves it as an operator profile before it starts it, and finds it saved
    the next time. `--profile gpu96` is seed 000 as published."""
    if name != "auto":
        return Choice(load_profile(name), None)
    profiles = [load_profile(n) for n in profile_names()]
    if not gpus:
        cpu = [p for p in profiles if p.hardware.gpu is None]
        if cpu:
            return Choice(cpu[0], f"auto picked {cpu[0].name!r}: no GPU detected and it is the profile that needs none")
        return Choice(None, "auto: no GPU detected and no CPU profile exists")
    name0, count, memory = gpus[0].name, len(gpus), least_memory(gpus)
    if memory is None:
        raise UserError(f"--profile auto: NVML could not read the memory of {count}x {name0}; pass --profile NAME")
    candidates = []
    for order, p in enumerate(profiles):
        gpu = p.hardware.gpu
        matched = matched_name(p, name0)
        if gpu is None or gpu.count > count or matched is None or memory < gpu.memory_gib * MEMORY_TOLERANCE:
            continue
        candidates.append(Candidate(_plan(p, memory, count), gpu.count, -order, p, matched))
    host = host_layout(name0, count)
    ranked = sorted(candidates, key=lambda c: (c.fits, c.uses, c.order), reverse=True)
    # A saved profile that serves as much as the computed layout (`up` saved it the last time) comes first.
    best = next((c for c in ranked if host and c.fits and c.serves_as_much(host)), ranked[0] if ranked else None)
    if host is not None and (best is None or not best.fits or not best.serves_as_much(host)):
        used = host.count - host.idle
        idle = (f"; {host.idle} GPU(s) stay idle ({count} is not a multiple of tp {host.tp})" if host.idle else "")
        return Choice(host.profile, f"auto computed {host.profile.name!r} for {count}x {name0}: {host.replicas} "
                      f"replica(s) x tp {host.tp}, {host.running} request(s) at once, {_host_kv(host):,} KV tokens, "
                      f"uses {used} of {count} GPU(s){idle}{best.instead(host) if best else ''} (`ornith-stack "
                      f"profiles new {host.profile.name} --gpu {host.gpu.key} --count {count}` writes it; `up` "
                      "saves it)", host)
    if best is None:
        known = ", ".join(p.name for p in profiles if p.hardware.gpu)
        raise UserError(f"--profile auto: no profile matches {count}x {name0} ({memory:g} GiB); "
                        f"{computed_offer(name0, count)}pass --profile NAME (GPU profiles: {known})")
    chosen, uses = best.profile, best.uses
    verdict = "its plan fits" if best.fits else "no matching profile's plan fits; this one uses the most GPUs"
    idle = f"; {count - uses} GPU(s) stay idle{_describe_offer(name0, count, gpus[0])}" if uses < count else ""
    serves = f", {best.running} request(s) at once, {best.kv_tokens:,} KV tokens" if best.fits else ""
    return Choice(chosen, f"auto picked {chosen.name!r}: {count}x {name0} ({memory:g} GiB) is {best.matched!r} in "
                  f"the GPU table, it uses {uses} GPU(s){serves} and {verdict}{idle}")


@dataclass(frozen=True)
class Candidate:
    """A saved profile whose GPU matches the host, and what its plan serves there (over all its replicas)."""

    plan: Plan | None  # None: the planner refused its request
    uses: int  # GPUs
    order: int  # minus its place by name: the first name wins a tie
    profile: Profile
    matched: str  # the GPU-table key the host's GPU matched

    @property
    def fits(self) -> bool:
        # An unknown verdict (a guessed draft shape) found no problem: it counts as fitting here.
        return self.plan is not None and not self.plan.problems

    @property
    def running(self) -> int:
        """Requests served at once: the engine's running-request limit (SGLang), else the KV pool's
        concurrency at the full context (vLLM), times the replicas."""
        if self.plan is None:
            return 0
        limit = self.plan.engine_details.get("max_running_requests")
        per_replica = limit if isinstance(limit, int) else int(self.plan.max_concurrency)
        return per_replica * self.profile.serve.replicas

    @property
    def kv_tokens(self) -> int:
        return self.plan.kv_cache_tokens * self.profile.serve.replicas if self.plan else 0

    def serves_as_much(self, host: Layout) -> bool:
        """Uses the host as well as the computed layout: as many GPUs and, for the same model, as many
        requests at once and as many KV tokens (a seed's caps on a larger card serve fewer of one or the
        other). Another model (seed 003's on a GB10) is compared by GPUs only: it is not the same service."""
        if self.uses < host.count - host.idle:
            return False
        same_model = self.profile.model.repo == host.profile.model.repo
        return not same_model or (self.running >= host.running and self.kv_tokens >= _host_kv(host))

    def instead(self, host: Layout) -> str:
        if self.uses < host.count - host.idle:
            return f"; profile {self.profile.name!r} would use {self.uses}"
        if not self.fits:
            return f"; profile {self.profile.name!r} does not fit"
        return (f"; profile {self.profile.name!r} would serve {self.running} request(s) at once with "
                f"{self.kv_tokens:,} KV tokens (its fixed caps)")


def _host_kv(host: Layout) -> int:
    return host.plan.kv_cache_tokens * host.replicas


def host_layout(gpu_name: str, count: int) -> Layout | None:
    """The default recipe laid out over every GPU of the host, as `profiles new` computes it; None when
    the table lacks the GPU or nothing starts on it."""
    gpu = identify(gpu_name)
    if gpu is None:
        return None
    try:
        return compute_layout(DEFAULT_RECIPE, gpu, min(count, gpu.per_host), f"{gpu.key}x{count}")
    except UserError:
        return None


def _describe_offer(gpu_name: str, count: int, first: GpuInfo) -> str:
    """For a GPU the table lacks: the `profiles new` line that describes it and uses every GPU."""
    if identify(gpu_name) is not None or first.memory_gib is None:
        return ""
    return (f": `ornith-stack profiles new host --gpu {shlex.quote(gpu_name)} --memory-gib {first.memory_gib:g} "
            f"--compute-capability {first.compute_capability} --count {count}` computes a layout that uses them")


def computed_offer(gpu_name: str, count: int, recipe_key: str = DEFAULT_RECIPE) -> str:
    """The `profiles new` command that computes a profile of `recipe_key` for these GPUs, when the GPU table
    knows them."""
    gpu = identify(gpu_name)
    if gpu is None:
        return ""
    name = f"{gpu.key}x{count}"
    try:
        layout = compute_layout(recipe_key, gpu, count, name)
    except UserError as exc:
        return f"a computed profile does not fit either ({exc}); "
    model = "" if recipe_key == DEFAULT_RECIPE else f" --model {recipe_key}"
    return (f"a computed profile fits ({layout.replicas} replica(s) x tp {layout.tp}): run `ornith-stack profiles "
            f"new {name} --gpu {gpu.key} --count {count}{model}`, then --profile {name}; or ")


def _plan(profile: Profile, memory: float, count: int) -> Plan | None:
    try:
        return plan_request(request_for_profile(profile, gpu_memory_gib=memory, gpu_count=count))
    except UserError:
        return None
