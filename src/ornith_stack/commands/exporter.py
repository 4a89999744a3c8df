"""`ornith-stack exporter --target URL [--target URL ...] [--listen [HOST]:PORT] [--canary [--canary-check answer|liveness]]
[--profile NAME] [--gpu-metrics auto|required|off] [--model-cache PATH ...]`."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from ornith_stack.deployment import (
    CANARY_CHECK_ANSWER,
    CANARY_CHECKS,
    EXPORTER_LISTEN_HOST,
    GATEWAY_METRICS_PORT,
    GPU_METRICS_AUTO,
    GPU_METRICS_MODES,
)
from ornith_stack.errors import UserError, shown
from ornith_stack.exporter import catalogue as C
from ornith_stack.exporter.scrape import Target
from ornith_stack.exporter.server import Settings, check_timeout, normalise_target, parse_listen, serve
from ornith_stack.profiles import load_profile
from ornith_stack.urls import engine_url


def register(app: typer.Typer) -> None:
    @app.command("exporter")
    def exporter_cmd(
        # Optional for typer so that a missing --target is our one-line error, not a usage traceback.
        target: Annotated[list[str] | None, typer.Option("--target", help="Engine base URL; repeat for several.")] = None,
        # Loopback by default: a host-mode exporter is not reachable from the network unless asked
        # (containers pass --listen :PORT, and publish the port on loopback themselves).
        listen: Annotated[str, typer.Option(help="[HOST]:PORT to serve /metrics on; :PORT for every address.")
                          ] = EXPORTER_LISTEN_HOST,
        profile: Annotated[str | None, typer.Option(help="Profile the targets run (labels, draft).")] = None,
        gateway: Annotated[list[str] | None, typer.Option(
            "--gateway", help="Metrics URL of a Model Gateway in front of the targets (e.g. "
            f"http://gateway:{GATEWAY_METRICS_PORT}), "
            "listed for Prometheus at /sd/gateways; repeat for several.")] = None,
        canary: Annotated[bool, typer.Option("--canary", help="Send a known-answer request periodically.")] = False,
        canary_interval: Annotated[float, typer.Option(help="Seconds between canary requests.")] = 30.0,
        canary_check: Annotated[str, typer.Option(
            help="answer: the canary's answer must be the known one; liveness: any streamed answer passes (a "
                 "model that cannot know it, such as the CPU demo's random weights).")] = CANARY_CHECK_ANSWER,
        timeout: Annotated[float, typer.Option(help="Seconds allowed for one target's scrape.")] = 3.0,
        target_name: Annotated[str | None, typer.Option(
            help="The `target` label of the one --target, where its URL does not tell replicas apart "
                 "(a sidecar's http://127.0.0.1:PORT: the pod's name).")] = None,
        api_key: Annotated[str, typer.Option(
            envvar="ORNITH_API_KEY", show_default=False,
            help="The engines' API key, sent as `Authorization: Bearer` by the canary and the info "
                 "request (prefer the environment variable: a flag shows in the process list).")] = "",
        gpu_metrics: Annotated[str, typer.Option(
            help="GPU memory and utilization through NVML: auto (a host without an NVIDIA driver reports "
                 "no_gpu), required (it reports an error: the exporter of a GPU profile), off.")
                               ] = GPU_METRICS_AUTO,
        model_cache: Annotated[list[str] | None, typer.Option(
            "--model-cache", help="A model cache path (the engines' HF_HOME, mounted read-only) whose file "
            "system's free and total bytes to report; repeat for several.")] = None,
    ) -> None:
        """Serve unified ornith_* metrics (acceptance, throughput, latency) scraped from vLLM/SGLang engines."""
        if not target:
            raise UserError("--target URL is required, e.g. --target http://127.0.0.1:8000 (repeat for several)")
        check_timeout(timeout)
        if canary_check not in CANARY_CHECKS:
            raise UserError(f"--canary-check {shown(canary_check)}: choose {' or '.join(CANARY_CHECKS)}")
        if not 0 < canary_interval < float("inf"):
            raise UserError(f"--canary-interval {canary_interval}: expected a positive number of seconds")
        if gpu_metrics not in GPU_METRICS_MODES:
            raise UserError(f"--gpu-metrics {shown(gpu_metrics)}: choose {', '.join(GPU_METRICS_MODES)}")
        caches = tuple(dict.fromkeys(path.strip() for path in model_cache or ()))
        if any(not path or not path.isprintable() for path in caches):
            raise UserError("--model-cache: a path, printable and not empty (a label value of the disk series)")
        if len(caches) > C.MAX_MODEL_CACHE_PATHS:
            raise UserError(f"--model-cache: {len(caches)} paths, at most {C.MAX_MODEL_CACHE_PATHS}")
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        draft = ""
        if profile:
            loaded = load_profile(profile)
            draft = loaded.draft.repo or "" if loaded.draft else ""
        # One target per address: two URLs differing only in credentials would give duplicate series.
        bases = [normalise_target(engine_url(url, "--target")) for url in target]
        unique = {Target(url).public: url for url in bases}
        if target_name is not None and (len(unique) != 1 or not target_name.strip()):
            raise UserError("--target-name names one target: pass exactly one --target with it, and a non-empty name")
        if target_name is not None and not target_name.isprintable():
            # A label value: invalid UTF-8 (surrogates here) made every /metrics answer an HTTP 500.
            raise UserError(f"--target-name {shown(target_name)}: printable UTF-8 text, no control characters")
        targets = [Target(url, profile or "", draft, (target_name or "").strip(), api_key) for url in unique.values()]
        if len(targets) > C.MAX_TARGETS:
            raise UserError(f"--target: {len(targets)} targets, at most {C.MAX_TARGETS} per exporter (Prometheus' "
                            "sample limit for the exporter job is sized for them); run another exporter for the rest")
        # Checked before serving: an unclosed [IPv6 bracket made every /sd/gateways answer an HTTP 500.
        gateways = [Target(normalise_target(engine_url(url, "--gateway")), profile or "") for url in gateway or []]
        host, port = parse_listen(listen)
        typer.echo(f"ornith-stack exporter on {host or '*'}:{port}/metrics, "
                   f"{len(targets)} target(s): {', '.join(t.public for t in targets)}", err=True)
        try:
            serve(Settings(targets, host, port, timeout=timeout, canary=canary, canary_interval=canary_interval,
                           canary_checks_answer=canary_check == CANARY_CHECK_ANSWER,
                           gateways=gateways, profile=profile or "", gpu_metrics=gpu_metrics,
                           model_cache=caches))
        except KeyboardInterrupt:
            pass
