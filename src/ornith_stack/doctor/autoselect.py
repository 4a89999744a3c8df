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

    Among saved profiles whose GPU matches: one whose plan fits, then the most GPUs, then the first by
    name. When the GPU table knows the GPU and the layout computed for the whole host (`profiles new`'s)
    uses more of its GPUs than that profile, auto takes the computed one: 8x H200 get 8 replicas, not
    gpu96 on one GPU. `up` saves it as an operator profile before it starts it."""
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
        candidates.append((_plan_fits(p, memory, count), gpu.count, -order, p, matched))
    host = host_layout(name0, count)
    best = max(candidates, key=lambda c: (c[0], c[1], c[2])) if candidates else None
    if host is not None and (best is None or not best[0] or best[1] < host.count - host.idle):
        used = host.count - host.idle
        instead = f"; profile {best[3].name!r} would use {best[1]}" if best else ""
        idle = (f"; {host.idle} GPU(s) stay idle ({count} is not a multiple of tp {host.tp})" if host.idle else "")
        return Choice(host.profile, f"auto computed {host.profile.name!r} for {count}x {name0}: {host.replicas} "
                      f"replica(s) x tp {host.tp}, {host.running} requests at once, uses {used} of {count} GPU(s)"
                      f"{idle}{instead} (`ornith-stack profiles new {host.profile.name} --gpu {host.gpu.key} "
                      f"--count {count}` writes it; `up` saves it)", host)
    if best is None:
        known = ", ".join(p.name for p in profiles if p.hardware.gpu)
        raise UserError(f"--profile auto: no profile matches {count}x {name0} ({memory:g} GiB); "
                        f"{computed_offer(name0, count)}pass --profile NAME (GPU profiles: {known})")
    fits, uses, _, chosen, matched = best
    verdict = "its plan fits" if fits else "no matching profile's plan fits; this one uses the most GPUs"
    idle = f"; {count - uses} GPU(s) stay idle{_describe_offer(name0, count, gpus[0])}" if uses < count else ""
    return Choice(chosen, f"auto picked {chosen.name!r}: {count}x {name0} ({memory:g} GiB) is {matched!r} in the GPU "
                  f"table, it uses {uses} GPU(s) and {verdict}{idle}")


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


def computed_offer(gpu_name: str, count: int) -> str:
    """The `profiles new` command that computes a profile for these GPUs, when the GPU table knows them."""
    gpu = identify(gpu_name)
    if gpu is None:
        return ""
    name = f"{gpu.key}x{count}"
    try:
        layout = compute_layout(DEFAULT_RECIPE, gpu, count, name)
    except UserError as exc:
        return f"a computed profile does not fit either ({exc}); "
    return (f"a computed profile fits ({layout.replicas} replica(s) x tp {layout.tp}): run `ornith-stack profiles "
            f"new {name} --gpu {gpu.key} --count {count}`, then --profile {name}; or ")


def _plan_fits(profile: Profile, memory: float, count: int) -> bool:
    try:
        # An unknown verdict (a guessed draft shape) found no problem: it counts as fitting here.
        return not plan_request(request_for_profile(profile, gpu_memory_gib=memory, gpu_count=count)).problems
    except UserError:
        return False
