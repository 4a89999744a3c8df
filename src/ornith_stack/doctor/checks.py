"""The checks: GPUs against the profile, the driver against the image, the NVSwitch fabric, the
checkpoint, the DFlash mask row, and the plan on the GPUs found. Observation only: the arithmetic
lives in `ornith_stack.planner`, engine specifics in the engine adapter."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ornith_stack.cuda_requirement import version_tuple
from ornith_stack.doctor import gpu as gpu_probe
from ornith_stack.doctor.autoselect import (
    MEMORY_TOLERANCE,
    choose,
    computed_offer,
    least_memory,
    matched_name,
)
from ornith_stack.doctor.checkpoint import (
    CONFIG,
    Checkpoint,
    embedding_tensor,
    is_mtp,
    is_visual,
    read_checkpoint,
    row_is_zero,
)
from ornith_stack.doctor.gpu import CUDA_ERROR_SYSTEM_NOT_READY, GpuInfo, NoGpu
from ornith_stack.doctor.report import Report
from ornith_stack.engines import ServeSettings, adapter_for
from ornith_stack.errors import UserError
from ornith_stack.gpus import identify
from ornith_stack.planner import GIB, load_shape, plan_request, request_for_profile
from ornith_stack.planner.layout import GEFORCE_NCCL_ENV, recipe_of
from ornith_stack.profiles.model import Profile
from ornith_stack.reading import read_json_object
from ornith_stack.sizing.engine_memory import SLACK_GIB, idle_used_gib
from ornith_stack.sizing.shapes import VisionShape, shape_from_config

MASK_EMBEDDING = "mask_embedding.safetensors"
# Seed 004: the DFlash 2 drafter reads the target's embedding of its mask token, id 248077.
DEFAULT_MASK_TOKEN_ID = 248077
# config.json key where `ornith-stack tiny-model` writes its mask token id (the tiny vocabulary is small).
TINY_MASK_TOKEN_ID_KEY = "ornith_mask_token_id"
FP8_MIN_CC = (9, 0)


@dataclass(frozen=True)
class Options:
    profile: str = "auto"
    weights: Path | None = None
    draft_weights: Path | None = None
    mask_token_id: int | None = None
    allow_no_gpu: bool = False
    # Run inside one replica's container or pod (compose and Helm set ORNITH_REPLICA there): it sees its
    # replica's tp GPUs. Otherwise the doctor looks at the host, which must hold every replica's GPUs.
    replica_only: bool = False


def diagnose(opts: Options, gpus: list[GpuInfo] | None = None, gpu_error: str | None = None) -> Report:
    """Run every check. `gpus`/`gpu_error` default to what `probe_gpus` finds on this machine."""
    if opts.mask_token_id is not None and opts.mask_token_id < 0:
        raise UserError(f"--mask-token-id {opts.mask_token_id}: a token id is 0 or more")
    if gpus is None and gpu_error is None:
        try:
            gpus = gpu_probe.probe_gpus()
        except NoGpu as exc:
            gpu_error = str(exc)
    gpus = gpus or []
    choice = choose(opts.profile, gpus)
    profile, reason = choice.profile, choice.reason
    report = Report(profile.name if profile else None, reason, gpus, computed=choice.layout)
    if reason:
        report.add("ok", "profile", reason)
    settings = adapter_for(profile).settings(profile) if profile else ServeSettings()
    _check_gpus(report, profile, gpus, gpu_error, opts.allow_no_gpu, opts.replica_only)
    if gpus and profile:
        _check_driver(report, profile, gpus[0].driver_version, gpus[0].brand)
    _check_fabric(report, gpus)
    _check_peer_to_peer(report, profile, gpus)
    ckpt = _check_checkpoint(report, profile, settings, opts)
    _check_draft(report, settings, opts, ckpt)
    _check_plan(report, profile, settings, gpus, ckpt)
    return report


def _check_gpus(report: Report, profile: Profile | None, gpus: list[GpuInfo], error: str | None,
                allow_no_gpu: bool, replica_only: bool = False) -> None:
    needed = profile.hardware.gpu if profile else None
    if not gpus:
        if needed is None:
            report.add("ok", "gpu", f"none detected; profile {report.profile!r} runs without a GPU")
        elif allow_no_gpu:
            report.add("warn", "gpu", f"no GPU detected ({error}); --allow-no-gpu: planning for the "
                                      f"profile's {needed.count}x {needed.memory_gib:g} GiB instead")
        else:
            report.add("problem", "gpu", f"no GPU detected ({error}); profile {report.profile!r} needs "
                                         f"{needed.count}x {needed.model}")
        return
    for g in gpus:
        memory = "memory unknown" if g.memory_gib is None else f"{g.memory_gib:g} GiB"
        source = "" if g.memory_source == gpu_probe.NVML_MEMORY else f" from {g.memory_source}"
        report.add("ok", "gpu", f"#{g.index} {g.name}, {memory}{source}, compute capability "
                                f"{g.compute_capability}, driver {g.driver_version}")
        for failure in g.unanswered:
            report.add("warn", "nvml", f"#{g.index} did not answer {failure}")
    if needed is None or profile is None:
        return
    per_engine = profile.gpus_per_engine
    if replica_only and len(gpus) < per_engine:
        report.add("problem", "gpu count", f"{len(gpus)} GPU(s) visible to this replica, profile "
                                           f"{report.profile!r} runs each replica on {per_engine}")
    elif not replica_only and len(gpus) < profile.gpu_count:
        layout = (f"{profile.serve.replicas} replicas x tp {per_engine} = {profile.gpu_count}"
                  if profile.serve.replicas > 1 else f"tp {per_engine}")
        offer = computed_offer(gpus[0].name, len(gpus), recipe_of(profile)).removesuffix("; or ").removesuffix("; ") or \
            "a profile for this host (`ornith-stack profiles new`)"
        report.add("problem", "gpu count", f"{len(gpus)} GPU(s) on this host, profile {report.profile!r} runs "
                                           f"{layout}; fix: {offer}")
    for g in gpus[:per_engine]:
        if g.memory_gib is None:
            report.add("problem", "gpu memory", f"#{g.index}: NVML could not read its memory; profile "
                                                f"{report.profile!r} expects {needed.memory_gib:g} GiB")
        elif g.memory_gib < needed.memory_gib * MEMORY_TOLERANCE:
            report.add("problem", "gpu memory", f"#{g.index} has {g.memory_gib:g} GiB, profile "
                                                f"{report.profile!r} expects {needed.memory_gib:g} GiB")
    if matched_name(profile, gpus[0].name) is None:
        report.add("warn", "gpu model", f"{gpus[0].name} is not one of the profile's GPUs "
                                        f"({', '.join(needed.models)}); the plan below uses its real memory")
    if profile.model.shape:
        shape = load_shape(profile.model.shape)
        cc = version_tuple(gpus[0].compute_capability)
        if shape.quantization and "fp8" in shape.quantization and cc and cc < FP8_MIN_CC:
            report.add("problem", "compute capability", f"the FP8 MoE kernels need sm90+, "
                                                        f"this GPU is sm{gpus[0].compute_capability.replace('.', '')}")


def _check_driver(report: Report, profile: Profile, driver: str, brand: str | None) -> None:
    """The driver (and the GPU's brand) against what the engine image's CUDA base declares
    (NVIDIA_REQUIRE_CUDA)."""
    requirement = profile.engine.cuda_requirement
    if requirement is None:
        return
    if not version_tuple(driver):
        report.add("warn", "driver", f"version {driver!r} unknown; image {profile.engine.image} needs "
                                     f">= {requirement.floor}")
        return
    verdict = requirement.check(driver, brand)
    on = f" on brand {brand}" if brand else ""
    if verdict.ok:
        report.add("ok", "driver", f"{driver}{on} runs {profile.engine.image} (floor {requirement.floor}); "
                                   f"matched {verdict.rule}")
    else:
        report.add("problem", "driver", f"{driver} is {verdict.rule}: image {profile.engine.image} needs "
                                        f"driver >= {requirement.floor} (install the 580 branch)")


def _check_fabric(report: Report, gpus: list[GpuInfo]) -> None:
    """HGX boards: NVSwitches route NVLink only once nvidia-fabricmanager has set the fabric up."""
    fabric = [g for g in gpus if g.nvswitch or g.fabric_state is not None]
    if not fabric:
        return
    branch = fabric[0].driver_branch
    fix = (f"install and start nvidia-fabricmanager of driver branch {branch} (the same branch as the driver; "
           f"e.g. apt install nvidia-fabricmanager-{branch} && systemctl enable --now nvidia-fabricmanager)")
    states = sorted({g.fabric_state for g in fabric if g.fabric_state is not None})
    if states == ["completed"]:
        report.add("ok", "fabric", f"NVSwitch fabric registered for {len(fabric)} GPU(s) (state completed)")
    elif states:
        report.add("problem", "fabric", f"NVSwitch fabric state {', '.join(states)}: CUDA fails with error 802 "
                                        f"until the fabric manager has registered every GPU; fix: {fix}")
    else:
        _check_fabric_through_cuda(report, branch, fix)


def _check_fabric_through_cuda(report: Report, branch: str, fix: str) -> None:
    """NVSwitch links but no fabric state in NVML (GPUs before Hopper, or a VM whose host runs the fabric
    manager): whether CUDA starts says whether the fabric is up."""
    error = gpu_probe.cuda_init_error()
    if error == CUDA_ERROR_SYSTEM_NOT_READY:
        report.add("problem", "fabric", f"GPUs linked through NVSwitches and CUDA answers error 802 (system not "
                                        f"ready): the fabric manager is not running; fix: {fix}")
    elif error == 0:
        report.add("ok", "fabric", "GPUs linked through NVSwitches; NVML shows no fabric state and CUDA starts")
    else:
        why = "libcuda cannot be loaded here" if error is None else f"cuInit answers {error}"
        report.add("warn", "fabric", f"GPUs linked through NVSwitches; NVML shows no fabric state and {why}: "
                                     f"CUDA fails with error 802 unless nvidia-fabricmanager of driver branch "
                                     f"{branch} runs")


def _check_peer_to_peer(report: Report, profile: Profile | None, gpus: list[GpuInfo]) -> None:
    """GeForce boards with tp > 1: NCCL must not take its peer-to-peer path (GEFORCE_NCCL_ENV)."""
    if profile is None or profile.gpus_per_engine < 2 or not gpus:
        return
    if gpus[0].brand != "geforce" and "geforce" not in gpus[0].name.lower():
        return
    missing = {k: v for k, v in GEFORCE_NCCL_ENV.items() if profile.serve.env.get(k) != v}
    if missing:
        setting = ", ".join(f"serve.env.{k}: '{v}'" for k, v in missing.items())
        report.add("warn", "nccl", f"{gpus[0].name} at tp {profile.gpus_per_engine}: GeForce boards have no "
                                   f"peer-to-peer over PCIe and NCCL's P2P all-reduce hangs on them; fix: set "
                                   f"{setting} in profile {profile.name!r} (`profiles new` does)")
    else:
        report.add("ok", "nccl", f"{gpus[0].name} at tp {profile.gpus_per_engine}: NCCL_P2P_DISABLE=1, NCCL goes "
                                 "through host shared memory")


def _check_checkpoint(report: Report, profile: Profile | None, settings: ServeSettings,
                      opts: Options) -> Checkpoint | None:
    if opts.weights is None:
        return None
    ckpt = read_checkpoint(opts.weights)  # a malformed checkpoint is a UserError: one line, exit 2
    report.add("ok", "checkpoint", f"{len(ckpt.tensors):,} tensors, {ckpt.total_bytes / GIB:.2f} GiB in {ckpt.path}")
    _check_mtp(report, settings, ckpt)
    _check_vision(report, profile, settings, ckpt)
    if profile and profile.model.shape:
        predicted = load_shape(profile.model.shape).checkpoint_bytes()
        if abs(ckpt.total_bytes - predicted) > 0.05 * predicted:
            report.add("warn", "checkpoint size", f"{ckpt.total_bytes / GIB:.2f} GiB on disk, the profile's "
                                                  f"shape {profile.model.shape!r} predicts {predicted / GIB:.2f} GiB: "
                                                  "is this the model the profile plans for?")
    return ckpt


def _check_mtp(report: Report, settings: ServeSettings, ckpt: Checkpoint) -> None:
    declared = ckpt.text_config.get("mtp_num_hidden_layers") or 0
    mtp = [n for n in ckpt.tensors if is_mtp(n)]
    if declared and not mtp:
        report.add("problem" if settings.speculative_method == "mtp" else "warn", "mtp",
                   f"config declares mtp_num_hidden_layers {declared} but the index has no mtp.* tensors: "
                   "no free speculative draft (method 'mtp' would find no weights)")
    elif mtp:
        report.add("ok", "mtp", f"{len(mtp)} mtp.* tensors present (mtp_num_hidden_layers {declared})")


def _check_vision(report: Report, profile: Profile | None, settings: ServeSettings, ckpt: Checkpoint) -> None:
    visual = sum(is_visual(n) for n in ckpt.tensors)
    if not isinstance(ckpt.config.get("vision_config"), dict):
        if visual:
            report.add("warn", "vision", f"{visual} visual.* tensors but no vision_config in config.json")
        return
    try:
        shape = shape_from_config(ckpt.config, source=str(ckpt.path / CONFIG))
    except UserError as exc:
        report.add("problem", "config", str(exc))
        return
    expected = shape.vision.tensor_count if isinstance(shape.vision, VisionShape) else 0
    if visual == expected:
        report.add("ok", "vision", f"{visual} visual.* tensors: the vision tower is complete")
    elif visual == 0:
        flag = adapter_for(profile).language_only_flag if profile else None
        if settings.language_model_only:
            advice = f"; the profile passes --{flag}"
        else:
            advice = f"; serve it with --{flag}" if flag else "; this engine cannot serve it without the tower"
        report.add("ok" if settings.language_model_only else "problem", "vision",
                   f"config has a vision_config ({expected} visual.* tensors expected) but the checkpoint "
                   f"has none: a language-only release{advice}")
    else:
        report.add("problem", "vision", f"{visual} of {expected} visual.* tensors: the vision tower is "
                                        "incomplete (the engine will fail on uninitialised visual.* weights)")


def _mask_token_id(opts: Options, ckpt: Checkpoint, draft_config: dict[str, Any] | None) -> int:
    if opts.mask_token_id is not None:
        return opts.mask_token_id
    dflash = (draft_config or {}).get("dflash_config") or {}
    if isinstance(dflash, dict) and isinstance(dflash.get("mask_token_id"), int):
        return int(dflash["mask_token_id"])
    if isinstance(ckpt.config.get(TINY_MASK_TOKEN_ID_KEY), int):
        return int(ckpt.config[TINY_MASK_TOKEN_ID_KEY])
    return DEFAULT_MASK_TOKEN_ID


def _check_draft(report: Report, settings: ServeSettings, opts: Options, ckpt: Checkpoint | None) -> None:
    """DFlash: is the target's mask-token row zeroed (seed 004), and is mask_embedding.safetensors there?"""
    draft_config = None
    has_mask_file = None
    if opts.draft_weights is not None:
        draft_config = read_json_object(opts.draft_weights / CONFIG)
        has_mask_file = (opts.draft_weights / MASK_EMBEDDING).is_file()
        report.add("ok" if has_mask_file else "warn", "draft",
                   f"{MASK_EMBEDDING} {'present' if has_mask_file else 'absent'} in {opts.draft_weights}")
    relevant = (settings.speculative_method == "dflash" or opts.draft_weights is not None
                or opts.mask_token_id is not None or (ckpt is not None and TINY_MASK_TOKEN_ID_KEY in ckpt.config))
    if ckpt is None or not relevant:
        return
    mask_id = _mask_token_id(opts, ckpt, draft_config)
    embedding = embedding_tensor(ckpt)
    if embedding is None:
        report.add("problem", "mask token", "no embed_tokens.weight tensor in the checkpoint")
        return
    if not 0 <= mask_id < embedding.shape[0]:
        report.add("problem", "mask token", f"id {mask_id} is outside the embedding's {embedding.shape[0]} rows")
        return
    zero = row_is_zero(embedding, mask_id)
    if not zero:
        report.add("ok", "mask token", f"embedding row {mask_id} is non-zero")
    elif has_mask_file:
        report.add("warn", "mask token", f"embedding row {mask_id} is all zeros (a GGUF-style conversion); "
                                         f"the draft's {MASK_EMBEDDING} holds the exact row: make the engine read it")
    else:
        report.add("problem", "mask token", f"embedding row {mask_id} is all zeros: DFlash acceptance roughly "
                                            f"halves; use a checkpoint with the row intact or the draft's "
                                            f"{MASK_EMBEDDING}")


def least_free(gpus: list[GpuInfo]) -> float | None:
    """The least free memory among the GPUs (what the most loaded one leaves an engine); None when a
    GPU's free memory is not known (the planner then takes the total). On unified memory the reading is
    what the host can still give (MemAvailable + SwapFree), the GPU's free memory: SGLang sizes from it."""
    free = [g.memory_gib if unified(g) else g.free_gib for g in gpus]
    return None if not free or None in free else min(f for f in free if f is not None)


def unified(gpu: GpuInfo) -> bool:
    """The GPU's memory is the host's (the probe read /proc/meminfo: NVML has none for it)."""
    return gpu.memory_source == gpu_probe.HOST_MEMORY


def _check_idle(report: Report, gpus: list[GpuInfo]) -> None:
    """Memory other processes hold beyond what NVML shows on an idle card of this kind: the computed caps keep
    SLACK_GIB for it (sizing/engine_memory.py), the plan below counts what is observed."""
    busiest = min((g for g in gpus if g.free_gib is not None and g.memory_gib is not None),
                  key=lambda g: g.free_gib or 0.0, default=None)
    if busiest is None or busiest.memory_gib is None or busiest.free_gib is None:
        return
    idle, recorded = idle_used_gib(busiest.name, busiest.driver_version)
    used = busiest.memory_gib - busiest.free_gib
    beyond = used - idle
    if beyond <= 0.005:
        return
    source = "recorded on this card" if recorded else "the H200's, measured"
    share = "within" if beyond <= SLACK_GIB else "beyond"
    report.add("warn", "gpu memory", f"#{busiest.index} has {used * 1024:,.0f} MiB in use, {beyond * 1024:,.0f} MiB "
                                     f"more than an idle {busiest.name} ({idle * 1024:,.0f} MiB, {source}): {share} "
                                     f"the {SLACK_GIB * 1024:.0f} MiB slack computed profiles keep; the plan counts it")


def _check_plan(report: Report, profile: Profile | None, settings: ServeSettings, gpus: list[GpuInfo],
                ckpt: Checkpoint | None) -> None:
    if profile is None or profile.hardware.gpu is None or profile.model.shape is None:
        return
    memory = least_memory(gpus)
    free = least_free(gpus) if memory else None
    weights = None
    if ckpt is not None:
        language_only = settings.language_model_only
        weights = ckpt.bytes_where(lambda n: not is_mtp(n) and not (language_only and is_visual(n))) or None
    try:
        # Too few GPUs is reported above; plan with the profile's count so the memory verdict still shows.
        count = len(gpus) if len(gpus) >= profile.gpus_per_engine else None
        # The real GPU's compute capability: the plan refuses flags it cannot run (engines/capabilities.py).
        capability = gpus[0].compute_capability if gpus and gpus[0].compute_capability != "unknown" else None
        # On unified memory the reading is what the host can still give (no driver share taken off it).
        host: dict[str, Any] = {"unified_memory": True} if gpus and unified(gpus[0]) else {}
        # A fix names no more GPUs than a host of the detected card holds (a DGX Spark one: never "--tp 2").
        card = identify(gpus[0].name) if gpus else None
        if card is not None:
            host["gpus_per_host"] = card.per_host
        plan = plan_request(request_for_profile(profile, gpu_memory_gib=memory, gpu_count=count,
                                                weights_bytes=weights, free_memory_gib=free,
                                                compute_capability=capability, **host))
    except UserError as exc:
        report.add("problem", "plan", str(exc))
        return
    report.plan = plan
    _check_idle(report, gpus)
    where = f"{len(gpus)}x {memory:g} GiB" if memory else f"the profile's {profile.hardware.gpu.memory_gib:g} GiB"
    if free is not None and gpus and unified(gpus[0]):
        where += f" (planned on the {free:g} GiB the host can still give now: MemAvailable + SwapFree)"
    elif free is not None:
        where += f" (planned on the {free:g} GiB NVML reports free now, the least of the GPUs)"
    elif memory:
        where += " (planned on the total: NVML gave no free memory)"
    if plan.verdict == "unknown":
        report.add("warn", "plan", f"no problem found on {where}, but the verdict is unknown: "
                                   + "; ".join(plan.unknowns))
    if plan.fits:
        report.add("ok", "plan", f"fits on {where}: weights {plan.weights_bytes / GIB:.2f} GiB/GPU, "
                                 f"KV {plan.kv_cache_tokens:,} tokens, {plan.max_concurrency:.2f}x at "
                                 f"{plan.max_model_len:,}")
    for warning in plan.warnings:
        report.add("warn", "plan (clamped)", warning)
    for problem in plan.problems:
        report.add("problem", f"plan ({problem.component})", f"{problem.message}; fix: {problem.fix}")
    if plan.suggestion:
        report.add("warn", "plan", f"smallest change that fits: {plan.suggestion}")
