"""The profile schema: one validated record per hardware target.

A profile is the single source of truth for a deployment. The seed's engine flags live in
`serve.args` verbatim; everything generated (compose, Helm values, Ansible variables, the container
entrypoint) reads them through `ornith_stack.engines.adapter_for(profile).launch_args(profile)`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ornith_stack.cuda_requirement import CudaRequirement, parse_requirement
from ornith_stack.deployment import CANARY_CHECK_ANSWER, CANARY_CHECK_LIVENESS
from ornith_stack.engines import engine_arg_problems
from ornith_stack.errors import UserError
from ornith_stack.gpus import COMPUTE_CAPABILITY, gpu_table, known_model
from ornith_stack.profiles.images import ImageRef, parse_image, parse_pinned_image
from ornith_stack.sizing.settings import ArgValue


class Strict(BaseModel):
    """Unknown keys and wrong types are errors: a typo must never silently become a default."""

    # allow_inf_nan=False: `memory_gib: .inf` or `.nan` is a typo, never a GPU.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Gpu(Strict):
    model: str = Field(description="Marketing name, e.g. 'NVIDIA A100 80GB'.")
    count: int = Field(ge=1, description="GPUs per host the profile uses.")
    memory_gib: float = Field(gt=0, description="Memory per GPU in GiB as NVML reports it.")
    compute_capability: str = Field(pattern=f"^{COMPUTE_CAPABILITY}$", description="e.g. '8.0' for A100, '12.1' for GB10.")
    memory_bandwidth_gbps: float = Field(gt=0, description="Per GPU, GB/s; the decode roofline uses it.")
    models: list[str] = Field(
        min_length=1, description="Keys of the GPU table (src/ornith_stack/gpus.yaml) this profile runs on; "
        "the table says what NVML calls each. A card the table lacks: nvml:NAME (its NVML name)."
    )

    @field_validator("models")
    @classmethod
    def _known_models(cls, models: list[str]) -> list[str]:
        unknown = [m for m in models if not known_model(m)]
        if unknown:
            raise ValueError(f"unknown GPU {', '.join(unknown)}; the GPU table knows: {', '.join(gpu_table())} "
                             "(a card it lacks: nvml:NAME, the name NVML reports)")
        return models


class Hardware(Strict):
    description: str
    gpu: Gpu | None = Field(default=None, description="None for profiles that run without a GPU.")
    cpu_arch: list[Literal["x86_64", "aarch64"]] = Field(min_length=1)
    host_memory_gib: float | None = Field(default=None, gt=0, description="Unified/host memory, if it matters.")


class Engine(Strict):
    kind: Literal["vllm", "sglang"]
    version: str = Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+")
    image: str = Field(
        description="Upstream image reference [registry/]name[:tag][@sha256:digest], pinned "
        "to a digest or a tag (never 'latest')."
    )
    python_pins: dict[str, str] = Field(
        default_factory=dict, description="Python packages the seed pins on top of the image."
    )
    nvidia_require_cuda: str | None = Field(
        default=None,
        description="The image's NVIDIA_REQUIRE_CUDA (from images.yaml): the drivers it accepts. None: no CUDA.",
    )

    @field_validator("nvidia_require_cuda")
    @classmethod
    def _readable_requirement(cls, value: str | None) -> str | None:
        if value is not None:
            parse_requirement(value)
        return value

    @property
    def cuda_requirement(self) -> CudaRequirement | None:
        """The drivers this image runs on (floor and datacenter branches), or None for CPU images."""
        return parse_requirement(self.nvidia_require_cuda) if self.nvidia_require_cuda else None

    @field_validator("image")
    @classmethod
    def _pinned(cls, image: str) -> str:
        parse_pinned_image(image)
        return image

    @property
    def image_ref(self) -> ImageRef:
        """The image as its parts (repository, tag, digest), for files that spell them apart."""
        return parse_image(self.image)


# A full Git commit hash: the only revision whose content cannot change under its name.
COMMIT = re.compile(r"[0-9a-f]{40}")


class ModelRef(Strict):
    repo: str | None = Field(
        default=None,
        description="Hugging Face repository, or an absolute path. None when the seed does not name it: "
        "the operator must then supply it (--set model.repo=...).",
    )
    revision: str = Field(default="main", description="Branch, tag or commit to download.")
    shape: str | None = Field(default=None, description="Name of the shipped config the planner uses.")
    missing_hint: str | None = Field(default=None, description="Said when repo is missing.")


class Sampling(Strict):
    temperature: float = Field(ge=0)
    top_p: float = Field(gt=0, le=1)
    top_k: int = Field(ge=-1)


class Serve(Strict):
    port: int = Field(ge=1, le=65535)
    served_name: str | None = Field(default=None, description="None: the engine's default (the model path).")
    args: dict[str, ArgValue] = Field(description="The seed's engine flags, without leading dashes.")
    env: dict[str, str] = Field(default_factory=dict, description="Engine environment variables.")
    replicas: int = Field(
        default=1, ge=1, description="Data-parallel engines, each on its own tp GPUs; more than one runs SGLang's "
        "Model Gateway in front as the single endpoint.",
    )
    sampling: Sampling | None = Field(default=None, description="Request defaults the seed evaluated with.")
    remote_code_unpinned: bool = Field(
        default=False, description="Allow `trust-remote-code` with a model or draft at a branch or tag rather than "
        "a commit hash: the checkpoint's own Python then runs, and what a branch holds can change under its name. "
        "Without it such a profile is refused; pin model.revision and draft.revision to commits instead.",
    )


class SweepPoint(Strict):
    prompt_tokens: int = Field(gt=0)
    ttft_s: float | None = Field(default=None, gt=0)
    decode_tok_s: float | None = Field(default=None, gt=0)


class Expected(Strict):
    """The seed's published results, for the benchmark, the planner tests and the alert thresholds."""

    source: str = Field(description="Seed file the numbers come from.")
    decode_tok_s: float | None = Field(default=None, gt=0)
    baseline_decode_tok_s: float | None = Field(default=None, gt=0)
    speedup: float | None = Field(default=None, gt=0)
    acceptance_length: dict[str, float] = Field(default_factory=dict, description="Per task.")
    accuracy: dict[str, float] = Field(default_factory=dict, description="Pass rate per task, 0-1.")
    baseline_accuracy: dict[str, float] = Field(default_factory=dict)
    sweep: list[SweepPoint] = Field(default_factory=list)
    kv_cache_tokens: int | None = Field(default=None, gt=0)
    max_concurrency: float | None = Field(default=None, gt=0)
    attention_block_size: int | None = Field(default=None, gt=0)
    weights_gib: float | None = Field(default=None, gt=0)


class Slo(Strict):
    """The service level the alerts defend (Google SRE workbook: multi-window, multi-burn-rate alerts on
    the error budget, 1 - target, over 30 days). The defaults apply to every profile that sets none."""

    availability: float = Field(
        default=0.99, gt=0, lt=1,
        description="Share of requests that must succeed: not a 5xx at the gateway, not an error or abort "
        "at the engine.")
    ttft_seconds: float = Field(
        default=10.0, gt=0,
        description="A request whose first token comes within this many seconds is a good event; a bucket "
        "bound of the engine's TTFT histogram (`ornith-stack render` says which).")
    ttft_target: float = Field(
        default=0.95, gt=0, lt=1, description="Share of requests that must be good events for TTFT.")


# The name of a profile, as its schema takes it (and as `profiles new` and `tune --name` check it before writing).
PROFILE_NAME = r"^[a-z0-9][a-z0-9-]{0,62}$"


class Profile(Strict):
    name: str = Field(pattern=PROFILE_NAME)
    description: str
    seed: str | None = Field(default=None, description="The seed file this profile reproduces.")
    hardware: Hardware
    engine: Engine
    model: ModelRef
    draft: ModelRef | None = None
    serve: Serve
    expected: Expected | None = None
    slo: Slo = Field(default_factory=Slo)

    @model_validator(mode="after")
    def _typed_engine_args(self) -> Profile:
        problems = engine_arg_problems(self.engine.kind, dict(self.serve.args))
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _remote_code_pinned(self) -> Profile:
        if self.serve.args.get("trust-remote-code") not in (True, "true", "") or self.serve.remote_code_unpinned:
            return self
        unpinned = [f"{which}.revision {ref.revision!r}" for which, ref in (("model", self.model), ("draft", self.draft))
                    if ref is not None and ref.repo and not ref.repo.startswith("/") and not COMMIT.fullmatch(ref.revision)]
        if unpinned:
            raise ValueError(f"serve.args.trust-remote-code runs the checkpoint's own code, and {' and '.join(unpinned)} "
                             "is no commit: pin it to a commit hash (40 hex digits), or set serve.remote_code_unpinned: "
                             "true to run whatever the branch holds")
        return self

    def require_repo(self, which: Literal["model", "draft"] = "model") -> str:
        """The model (or draft) repository, or a clear error naming how to supply it."""
        ref = getattr(self, which)
        if ref is None or ref.repo:
            return ref.repo if ref else ""
        hint = ref.missing_hint or "the seed does not name this repository"
        raise UserError(f"profile {self.name!r}: {which}.repo is required ({hint}); pass --set {which}.repo=OWNER/NAME")

    @property
    def gpu_count(self) -> int:
        return self.hardware.gpu.count if self.hardware.gpu else 0

    @property
    def canary_check(self) -> str:
        """What the exporter's canary checks (`exporter --canary-check`): the known answer where the profile
        serves real weights (every GPU profile), else liveness only: the CPU demo's tiny model has random
        weights, so it cannot know the answer, and a hung engine must fail its canary all the same."""
        return CANARY_CHECK_ANSWER if self.gpu_count else CANARY_CHECK_LIVENESS

    @property
    def gpus_per_engine(self) -> int:
        """GPUs one engine replica sees (its container is pinned to them)."""
        return self.gpu_count // self.serve.replicas
