"""SGLang's flags the project writes or reads: spelling (as profiles write them, without the dashes) and type.

Read in sglang/srt/server_args.py (0.5.17; 0.5.21 keeps its fields in arg_groups/fields/):
tests/unit/test_engine_flags.py checks every spelling and type against those parsers. Flags absent here
pass through as the seed wrote them.
"""

from __future__ import annotations

from ornith_stack.engines.flag_types import (
    FRACTION,
    POSITIVE,
    POSITIVE_INT,
    SWITCH,
    TEXT,
    FlagType,
    choice,
    integer,
    unchecked,
)

MAMBA_STRATEGIES = choice("auto", "no_buffer", "extra_buffer", "extra_buffer_lazy")

FLAGS: dict[str, FlagType] = {
    # Written by the adapter: model, listen address, metrics, key file, nodes, draft.
    "model-path": TEXT, "revision": TEXT, "served-model-name": TEXT, "host": TEXT, "port": unchecked(int),
    "enable-metrics": SWITCH, "config": TEXT, "nnodes": unchecked(int), "node-rank": unchecked(int),
    "dist-init-addr": TEXT, "speculative-draft-model-path": TEXT, "speculative-draft-model-revision": TEXT,
    # Parallelism and sizes (the planner reads them).
    "tp-size": POSITIVE_INT, "tp": POSITIVE_INT, "tensor-parallel-size": POSITIVE_INT,
    "dp-size": POSITIVE_INT, "pp-size": POSITIVE_INT, "context-length": POSITIVE_INT,
    "max-total-tokens": POSITIVE_INT, "max-running-requests": POSITIVE_INT, "page-size": POSITIVE_INT,
    "max-mamba-cache-size": POSITIVE_INT, "chunked-prefill-size": integer(-1),
    # Decode CUDA graphs up to this batch (0.5.17 and 0.5.21; 0.5.21 has no plain --cuda-graph-max-bs).
    "cuda-graph-max-bs-decode": POSITIVE_INT,
    "mem-fraction-static": FRACTION, "mamba-full-memory-ratio": POSITIVE,
    "dtype": TEXT, "kv-cache-dtype": TEXT, "attention-backend": TEXT, "load-format": TEXT,
    # Speculative decoding.
    "speculative-algorithm": TEXT, "speculative-dflash-block-size": POSITIVE_INT,
    "speculative-num-draft-tokens": POSITIVE_INT, "speculative-num-steps": POSITIVE_INT,
    "speculative-eagle-topk": POSITIVE_INT,
    # The hybrid models' state cache (0.5.17 also spells the strategy --mamba-scheduler-strategy).
    "mamba-radix-cache-strategy": MAMBA_STRATEGIES, "mamba-scheduler-strategy": MAMBA_STRATEGIES,
    "mamba-ssm-dtype": choice("float32", "bfloat16", "float16"),
    "disable-radix-cache": SWITCH, "disable-overlap-schedule": SWITCH, "trust-remote-code": SWITCH,
    # Multimodal and GPU-generation flags the planner checks (capabilities.py), and the seeds' parser.
    "language-model-only": unchecked(bool), "mm-feature-transport": TEXT,
    "enable-flashinfer-allreduce-fusion": unchecked(bool),
    "flashinfer-allreduce-fusion-backend": TEXT, "reasoning-parser": TEXT,
    # The MoE runner and what decides it (the planner counts the trtllm runner's padding on sm10x).
    "moe-runner-backend": TEXT, "moe-a2a-backend": TEXT, "ep-size": POSITIVE_INT, "quantization": TEXT,
}  # fmt: skip
