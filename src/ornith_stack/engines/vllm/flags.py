"""vLLM's flags the project writes or reads: spelling (as profiles write them, without the dashes) and type.

Read in vllm/engine/arg_utils.py and vllm/entrypoints/openai/cli_args.py (0.24.0):
tests/unit/test_engine_flags.py checks every spelling and type against them. Flags absent here pass
through as the seed wrote them.
"""

from __future__ import annotations

from ornith_stack.engines.flag_types import (
    FRACTION,
    POSITIVE_INT,
    SPECULATIVE_CONFIG,
    SWITCH,
    TEXT,
    FlagType,
    unchecked,
)

FLAGS: dict[str, FlagType] = {
    # Written by the adapter: model, listen address, nodes.
    "model": TEXT, "revision": TEXT, "served-model-name": TEXT, "host": TEXT, "port": unchecked(int),
    "nnodes": unchecked(int), "node-rank": unchecked(int), "master-addr": TEXT, "master-port": unchecked(int),
    "headless": unchecked(bool),
    # Parallelism and sizes (the planner reads them).
    "tensor-parallel-size": POSITIVE_INT, "tp": POSITIVE_INT, "pipeline-parallel-size": POSITIVE_INT,
    "data-parallel-size": POSITIVE_INT, "max-model-len": POSITIVE_INT, "kv-cache-memory-bytes": POSITIVE_INT,
    "max-num-batched-tokens": POSITIVE_INT, "max-num-seqs": POSITIVE_INT, "block-size": POSITIVE_INT,
    "gpu-memory-utilization": FRACTION, "dtype": TEXT, "load-format": TEXT, "kv-cache-dtype": TEXT, "mamba-ssm-cache-dtype": TEXT,
    "speculative-config": SPECULATIVE_CONFIG,
    "enable-prefix-caching": SWITCH, "no-enable-prefix-caching": SWITCH, "trust-remote-code": SWITCH,
    "enforce-eager": SWITCH, "language-model-only": unchecked(bool),
}  # fmt: skip
