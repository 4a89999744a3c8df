"""`ornith-stack plan PROFILE` and the general form `plan --engine ... --model-config ...`."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from ornith_stack.errors import UserError, shown
from ornith_stack.planner import GIB, Plan, PlanOptions, build_request, plan_request
from ornith_stack.planner.layout import context_trade, trade_line
from ornith_stack.sizing.shapes import resolve_config_path

out = Console()

Opt = typer.Option
# The speculative methods vLLM and SGLang name (SGLang's spelled in lower case, as its adapter reads them).
SPECULATIVE_METHODS = ("dflash", "draft_model", "eagle", "eagle3", "mtp", "nextn", "ngram", "standalone")


def check_plan_text(texts: dict[str, str | None]) -> None:
    """Text options the planner would otherwise read as 'not given' or as a method it does not know."""
    for option, text in texts.items():
        if text is not None and not text.strip():
            raise UserError(f"{option}: empty value; leave the option out to use the profile's")
    method = texts.get("--speculative-method")
    if method is not None and method.lower() not in SPECULATIVE_METHODS:
        raise UserError(f"--speculative-method {shown(method)}: choose one of {', '.join(SPECULATIVE_METHODS)}")
    if texts.get("--draft-config") is not None:
        resolve_config_path(str(texts["--draft-config"]))  # a draft named on purpose must exist


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan_cmd(
        profile: Annotated[str | None, typer.Argument(help="Profile to plan; flags below override it.")] = None,
        engine: Annotated[str | None, Opt(help="vllm or sglang (general form).")] = None,
        engine_version: Annotated[str | None, Opt(help="Engine version (shown in the plan).")] = None,
        model_config: Annotated[str | None, Opt(help="config.json path, checkpoint folder or shipped shape name.")] = None,
        draft_config: Annotated[str | None, Opt(help="Draft config.json path or shipped shape name.")] = None,
        tp: Annotated[int | None, Opt(help="Tensor parallelism.")] = None,
        gpu_memory_gib: Annotated[float | None, Opt(help="Memory per GPU in GiB (as NVML reports it).")] = None,
        gpu_count: Annotated[int | None, Opt(help="GPUs available (default: the profile's, or --tp).")] = None,
        dtype: Annotated[str | None, Opt(help="Weight dtype, e.g. bf16 (default: the config's).")] = None,
        kv_cache_dtype: Annotated[str | None, Opt(help="auto or fp8 (fp8 halves attention KV bytes).")] = None,
        kv_cache_memory_bytes: Annotated[int | None, Opt(help="vLLM: pin the KV pool to this many bytes.")] = None,
        gpu_memory_utilization: Annotated[float | None, Opt(help="vLLM: fraction of GPU memory to use.")] = None,
        max_model_len: Annotated[int | None, Opt(help="Context length per request.")] = None,
        enable_prefix_caching: Annotated[bool | None, Opt(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            help="Prefix caching (vLLM) / radix cache (SGLang); default: the profile's or the engine's.")] = None,
        num_speculative_tokens: Annotated[int | None, Opt(help="Drafted tokens per step (DFlash: block - 1).")] = None,
        speculative_method: Annotated[str | None, Opt(help="dflash, ngram, mtp... (default: dflash with "
                                                      "--draft-config, ngram with tokens and no draft).")] = None,
        mem_fraction_static: Annotated[float | None, Opt(help="SGLang: static pool fraction.")] = None,
        max_total_tokens: Annotated[int | None, Opt(help="SGLang: cap on KV tokens.")] = None,
        max_running_requests: Annotated[int | None, Opt(help="SGLang: cap on running requests.")] = None,
        reserve_gib: Annotated[float | None, Opt(help="CUDA-graph/activation reserve per GPU (default: vLLM "
                                               "8.47 GiB at hidden 2048 from seed 003, scaled by hidden; "
                                               "SGLang its own reserve for the GPU size).")] = None,
        as_json: Annotated[bool, Opt("--json", help="Machine-readable output with stable keys.")] = False,
    ) -> None:
        """Will a profile fit, and how much KV cache will the engine have?

        Per GPU: weights, draft weights, CUDA-graph/activation reserve, KV
        bytes per token, recurrent-state bytes per sequence. Then the
        engine's accounting. vLLM: block size, blocks, blocks per request,
        concurrency and "GPU KV cache size", as vLLM 0.24 logs them.
        SGLang: pool split, state slots, KV tokens, running-request clamp,
        DFlash verify buffers. Then a verdict naming what overflows and the
        flag that fixes it.

        Exit status: 0 fits (or unknown: no problem found, a figure guessed), 1 does not fit, 2 bad input.
        """
        check_plan_text({"PROFILE": profile, "--engine": engine, "--engine-version": engine_version,
                         "--model-config": model_config, "--draft-config": draft_config, "--dtype": dtype,
                         "--kv-cache-dtype": kv_cache_dtype, "--speculative-method": speculative_method})
        options = PlanOptions(
            profile=profile, engine=engine, engine_version=engine_version, model_config=model_config,
            draft_config=draft_config, gpu_memory_gib=gpu_memory_gib, gpu_count=gpu_count,
            reserve_gib=reserve_gib, tp=tp, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
            kv_cache_memory_bytes=kv_cache_memory_bytes, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len, enable_prefix_caching=enable_prefix_caching,
            num_speculative_tokens=num_speculative_tokens, speculative_method=speculative_method,
            mem_fraction_static=mem_fraction_static, max_total_tokens=max_total_tokens,
            max_running_requests=max_running_requests,
        )
        request = build_request(options)
        result = plan_request(request)
        # What the context length trades against running requests on this card (a plan that fits).
        try:
            trade = context_trade(request) if not result.problems else ()
        except UserError:  # a request the caps cannot be sized for (the plan above still stands)
            trade = ()
        if as_json:
            data = result.to_json()
            data["context_trade"] = [{"context_length": ctx, "running_requests": n} for ctx, n in trade]
            typer.echo(json.dumps(data, indent=2))
        else:
            print_plan(result)
            if trade:
                out.print(f"trade: running requests per replica by context on this card, with the caps `profiles new` "
                          f"sizes: {trade_line(trade, request.shape.max_position_embeddings)} (this profile: "
                          f"{result.max_model_len:,})", highlight=False)
        if result.problems:
            raise typer.Exit(1)


def _g(n: float) -> str:
    if abs(n) < GIB:
        return f"{n / (1 << 20):,.1f} MiB"
    return f"{n / GIB:,.2f} GiB"


def print_plan(p: Plan) -> None:
    title = f"plan: {p.profile or p.model} — {p.engine} {p.engine_version or ''}, tp {p.tp}, " \
            f"{p.gpu_memory_gib:g} GiB per GPU"
    per_gpu = Table(title=title, title_justify="left", show_header=True)
    per_gpu.add_column("per GPU")
    per_gpu.add_column("value", justify="right")
    per_gpu.add_row("model", p.model + (f" + draft {p.draft}" if p.draft else ""))
    per_gpu.add_row("weights", _g(p.weights_bytes))
    per_gpu.add_row("draft weights", _g(p.draft_weights_bytes))
    per_gpu.add_row("CUDA-graph + activation reserve", _g(p.reserve_bytes))
    per_gpu.add_row("KV bytes per token (all layers)", f"{p.kv_bytes_per_token:,} B")
    per_gpu.add_row("recurrent state per sequence", f"{p.state_bytes_per_sequence / (1 << 20):,.1f} MiB")
    per_gpu.add_row("KV pool", _g(p.kv_pool_bytes))
    out.print(per_gpu)

    engine = Table(title=f"{p.engine} accounting", title_justify="left")
    engine.add_column("figure")
    engine.add_column("value", justify="right")
    engine.add_row("block size (tokens)", f"{p.block_size:,}")
    engine.add_row("page size", f"{p.page_size_bytes:,} B")
    engine.add_row("blocks", f"{p.num_blocks:,}")
    engine.add_row("blocks per request", f"{p.blocks_per_request:,}")
    engine.add_row(f"max concurrency at {p.max_model_len:,} tokens", f"{p.max_concurrency:.2f}x")
    engine.add_row("GPU KV cache size", f"{p.kv_cache_tokens:,} tokens")
    for key, value in p.engine_details.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        elif isinstance(value, int) and key.endswith("bytes"):
            value = _g(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            value = f"{value:,}"
        engine.add_row(key.replace("_", " "), str(value))
    out.print(engine)
    for note in p.notes:
        out.print(f"note: {note}", highlight=False)
    for warning in p.warnings:
        out.print(f"[bold yellow]warning:[/] {warning}", highlight=False)
    if p.fits:
        out.print("[bold green]verdict: fits[/]")
        return
    if not p.problems:
        out.print("[bold yellow]verdict: unknown[/] (no problem found, but not every figure is known)")
        for unknown in p.unknowns:
            out.print(f"  - {unknown}", highlight=False)
        return
    out.print("[bold red]verdict: does not fit[/]")
    for problem in p.problems:
        out.print(f"  - {problem.line()}", highlight=False)
    if p.suggestion:
        out.print(f"  smallest change that fits: {p.suggestion}", highlight=False)
