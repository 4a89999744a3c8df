"""The engine flags the planner, doctor and benchmark reason about, in engine-neutral terms.

Each engine adapter reads a profile's flags into these (`EngineAdapter.settings`, which names the flag behind
each field); the accountings read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# An engine flag value: a switch (true), a scalar, or a mapping the adapter serialises as JSON (a flag whose
# type is a JSON mapping in the engine's flags.py). The profile schema (profiles/model.py) types its flags with it.
ArgValue = bool | int | float | str | dict[str, bool | int | float | str]


@dataclass(frozen=True)
class ServeSettings:
    """The engine flags that the planner, doctor and benchmark reason about, in engine-neutral terms."""

    tp: int = 1
    max_model_len: int | None = None
    mem_fraction_static: float | None = None  # SGLang
    gpu_memory_utilization: float | None = None  # vLLM
    kv_cache_memory_bytes: int | None = None  # vLLM
    kv_cache_dtype: str = "auto"
    # The prefix (vLLM) or radix (SGLang) cache; None: the engine's default for the model.
    enable_prefix_caching: bool | None = None
    max_total_tokens: int | None = None  # SGLang
    max_running_requests: int | None = None  # SGLang
    speculative_method: str | None = None  # "dflash", "ngram", ...
    num_speculative_tokens: int = 0  # tokens drafted per verification step
    draft_block_size: int | None = None  # DFlash: num_speculative_tokens + 1
    # Read by the planner (additive; engine-neutral names, None = the engine's default).
    dtype: str | None = None  # the weights' dtype
    block_size: int | None = None  # tokens per KV block (vLLM) or page (SGLang)
    mamba_ssm_cache_dtype: str | None = None  # the dtype of the SSM (recurrent) state
    mamba_full_memory_ratio: float | None = None  # SGLang
    max_mamba_cache_size: int | None = None  # SGLang
    # SGLang's mamba radix cache strategy: "auto", "no_buffer", "extra_buffer"...; None: "auto".
    mamba_radix_cache_strategy: str | None = None
    overlap_schedule: bool = True  # SGLang's overlap scheduler (a flag turns it off)
    language_model_only: bool = False  # served without the vision tower (vLLM, SGLang 0.5.21)
    attention_backend: str | None = None  # None: the engine's choice
    extra: dict[str, ArgValue] = field(default_factory=dict)  # engine spelling: flags the planner checks
