"""`ornith-stack tiny-model OUT`: write a tiny random-weight checkpoint of the Ornith architecture."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from ornith_stack.errors import UserError


def tiny_model(
    out: Annotated[str, typer.Argument(help="Directory to write; an earlier tiny model there is replaced.")],
    arch: Annotated[
        str,
        typer.Option(help="qwen3_5_moe: the hybrid (Qwen3_5MoeForCausalLM); qwen3_moe: Qwen3MoeForCausalLM."),
    ] = "qwen3_5_moe",
    with_vision: Annotated[
        bool,
        typer.Option(
            "--with-vision", help="Save Qwen3_5MoeForConditionalGeneration with a tiny vision tower."
        ),
    ] = False,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed gives the same bytes.")] = 0,
    mtp: Annotated[
        bool, typer.Option("--mtp/--no-mtp", help="Include the mtp.* tensors the config declares.")
    ] = False,
    zero_mask_row: Annotated[
        bool,
        typer.Option("--zero-mask-row", help="Zero the mask token's embedding row (id in config.json)."),
    ] = False,
) -> None:
    """Write a tiny random checkpoint (config, sharded safetensors + index, tokenizer, chat template)."""
    from ornith_stack import tiny_model as tm

    if not out.strip():
        raise UserError("tiny-model OUT: empty directory name; name a new directory, e.g. models/ornith-tiny")
    if not 0 <= seed < 2**32:
        raise UserError(f"--seed {seed}: expected an integer from 0 to {2**32 - 1}")
    if arch not in tm.ARCHES:
        raise UserError(f"--arch {arch!r}: choose one of {', '.join(tm.ARCHES)}")
    arch_name: tm.Arch = arch  # type: ignore[assignment]  # checked against tm.ARCHES above
    start = time.monotonic()
    path = tm.make_tiny_model(
        Path(out), arch_name, seed=seed, with_vision=with_vision, mtp=mtp, zero_mask_row=zero_mask_row
    )
    size_mb = tm.checkpoint_size(path) / 1e6
    typer.echo(f"wrote {path} ({arch}, {size_mb:.1f} MB) in {time.monotonic() - start:.1f} s")


def register(app: typer.Typer) -> None:
    app.command("tiny-model")(tiny_model)
