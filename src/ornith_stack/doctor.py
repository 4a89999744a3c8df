"""Preflight doctor: observe the machine and the checkpoint, then ask the planner.

Observation only: GPUs through NVML (`nvidia-ml-py`), the checkpoint through its `config.json`,
`model.safetensors.index.json` and the safetensors headers (read here with the standard library: an
8-byte little-endian header length, a JSON header, then raw tensor bytes). Every finding is one line;
`Report.ready` is False when any finding is a problem. The arithmetic lives in `ornith_stack.planner`.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError
from ornith_stack.planner import GIB, Plan, load_shape, plan_request, request_for_profile
from ornith_stack.planner.shapes import VisionShape, read_json_object, shape_from_config
from ornith_stack.profiles import load_profile, profile_names
from ornith_stack.profiles.model import Profile

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
CONFIG = "config.json"
MASK_EMBEDDING = "mask_embedding.safetensors"
# Seed 004: the DFlash 2 drafter reads the target's embedding of its mask token, id 248077.
DEFAULT_MASK_TOKEN_ID = 248077
# config.json key where `ornith-stack tiny-model` writes its mask token id (the tiny vocabulary is small).
TINY_MASK_TOKEN_ID_KEY = "ornith_mask_token_id"
# NVML reports a little less than the marketing size on some boards; accept 3% below the profile.
MEMORY_TOLERANCE = 0.97
FP8_MIN_CC = (9, 0)
SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
                           "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}

Level = Literal["ok", "warn", "problem"]


@dataclass(frozen=True)
class Finding:
    level: Level
    topic: str
    message: str

    def line(self) -> str:
        tag = {"ok": "ok", "warn": "warn", "problem": "FAIL"}[self.level]
        return f"{tag:>4}  {self.topic}: {self.message}"


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    memory_gib: float
    compute_capability: str
    driver_version: str


class NoGpu(Exception):
    """No NVIDIA GPU is visible: NVML missing, no driver, or zero devices."""


@dataclass
class Report:
    profile: str | None
    profile_reason: str | None
    gpus: list[GpuInfo] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    plan: Plan | None = None

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "problem"]

    @property
    def ready(self) -> bool:
        return not self.problems

    def add(self, level: Level, topic: str, message: str) -> None:
        self.findings.append(Finding(level, topic, message))

    def to_json(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "profile": self.profile,
            "profile_reason": self.profile_reason,
            "gpus": [asdict(g) for g in self.gpus],
            "findings": [asdict(f) for f in self.findings],
            "problems": [f"{f.topic}: {f.message}" for f in self.problems],
            "plan": self.plan.to_json() if self.plan else None,
        }


# -- GPUs -------------------------------------------------------------------------------------------


def probe_gpus() -> list[GpuInfo]:
    """Every GPU NVML sees; NoGpu (never a traceback) when there is no NVML, driver or device."""
    try:
        import pynvml
    except ImportError as exc:  # the package is a dependency, but an image may lack it
        raise NoGpu(f"nvidia-ml-py is not installed ({exc})") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NoGpu(f"NVML could not start ({exc}); no NVIDIA driver or no GPU passed to this container") from None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
            gpus.append(GpuInfo(i, _text(pynvml.nvmlDeviceGetName(handle)), round(memory / GIB, 2),
                                f"{major}.{minor}", driver))
    except pynvml.NVMLError as exc:
        raise NoGpu(f"NVML query failed: {exc}") from None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    if not gpus:
        raise NoGpu("NVML reports 0 GPUs")
    return gpus


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".") if p.isdigit())


# -- checkpoint -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute byte offset of the data in `file`
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass
class Checkpoint:
    path: Path
    config: dict[str, Any]
    tensors: dict[str, Tensor]
    index_total_size: int | None

    @property
    def total_bytes(self) -> int:
        return self.index_total_size or sum(t.nbytes for t in self.tensors.values())

    def bytes_where(self, predicate: Any) -> int:
        return sum(t.nbytes for t in self.tensors.values() if predicate(t.name))


def read_safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """(header, data start) of one safetensors file; a malformed file is a UserError naming it."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise UserError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (length,) = struct.unpack("<Q", raw)
            if length > 100 * (1 << 20):
                raise UserError(f"{path}: not a safetensors file (header length {length} is implausible)")
            header = json.loads(fh.read(length))
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise UserError(f"{path}: safetensors header is not a JSON object")
    return header, 8 + length


def _tensors_of(path: Path) -> dict[str, Tensor]:
    header, base = read_safetensors_header(path)
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            tensors[name] = Tensor(name, str(info["dtype"]), tuple(info["shape"]), path, base + begin, base + end)
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{path}: tensor {name!r} lacks dtype/shape/data_offsets in the header") from None
    return tensors


def read_checkpoint(path: Path) -> Checkpoint:
    """config.json + index (or a single model.safetensors) + every shard's header."""
    if not path.is_dir():
        raise UserError(f"--weights {path}: not a directory")
    config = read_json_object(path / CONFIG)
    index_path = path / INDEX
    if index_path.is_file():
        index = read_json_object(index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise UserError(f"{index_path}: key 'weight_map' is missing or empty")
        total = (index.get("metadata") or {}).get("total_size")
        if total is not None and (not isinstance(total, int) or total <= 0):
            raise UserError(f"{index_path}: key 'metadata.total_size' must be a positive integer, got {total!r}")
        tensors: dict[str, Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = path / str(shard)
            if not shard_path.is_file():
                raise UserError(f"{index_path}: weight_map names {shard!r}, which is missing from {path}")
            tensors.update(_tensors_of(shard_path))
        missing = [n for n in weight_map if n not in tensors]
        if missing:
            raise UserError(f"{index_path}: {len(missing)} tensor(s) in weight_map are not in their shard, "
                            f"e.g. {missing[0]!r}")
        return Checkpoint(path, config, tensors, total)
    if (path / SINGLE).is_file():
        return Checkpoint(path, config, _tensors_of(path / SINGLE), None)
    raise UserError(f"{path}: neither {INDEX} nor {SINGLE} is present")


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def is_mtp(name: str) -> bool:
    return name.startswith("mtp.") or ".mtp." in name


def is_visual(name: str) -> bool:
    return "visual." in name


def row_is_zero(tensor: Tensor, row: int) -> bool:
    """Whether row `row` of a 2-D tensor is all zeros (either sign), read straight from the file."""
    width = SAFETENSORS_DTYPE_BYTES.get(tensor.dtype)
    if width is None or len(tensor.shape) != 2:
        raise UserError(f"{tensor.file}: {tensor.name} is {tensor.dtype} {list(tensor.shape)}, not a 2-D float matrix")
    row_bytes = tensor.shape[1] * width
    with tensor.file.open("rb") as fh:
        fh.seek(tensor.start + row * row_bytes)
        data = fh.read(row_bytes)
    sign_mask = {1: 0x7F, 2: 0x7FFF, 4: 0x7FFFFFFF, 8: 0x7FFFFFFFFFFFFFFF}[width]
    fmt = {1: "B", 2: "H", 4: "I", 8: "Q"}[width]
    return all(v & sign_mask == 0 for v in struct.unpack(f"<{len(data) // width}{fmt}", data))


def embedding_tensor(ckpt: Checkpoint) -> Tensor | None:
    return next((t for n, t in sorted(ckpt.tensors.items())
                 if n.endswith("embed_tokens.weight") and not is_mtp(n)), None)


# -- the checks -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    profile: str = "auto"
    weights: Path | None = None
    draft_weights: Path | None = None
    mask_token_id: int | None = None
    allow_no_gpu: bool = False


def diagnose(opts: Options, gpus: list[GpuInfo] | None = None, gpu_error: str | None = None) -> Report:
    """Run every check. `gpus`/`gpu_error` come from `probe_gpus` (injected by tests)."""
    if gpus is None and gpu_error is None:
        try:
            gpus = probe_gpus()
        except NoGpu as exc:
            gpu_error = str(exc)
    gpus = gpus or []
    profile, reason = _choose_profile(opts.profile, gpus)
    report = Report(profile.name if profile else None, reason, gpus)
    if reason:
        report.add("ok", "profile", reason)
    _check_gpus(report, profile, gpus, gpu_error, opts.allow_no_gpu)
    ckpt = _check_checkpoint(report, profile, opts)
    _check_draft(report, profile, opts, ckpt)
    _check_plan(report, profile, gpus, ckpt)
    return report


def _choose_profile(name: str, gpus: list[GpuInfo]) -> tuple[Profile | None, str | None]:
    if name != "auto":
        return load_profile(name), None
    profiles = [load_profile(n) for n in profile_names()]
    if not gpus:
        cpu = [p for p in profiles if p.hardware.gpu is None]
        if cpu:
            return cpu[0], f"auto picked {cpu[0].name!r}: no GPU detected and it is the profile that needs none"
        return None, "auto: no GPU detected and no CPU profile exists"
    name0, count = gpus[0].name, len(gpus)
    memory = min(g.memory_gib for g in gpus)
    candidates = []
    for p in profiles:
        gpu = p.hardware.gpu
        if gpu is None or gpu.count > count:
            continue
        matched = next((n for n in gpu.nvml_names if n.lower() in name0.lower()), None)
        if matched is None or memory < gpu.memory_gib * MEMORY_TOLERANCE:
            continue
        fits = _plan_fits(p, memory, count)
        candidates.append((fits, gpu.count, p, matched, fits))
    if not candidates:
        known = ", ".join(p.name for p in profiles if p.hardware.gpu)
        raise UserError(f"--profile auto: no profile matches {count}x {name0} ({memory:g} GiB); "
                        f"pass --profile NAME (GPU profiles: {known})")
    candidates.sort(key=lambda c: (c[0], c[1]), reverse=True)
    fits, _, chosen, matched, _ = candidates[0]
    verdict = "its plan fits" if fits else "no matching profile's plan fits; this one uses the most GPUs"
    return chosen, (f"auto picked {chosen.name!r}: {count}x {name0} ({memory:g} GiB) matches NVML name "
                    f"{matched!r}, it uses {chosen.hardware.gpu.count} GPU(s) and {verdict}")


def _plan_fits(profile: Profile, memory: float, count: int) -> bool:
    try:
        return plan_request(request_for_profile(profile, gpu_memory_gib=memory, gpu_count=count)).fits
    except UserError:
        return False


def _check_gpus(report: Report, profile: Profile | None, gpus: list[GpuInfo], error: str | None,
                allow_no_gpu: bool) -> None:
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
        report.add("ok", "gpu", f"#{g.index} {g.name}, {g.memory_gib:g} GiB, compute capability "
                                f"{g.compute_capability}, driver {g.driver_version}")
    if needed is None:
        return
    if len(gpus) < needed.count:
        report.add("problem", "gpu count", f"{len(gpus)} GPU(s) visible, profile {report.profile!r} needs "
                                           f"{needed.count}")
    small = [g for g in gpus[: needed.count] if g.memory_gib < needed.memory_gib * MEMORY_TOLERANCE]
    for g in small:
        report.add("problem", "gpu memory", f"#{g.index} has {g.memory_gib:g} GiB, profile "
                                            f"{report.profile!r} expects {needed.memory_gib:g} GiB")
    if not any(n.lower() in gpus[0].name.lower() for n in needed.nvml_names):
        report.add("warn", "gpu model", f"{gpus[0].name} is not one of the profile's GPUs "
                                        f"({', '.join(needed.nvml_names)}); the plan below uses its real memory")
    minimum = profile.hardware.min_driver if profile else None
    driver = gpus[0].driver_version
    if minimum and _version_tuple(driver) < _version_tuple(minimum):
        report.add("problem", "driver", f"{driver} is older than {minimum}, which the image "
                                        f"{profile.engine.image} needs (CUDA 13 images need >= 580)")
    elif minimum:
        report.add("ok", "driver", f"{driver} >= {minimum}")
    if profile and profile.model.shape:
        shape = load_shape(profile.model.shape)
        cc = _version_tuple(gpus[0].compute_capability)
        if shape.quantization and "fp8" in shape.quantization and cc < FP8_MIN_CC:
            report.add("problem", "compute capability", f"the FP8 MoE kernels need sm90+, "
                                                        f"this GPU is sm{gpus[0].compute_capability.replace('.', '')}")


def _check_checkpoint(report: Report, profile: Profile | None, opts: Options) -> Checkpoint | None:
    if opts.weights is None:
        return None
    try:
        ckpt = read_checkpoint(opts.weights)
    except UserError as exc:
        report.add("problem", "checkpoint", str(exc))
        return None
    report.add("ok", "checkpoint", f"{len(ckpt.tensors):,} tensors, {ckpt.total_bytes / GIB:.2f} GiB in {ckpt.path}")
    _check_mtp(report, profile, ckpt)
    _check_vision(report, profile, ckpt)
    if profile and profile.model.shape:
        predicted = load_shape(profile.model.shape).checkpoint_bytes()
        if abs(ckpt.total_bytes - predicted) > 0.05 * predicted:
            report.add("warn", "checkpoint size", f"{ckpt.total_bytes / GIB:.2f} GiB on disk, the profile's "
                                                  f"shape {profile.model.shape!r} predicts {predicted / GIB:.2f} GiB: "
                                                  "is this the model the profile plans for?")
    return ckpt


def _check_mtp(report: Report, profile: Profile | None, ckpt: Checkpoint) -> None:
    declared = _text_config(ckpt.config).get("mtp_num_hidden_layers") or 0
    mtp = [n for n in ckpt.tensors if is_mtp(n)]
    uses_mtp = bool(profile) and adapter_for(profile).settings(profile).speculative_method == "mtp"
    if declared and not mtp:
        report.add("problem" if uses_mtp else "warn", "mtp",
                   f"config declares mtp_num_hidden_layers {declared} but the index has no mtp.* tensors: "
                   "no free speculative draft (method 'mtp' would find no weights)")
    elif mtp:
        report.add("ok", "mtp", f"{len(mtp)} mtp.* tensors present (mtp_num_hidden_layers {declared})")


def _check_vision(report: Report, profile: Profile | None, ckpt: Checkpoint) -> None:
    visual = sum(is_visual(n) for n in ckpt.tensors)
    vision_config = ckpt.config.get("vision_config")
    language_only = bool(profile and profile.serve.args.get("language-model-only"))
    if not isinstance(vision_config, dict):
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
        level = "ok" if language_only else "problem"
        report.add(level, "vision", f"config has a vision_config ({expected} visual.* tensors expected) but the "
                                    "checkpoint has none: a language-only release"
                                    + ("; the profile passes --language-model-only" if language_only else
                                       "; serve it with --language-model-only"))
    else:
        report.add("problem", "vision", f"{visual} of {expected} visual.* tensors: the vision tower is "
                                        "incomplete (the engine will fail on uninitialised visual.* weights)")


def _mask_token_id(opts: Options, ckpt: Checkpoint | None, draft_config: dict[str, Any] | None) -> int:
    if opts.mask_token_id is not None:
        return opts.mask_token_id
    dflash = (draft_config or {}).get("dflash_config") or {}
    if isinstance(dflash, dict) and isinstance(dflash.get("mask_token_id"), int):
        return dflash["mask_token_id"]
    if ckpt and isinstance(ckpt.config.get(TINY_MASK_TOKEN_ID_KEY), int):
        return ckpt.config[TINY_MASK_TOKEN_ID_KEY]
    return DEFAULT_MASK_TOKEN_ID


def _check_draft(report: Report, profile: Profile | None, opts: Options, ckpt: Checkpoint | None) -> None:
    """DFlash: is the target's mask-token row zeroed (seed 004), and is mask_embedding.safetensors there?"""
    method = adapter_for(profile).settings(profile).speculative_method if profile else None
    draft_config = None
    has_mask_file = None
    if opts.draft_weights is not None:
        try:
            draft_config = read_json_object(opts.draft_weights / CONFIG)
        except UserError as exc:
            report.add("problem", "draft", str(exc))
        has_mask_file = (opts.draft_weights / MASK_EMBEDDING).is_file()
        report.add("ok" if has_mask_file else "warn", "draft",
                   f"{MASK_EMBEDDING} {'present' if has_mask_file else 'absent'} in {opts.draft_weights}")
    relevant = (method == "dflash" or opts.draft_weights is not None or opts.mask_token_id is not None
                or (ckpt is not None and TINY_MASK_TOKEN_ID_KEY in ckpt.config))
    if ckpt is None or not relevant:
        return
    mask_id = _mask_token_id(opts, ckpt, draft_config)
    embedding = embedding_tensor(ckpt)
    if embedding is None:
        report.add("problem", "mask token", "no embed_tokens.weight tensor in the checkpoint")
        return
    if mask_id >= embedding.shape[0]:
        report.add("problem", "mask token", f"id {mask_id} is beyond the embedding's {embedding.shape[0]} rows")
        return
    try:
        zero = row_is_zero(embedding, mask_id)
    except (UserError, OSError) as exc:
        report.add("problem", "mask token", str(exc))
        return
    if not zero:
        report.add("ok", "mask token", f"embedding row {mask_id} is non-zero")
    elif has_mask_file:
        report.add("warn", "mask token", f"embedding row {mask_id} is all zeros (a GGUF-style conversion); "
                                         f"the draft's {MASK_EMBEDDING} holds the exact row: make the engine read it")
    else:
        report.add("problem", "mask token", f"embedding row {mask_id} is all zeros: DFlash acceptance roughly "
                                            f"halves; use a checkpoint with the row intact or the draft's "
                                            f"{MASK_EMBEDDING}")


def _check_plan(report: Report, profile: Profile | None, gpus: list[GpuInfo], ckpt: Checkpoint | None) -> None:
    if profile is None or profile.hardware.gpu is None or profile.model.shape is None:
        return
    memory = min(g.memory_gib for g in gpus) if gpus else None
    weights = None
    if ckpt is not None:
        language_only = bool(profile.serve.args.get("language-model-only"))
        weights = ckpt.bytes_where(lambda n: not is_mtp(n) and not (language_only and is_visual(n))) or None
    try:
        # Too few GPUs is reported above; plan with the profile's count so the memory verdict still shows.
        count = len(gpus) if len(gpus) >= profile.hardware.gpu.count else None
        req = request_for_profile(profile, gpu_memory_gib=memory, gpu_count=count, weights_bytes=weights)
        plan = plan_request(req)
    except UserError as exc:
        report.add("problem", "plan", str(exc))
        return
    report.plan = plan
    where = f"{len(gpus)}x {memory:g} GiB" if gpus else f"the profile's {profile.hardware.gpu.memory_gib:g} GiB"
    if plan.fits:
        report.add("ok", "plan", f"fits on {where}: weights {plan.weights_bytes / GIB:.2f} GiB/GPU, "
                                 f"KV {plan.kv_cache_tokens:,} tokens, {plan.max_concurrency:.2f}x at "
                                 f"{plan.max_model_len:,}")
    for problem in plan.problems:
        report.add("problem", f"plan ({problem.component})", f"{problem.message}; fix: {problem.fix}")
    if plan.suggestion:
        report.add("warn", "plan", f"smallest change that fits: {plan.suggestion}")
