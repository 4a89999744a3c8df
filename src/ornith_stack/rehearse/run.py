"""A rehearsal: the profile as the user runs it, with dummy weights at the shapes of a config.json.

The engine reads a model folder that holds the checkpoint's config.json (a shipped shape from sizing/configs/, or
the one given) and a tokenizer made here (tiny_model.dummy_checkpoint): no weights are downloaded or read, the
engine initialises random ones of the real shapes (its adapter's `dummy_weights_args`). Where the engine can, its
verify steps accept a simulated number of tokens (the adapter's `simulated_acceptance_env`). It is started by one
of the tuner's launchers (`--launch local`: the process `tune --launch local` starts, tune/measure.py; `--launch up`:
the compose bring-up `up` runs, tune/compose.py, the model folders in a host folder mounted as the engines' model
cache), timed to healthy, loaded by
`ornith-stack bench --suite serving` at one stream and at the running-request limit, and its log read for where it
stopped and what it sized (the adapter's `start_outcome` and `logged_sizing`), beside `plan`'s figures.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ornith_stack.bench.roofline import Roofline, roofline_from_shape
from ornith_stack.doctor import gpu as gpu_probe
from ornith_stack.doctor.gpu import GpuInfo, NoGpu, host_memory_gib
from ornith_stack.engines import adapter_for
from ornith_stack.engines.base import LoggedSizing, StartOutcome
from ornith_stack.errors import UserError
from ornith_stack.planner import plan_request, request_for_profile
from ornith_stack.profiles.model import Profile
from ornith_stack.reading import read_json_object
from ornith_stack.sizing.model import MAX_GPU_MEMORY_GIB, Plan
from ornith_stack.sizing.shapes import load_shape, resolve_config_path
from ornith_stack.tiny_model import dummy_checkpoint
from ornith_stack.tune.measure import EngineCrash, Launcher, fresh_dir, serving_runs

GIB = 1 << 30


def weights_note(profile: Profile) -> str:
    flags = " ".join(f"--{flag} {value}" for flag, value in adapter_for(profile).dummy_weights_args.items())
    return (f"no weights downloaded or read: the engine initialised random weights of the config's shapes ({flags}); "
            "the model folder holds config.json and a generated tokenizer only")


@dataclass(frozen=True)
class Question:
    """What to rehearse and how to load it."""

    profile: Profile  # the profile as the user runs it (--set applied)
    model_config: Path  # config.json whose shapes the engine builds
    draft_config: Path | None  # the draft's, when the profile names a draft
    acceptance: float | None  # simulated tokens per verification step (None: the draft's own)
    input_tokens: int = 256
    output_tokens: int = 128
    num_prompts: int | None = None  # per level; None: 2 x the level's concurrency, at least 8
    concurrency: int | None = None  # the second level; None: the engine's running-request limit
    start_timeout_s: float = 1800.0
    bench_timeout_s: float = 1800.0


@dataclass(frozen=True)
class ModelPlace:
    """Where the dummy model folders are written (`host`) and the path the engine reads that folder at (`engine`):
    the same for an engine on this machine; for compose, a folder mounted as the engines' model cache."""

    host: Path
    engine: str

    @classmethod
    def local(cls, folder: Path) -> ModelPlace:
        return cls(folder, str(folder))

    def folder(self, name: str) -> tuple[Path, str]:
        return self.host / name, f"{self.engine.rstrip('/')}/{name}"


@dataclass
class Rehearsal:
    """What the rehearsal found; `report.py` writes it."""

    question: dict[str, Any]
    started: bool = False
    healthy_s: float | None = None
    outcome: StartOutcome | None = None
    logged: LoggedSizing = field(default_factory=LoggedSizing)
    plan: Plan | None = None
    plan_note: str = ""
    levels: list[dict[str, Any]] = field(default_factory=list)
    bench_error: str | None = None
    roofline: Roofline | None = None
    roofline_note: str = ""
    notes: list[str] = field(default_factory=list)


def model_config_for(profile: Profile, given: str | None) -> Path:
    """The config.json the rehearsal builds: the one given, else the profile's shipped shape."""
    name = given or profile.model.shape
    if not name:
        raise UserError(f"profile {profile.name!r} names no model shape (model.shape): pass --model-config with a "
                        "config.json (or a folder holding one) whose shapes to rehearse")
    return _checked(name)


def draft_config_for(profile: Profile, given: str | None) -> Path | None:
    if profile.draft is None or not profile.draft.repo:
        if given:
            raise UserError(f"--draft-config: profile {profile.name!r} runs no draft model")
        return None
    name = given or profile.draft.shape
    if not name:
        raise UserError(f"profile {profile.name!r} names no draft shape (draft.shape): pass --draft-config")
    return _checked(name)


def _checked(name: str) -> Path:
    """The config's path, once the planner has read its shapes (a file that is no model config is refused here,
    before anything is written)."""
    load_shape(name)
    return resolve_config_path(name)


def check_host(profile: Profile) -> list[GpuInfo]:
    """The host's GPUs (NVML); a GPU profile on a host without one is refused before anything starts."""
    gpu = profile.hardware.gpu
    if gpu is None:
        return []
    try:
        gpus = gpu_probe.probe_gpus()
    except NoGpu as why:
        raise UserError(f"profile {profile.name!r} runs on {gpu.count}x GPU ({profile.hardware.description}), and "
                        f"this host has none ({why}): rehearse it on a host with its GPUs, or a CPU profile "
                        "(cpu-demo) here") from None
    if len(gpus) < gpu.count:
        raise UserError(f"profile {profile.name!r} needs {gpu.count} GPUs, this host has {len(gpus)}: rehearse it on "
                        "a host with its GPUs")
    return gpus


def rehearsed_profile(question: Question, place: ModelPlace) -> Profile:
    """The profile with its model (and draft) replaced by dummy checkpoints written at `place`, the adapter's
    dummy-weight flags and, with --acceptance, the environment that simulates it. Everything else as the profile
    launches it."""
    profile = question.profile
    adapter = adapter_for(profile)
    env = dict(profile.serve.env)
    if question.acceptance is not None:
        env |= adapter.simulated_acceptance_env(profile, question.acceptance)
    host, engine_path = place.folder("model")
    dummy_checkpoint(read_json_object(question.model_config), host)
    update: dict[str, Any] = {"model": profile.model.model_copy(update={"repo": engine_path, "revision": "main"})}
    if question.draft_config is not None and profile.draft is not None:
        host, engine_path = place.folder("draft")
        dummy_checkpoint(read_json_object(question.draft_config), host)
        update["draft"] = profile.draft.model_copy(update={"repo": engine_path, "revision": "main"})
    args = {**profile.serve.args, **adapter.dummy_weights_args}
    update["serve"] = profile.serve.model_copy(update={"args": args, "env": env})
    return profile.model_copy(update=update)


def planned(question: Question, gpus: list[GpuInfo]) -> tuple[Plan | None, str]:
    """The planner's figures for the rehearsed shapes on this host: on its GPUs, or on CPU the pool the engine
    is given (the adapter's `host_kv_cache_bytes`); None and why where it cannot plan."""
    profile, adapter = question.profile, adapter_for(question.profile)
    extra: dict[str, Any] = {"model_config": str(question.model_config),
                             "draft_config": str(question.draft_config) if question.draft_config else None}
    if gpus:
        first = gpus[0]
        if first.memory_gib is None:
            return None, f"NVML did not report the memory of {first.name}"
        extra |= {"gpu_memory_gib": first.memory_gib, "gpu_count": len(gpus), "free_memory_gib": first.free_gib}
    else:
        pool = adapter.host_kv_cache_bytes(profile)
        memory = host_memory_gib()
        if pool is None or memory is None:
            return None, f"{adapter.display_name} on CPU: the planner sizes GPU memory only"
        extra |= {"gpu_memory_gib": min(memory, MAX_GPU_MEMORY_GIB), "gpu_count": 1,
                  "setting_overrides": {"kv_cache_memory_bytes": pool}}
    try:
        return plan_request(request_for_profile(profile, **extra)), ""
    except UserError as exc:
        return None, f"the planner refused: {exc}"


def roofline(question: Question) -> tuple[Roofline | None, str]:
    gpu = question.profile.hardware.gpu
    if gpu is None:
        return None, "no GPU, so no memory-bandwidth roofline"
    try:
        shape = load_shape(question.model_config)
    except UserError as exc:
        return None, str(exc)
    return roofline_from_shape(shape, gpu.memory_bandwidth_gbps * gpu.count, question.model_config.stem), ""


def rehearse(question: Question, launcher: Launcher, out: Path, say: Callable[[str], None],
             place: ModelPlace | None = None) -> Rehearsal:
    """Start the rehearsed profile, load it, read its log. Refusals (UserError) come before anything starts.
    `place`: where the dummy model folders go (default: `out`, read there by an engine on this machine)."""
    gpus = check_host(question.profile)
    profile = rehearsed_profile(question, place or ModelPlace.local(out))
    adapter = adapter_for(profile)
    result = Rehearsal(question_json(question, profile))
    result.notes.append(weights_note(profile))
    result.plan, result.plan_note = planned(question, gpus)
    result.roofline, result.roofline_note = roofline(question)
    engine_dir = out / "engine"
    engine_dir.mkdir(parents=True, exist_ok=True)
    say(f"starting {adapter.display_name} {profile.engine.version} for {profile.name} at the shapes of "
        f"{question.model_config} (dummy weights)")
    began = time.monotonic()
    log = ""
    try:
        with launcher(profile, engine_dir) as engine:
            result.started = True
            result.healthy_s = time.monotonic() - began
            say(f"healthy after {result.healthy_s:.0f} s")
            limit = question.concurrency or adapter.logged_sizing(engine.log()).running_requests or \
                _planned_running(result.plan)
            if limit is None:
                limit = 4
                result.notes.append("the engine logged no running-request limit and the planner has none: the "
                                    "second level runs 4 streams (--concurrency sets it)")
            levels = sorted({1, limit})
            prompts = question.num_prompts or max(8, 2 * max(levels))
            args = ["--max-concurrency", ",".join(map(str, levels)), "--request-rate", "inf",
                    "--num-prompts", str(prompts), "--repeats", "1", "--warmup", "1",
                    "--random-input-len", str(question.input_tokens),
                    "--random-output-len", str(question.output_tokens)]
            say(f"loading it at {' and '.join(map(str, levels))} stream(s), {prompts} requests each")
            try:
                runs = serving_runs(engine, args, fresh_dir(out / "bench"), question.bench_timeout_s, len(levels))
                result.levels = [_level(c, r) for c, r in zip(levels, runs, strict=True)]
            except EngineCrash as crash:
                result.bench_error = crash.reason
            log = engine.log()
    except EngineCrash as crash:
        log = _read(engine_dir / "engine.log") or crash.log_tail.replace(" | ", "\n")
        result.notes.append(f"the launcher: {crash.reason}")
    if log and not (engine_dir / "engine.log").is_file():  # compose's engine logs to Docker: kept beside the report
        (engine_dir / "engine.log").write_text(log)
    result.outcome = adapter.start_outcome(log, result.started)
    result.logged = adapter.logged_sizing(log)
    return result


def question_json(question: Question, profile: Profile) -> dict[str, Any]:
    adapter = adapter_for(profile)
    return {"profile": question.profile.name, "engine": f"{adapter.display_name} {profile.engine.version}",
            "model": profile.model.repo, "model_config": str(question.model_config),
            "draft_config": str(question.draft_config) if question.draft_config else None,
            "acceptance": question.acceptance, "env": {k: v for k, v in profile.serve.env.items()},
            "args": dict(profile.serve.args), "input_tokens": question.input_tokens,
            "output_tokens": question.output_tokens}


def _planned_running(plan: Plan | None) -> int | None:
    value = plan.engine_details.get("max_running_requests") if plan else None
    return value if isinstance(value, int) and value > 0 else None


def _level(concurrency: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One level's figures, the median over its recorded runs."""
    def median(read: Callable[[dict[str, Any]], Any]) -> float | None:
        values = [v for v in (read(r) for r in runs) if isinstance(v, (int, float))]
        return statistics.median(values) if values else None

    tpot = median(lambda r: r.get("tpot_ms", {}).get("median"))
    return {"concurrency": concurrency,
            "output_tok_s": median(lambda r: r.get("output_tok_s")),
            "ttft_median_ms": median(lambda r: r.get("ttft_ms", {}).get("median")),
            "ttft_p99_ms": median(lambda r: r.get("ttft_ms", {}).get("p99")),
            "tpot_median_ms": tpot,
            "tpot_p99_ms": median(lambda r: r.get("tpot_ms", {}).get("p99")),
            # One stream's decode speed: a token every TPOT.
            "stream_decode_tok_s": 1000.0 / tpot if tpot else None,
            "completed": int(sum(r.get("completed", 0) for r in runs)),
            "failed": int(sum(r.get("failed", 0) for r in runs))}


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def sizing_rows(result: Rehearsal) -> list[dict[str, Any]]:
    """The engine's own sizing beside the planner's, each with the planner's error (planned / logged - 1)."""
    plan, logged = result.plan, result.logged
    details = plan.engine_details if plan else {}
    planned_figures: dict[str, Any] = {
        "KV tokens": plan.kv_cache_tokens if plan else None,
        "running requests": details.get("max_running_requests"),
        "state slots": details.get("max_mamba_cache_size"),
        "max concurrency (full context)": round(plan.max_concurrency, 2) if plan else None,
        "weights (GiB)": round(plan.weights_bytes / GIB, 2) if plan else None,
    }
    logged_figures: dict[str, Any] = {
        "KV tokens": logged.kv_tokens, "running requests": logged.running_requests,
        "state slots": logged.state_slots, "max concurrency (full context)": logged.max_concurrency,
        "weights (GiB)": logged.weights_gib,
    }
    rows = []
    for name, engine in logged_figures.items():
        plan_value = planned_figures[name]
        if engine is None and plan_value is None:
            continue
        error = 100.0 * (plan_value / engine - 1) if isinstance(plan_value, (int, float)) and engine else None
        rows.append({"figure": name, "engine": engine, "plan": plan_value, "plan_error_pct": error})
    return rows


def to_json(result: Rehearsal) -> dict[str, Any]:
    return {
        "question": result.question,
        "weights": result.notes[0] if result.notes else None,
        "started": result.started,
        "healthy_s": result.healthy_s,
        "outcome": result.outcome.to_json() if result.outcome else None,
        "engine_sizing": result.logged.to_json(),
        "plan": result.plan.to_json() if result.plan else None,
        "plan_note": result.plan_note,
        "sizing": sizing_rows(result),
        "levels": result.levels,
        "bench_error": result.bench_error,
        "roofline": result.roofline.to_json() if result.roofline else None,
        "roofline_note": result.roofline_note,
        "notes": result.notes,
    }


def write_json(result: Rehearsal, path: Path) -> Path:
    path.write_text(json.dumps(to_json(result), indent=1) + "\n")
    return path
