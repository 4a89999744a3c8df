"""`ornith-stack load`: the load test that counts (bench/steady.py) from the command line."""

from __future__ import annotations

import json
import signal
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("load")
    def load(
        url: Annotated[str, typer.Option(help="The endpoint (the Model Gateway with replicas), e.g. http://127.0.0.1:8000.")],
        model: Annotated[str | None, typer.Option(help="Served model name (default: the first in /v1/models).")] = None,
        requests: Annotated[int, typer.Option(min=1, help="Streaming requests in all (the bound in count).")] = 600,
        rate: Annotated[float, typer.Option(min=0.001, help="Requests per second, evenly spaced.")] = 2.0,
        max_concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight at most.")] = 16,
        max_tokens: Annotated[int, typer.Option(min=1, help="Tokens each request streams (ignore_eos).")] = 128,
        timeout: Annotated[float, typer.Option(min=1, help="Seconds one request may take, first byte to last.")] = 600,
        api_key: Annotated[str | None, typer.Option(envvar=["ORNITH_BENCH_API_KEY", "ORNITH_API_KEY"],
                                                    help="Bearer key (default: $ORNITH_BENCH_API_KEY or $ORNITH_API_KEY).",
                                                    show_default=False)] = None,
        json_out: Annotated[Path | None, typer.Option("--json", help="Also write the report as JSON here.")] = None,
        after: Annotated[float | None, typer.Option(min=0, help="Stop sending this many seconds after the change window "
                                                    "ends (--requests is then a bound); default: send them all.")] = None,
    ) -> None:
        """Send steady streaming requests through a change and count what failed: sent, completed, failed before
        the first token or while streaming, and TTFT/E2E percentiles before, during and after the change window.
        Mark the window with SIGUSR1 (the first begins it, the second ends it), e.g. `kill -USR1 PID` around
        `ornith-stack up`."""
        from ornith_stack.bench.client import EngineClient
        from ornith_stack.bench.steady import ChangeWindow, SteadyLoad, run_steady

        steady = SteadyLoad(requests=requests, rate=rate, max_concurrency=max_concurrency, max_tokens=max_tokens,
                            after_s=after)
        window = ChangeWindow()

        def mark(signum: int, frame: object) -> None:
            (window.begin if window.began is None else window.end)()

        signal.signal(signal.SIGUSR1, mark)
        client = EngineClient(url, timeout_s=timeout, api_key=api_key, connections=max_concurrency)
        try:
            served = client.server_info(model).model
            typer.echo(f"{requests} streams of {max_tokens} tokens to {url} ({served}), {rate:g}/s, at most "
                       f"{max_concurrency} at a time: {'at most' if after is not None else 'about'} "
                       f"{steady.sending_s:.0f} s; kill -USR1 marks the change")
            report = run_steady(client, served, steady, window)
        finally:
            client.close()
        typer.echo(report.text())
        if json_out is not None:
            json_out.write_text(json.dumps(asdict(report), indent=2) + "\n")
        if report.total.failed:
            raise typer.Exit(1)
