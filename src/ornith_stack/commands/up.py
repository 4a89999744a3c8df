"""`ornith-stack up [PROFILE|auto]`, `status`, `logs [SERVICE]`, `down [--volumes]`: a profile's compose
stack on this machine. The work is in ornith_stack.stack; this module parses and prints."""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ornith_stack import deployment
from ornith_stack.engines import adapter_for
from ornith_stack.errors import UserError, shown
from ornith_stack.profiles import load_profile
from ornith_stack.stack.bringup import PREFLIGHT, Outcome, UpOptions, up
from ornith_stack.stack.compose import (
    Stack,
    find_checkout,
    layout_for,
    log_services,
    pick_stack,
    published,
    service_environment,
    stack_services,
)
from ornith_stack.stack.envfile import OPERATOR_VAR, PASSWORD_VAR
from ornith_stack.stack.rolling import DRAIN_TIMEOUT_S
from ornith_stack.stack.shell import Runner, run
from ornith_stack.stack.status import (
    alerts_go_nowhere,
    asks_for_login,
    endpoint_access,
    engine_status,
    heartbeat_goes_nowhere,
)
from ornith_stack.stack.workers import Gateway

out = Console(highlight=False, soft_wrap=True)
# Compose's own rule for a project name; checked here so that a bad one is refused before Docker is called.
PROJECT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


def _project(value: str | None) -> str | None:
    if value is not None and not PROJECT_NAME.fullmatch(value):
        raise typer.BadParameter(f"{shown(value)} is not a compose project name (lower-case letters, digits, - and _, "
                                 "starting with a letter or digit, at most 63 characters)")
    return value


def _seconds(option: str, value: float | None, most: float) -> None:
    """A time option: a finite number of seconds above 0 and at most `most` (nan, inf or -1 would wait for ever or
    not at all)."""
    if value is not None and not (math.isfinite(value) and 0 < value <= most):
        raise UserError(f"{option} must be seconds above 0 and at most {most:g}, not {shown(value)}")


ProjectOption = Annotated[str | None, typer.Option(
    "--project", "-p", callback=_project,
    help="Compose project name (default: ornith-PROFILE; day-2 commands: the only one running).")]


class StepProgress:
    """Each step of `up` as a line that turns from a spinner into a tick, with its latest detail. Off a terminal
    (a script, CI) the display starts once preflight has passed: a refusal there is its one `error:` line."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: TaskID | None = None
        self.title = ""
        self.started = False
        self.checking = not progress.console.is_terminal  # preflight not yet passed, shown when it has

    def step(self, title: str) -> None:
        self.finish()
        self.title = title
        if self.checking and not self.started and title == PREFLIGHT:
            return
        self._start()
        self.task = self.progress.add_task(escape(title), total=1)

    def _start(self) -> None:
        if not self.started:
            self.progress.start()
            self.started = True
            if self.checking:
                self.progress.add_task(f"[green]✓[/] {PREFLIGHT}", total=1, completed=1)

    def note(self, text: str) -> None:
        if self.task is not None:
            self.progress.update(self.task, description=escape(f"{self.title}: {text}"))
            self.progress.console.print(f"  [dim]{escape(self.title)}:[/] {escape(text)}")

    def finish(self) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=1, description=f"[green]✓[/] {escape(self.title)}")
            self.task = None

    def close(self) -> None:
        if self.started:
            self.progress.stop()


def print_access(outcome: Outcome) -> None:
    access = outcome.access
    if outcome.reason:
        out.print(outcome.reason)
    if outcome.changed:
        for line in outcome.changed:
            out.print(f"changed: {line}")
    else:
        out.print(f"nothing to change: {outcome.stack.project} already runs profile {outcome.profile.name} as configured")
    key = access.key
    auth = '-H "Authorization: Bearer $ORNITH_API_KEY" ' if key.value else ""
    body = json.dumps({"model": access.model, "messages": [{"role": "user", "content": "Hello!"}],
                       "chat_template_kwargs": {"enable_thinking": True}})
    env_file = outcome.stack.env_file
    load = f"export $(grep ^ORNITH_API_KEY= {shlex.quote(str(env_file))})\n" if key.value and env_file else ""
    out.print(f"\nAPI (OpenAI-compatible): {access.api_base}\nserved model: {access.model}\nAPI key: {key.where}")
    if access.operator.value:
        out.print(f"operator credential (worker and admin routes; the API key gets 401 there): "
                  f"{access.operator.where}")
    out.print(f"smoke request answered (thinking on: the answer is in `{access.thinking_field}`)")
    out.print("\ncurl:\n" + load + f"curl -s {access.api_base}/chat/completions {auth}"
              f"-H 'Content-Type: application/json' -d '{body}'", markup=False)
    api_key = 'os.environ["ORNITH_API_KEY"]' if key.value else '"none"'
    out.print("\nPython (pip install openai):\n"
              "import os\nfrom openai import OpenAI\n"
              f'client = OpenAI(base_url="{access.api_base}", api_key={api_key})\n'
              f'reply = client.chat.completions.create(model="{access.model}", '
              'messages=[{"role": "user", "content": "Hello!"}], '
              'extra_body={"chat_template_kwargs": {"enable_thinking": True}})\n'
              "print(reply.choices[0].message)", markup=False)
    out.print("")
    for name, label in (("grafana", "Grafana"), ("prometheus", "Prometheus"), ("alertmanager", "Alertmanager"),
                        ("exporter", "Exporter /metrics")):
        if name in access.addresses:
            out.print(f"{label}: http://{access.addresses[name]}")
    if access.monitoring.value:
        out.print(f"Grafana, Prometheus and Alertmanager login: user {deployment.MONITORING_USER}, password "
                  f"{access.monitoring.where}", markup=False)
        out.print(f"Grafana's admin (a login of its own): user {deployment.GRAFANA_ADMIN_USER}, password "
                  f"{deployment.GRAFANA_ADMIN_PASSWORD_VARIABLE} in the same file", markup=False)


AUTH_NOTE = {True: "requires the API key", False: "UNAUTHENTICATED: anyone who reaches it can use it",
             None: "not answering"}
LOGIN_NOTE = {True: f"require a login (user {deployment.MONITORING_USER}, ORNITH_MONITORING_PASSWORD)",
              False: "no login (ORNITH_MONITORING_BIND keeps them on loopback)", None: "Alertmanager not answering"}


def _health(up: bool) -> str:
    return "up" if up else "[red]down[/]"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def in_rotation(runner: Runner, stack: Stack, gateway: str, base: str) -> set[str] | None:
    """The replica URLs in the gateway's rotation at `base`, read with the operator's credential it runs with
    (None: it has none, refuses it or does not answer)."""
    key = service_environment(runner, stack, gateway).get(OPERATOR_VAR, "")
    try:
        return set(Gateway(base, key).workers()) if key else None
    except UserError:
        return None


def _rotation(target: str, listed: set[str] | None) -> str:
    return "?" if listed is None else "in" if target.rstrip("/") in listed else "[red]OUT[/]"


def register(app: typer.Typer) -> None:
    @app.command("up")
    def up_cmd(
        profile: Annotated[str, typer.Argument(help="Profile name, or auto (the doctor picks: cpu-demo without GPUs).")
                           ] = "auto",
        project: ProjectOption = None,
        env_file: Annotated[Path | None, typer.Option(
            help="Compose env file that keeps ORNITH_API_KEY (default: compose/.env).")] = None,
        api_key: Annotated[bool, typer.Option(
            "--api-key/--no-api-key", help="Protect the API with ORNITH_API_KEY (from the environment, the env "
            "file, or a new one). Without: loopback only.")] = True,
        start_timeout: Annotated[float | None, typer.Option(help="Seconds the engine may take to start.")] = None,
        all_at_once: Annotated[bool, typer.Option(
            "--all-at-once", help="Replicas: recreate every changed one together (their requests fail meanwhile), "
            "not one at a time out of the gateway's rotation.")] = False,
        drain_timeout: Annotated[float, typer.Option(
            help="Replicas: seconds a replica out of rotation may take to finish its requests before it is "
            "recreated (default: the gateway's request timeout).")] = DRAIN_TIMEOUT_S,
    ) -> None:
        """Check the machine, fetch the weights, build the images, start the stack, prove it answers,
        and print how to call it. Nothing changes unless preflight passes; a second run with nothing
        changed starts nothing. With replicas behind the gateway a change is applied one replica at a time:
        out of rotation, drained, recreated, healthy, back in rotation."""
        _seconds("--start-timeout", start_timeout, 24 * 3600)
        _seconds("--drain-timeout", drain_timeout, 24 * 3600)
        options = UpOptions(root=find_checkout(Path.cwd()), profile=profile, project=project, env_file=env_file,
                            with_key=api_key, start_timeout_s=start_timeout, all_at_once=all_at_once,
                            drain_timeout_s=drain_timeout)
        steps = StepProgress(Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=False))
        try:
            outcome = up(options, run, steps)
            steps.finish()
        finally:
            steps.close()
        print_access(outcome)

    @app.command("status")
    def status_cmd(project: ProjectOption = None,
                   interval: Annotated[float, typer.Option(help="Seconds between the two reads.")] = 2.0) -> None:
        """Per engine: health, acceptance length, decode tok/s, running/waiting requests and KV use, as the
        exporter reads them; and whether the API asks for a key."""
        _seconds("--interval", interval, 3600)
        stack = pick_stack(run, project)
        profile = load_profile(stack.profile)
        layout = layout_for(profile)
        exporter = published(run, stack, deployment.EXPORTER_SERVICE, deployment.EXPORTER_PORT)
        endpoint = published(run, stack, layout.endpoint, profile.serve.port)
        out.print(f"project {stack.project} (profile {stack.profile})")
        gateway_up, listed = None, None
        if endpoint is None:
            out.print(f"the {layout.endpoint} service publishes no port {profile.serve.port}: "
                      f"`ornith-stack logs {layout.endpoint}`")
        else:
            base = f"http://{endpoint}"
            access = endpoint_access(base, layout, adapter_for(profile).chat_path,
                                     profile.serve.served_name or profile.model.repo or "")
            front = "" if layout.gateway is None else f" ({layout.gateway} in front of {', '.join(layout.engines)})"
            out.print(f"API {base}/v1{front}: {AUTH_NOTE[access.api]}")
            if layout.gateway is not None:
                out.print(f"{layout.gateway} {deployment.GATEWAY_WORKERS_PATH} (adds and removes replicas): "
                          f"{AUTH_NOTE[access.workers]}")
                gateway_up = access.gateway_ready
                listed = in_rotation(run, stack, layout.gateway, base)
        alertmanager = published(run, stack, deployment.ALERTMANAGER_SERVICE, deployment.ALERTMANAGER_PORT)
        # The monitoring password as compose resolves it (the env file, or the caller's environment).
        password = (service_environment(run, stack, deployment.MONITORING_AUTH_SERVICE).get(PASSWORD_VAR, "")
                    if stack.compose_file.is_file() else "")
        if alertmanager is not None:
            out.print(f"Prometheus, Alertmanager, Grafana: {LOGIN_NOTE[asks_for_login(alertmanager)]}")
        if alertmanager is not None and alerts_go_nowhere(alertmanager, password):
            out.print("alerts go NOWHERE: Alertmanager sends to the placeholder webhook; set "
                      "ORNITH_ALERT_WEBHOOK_URL in the env file and run `ornith-stack up` again")
        if alertmanager is not None and heartbeat_goes_nowhere(alertmanager, password):
            out.print("no HEARTBEAT: nothing notices if Prometheus or Alertmanager stops; set ORNITH_HEARTBEAT_URL "
                      "(a dead man's switch) in the env file and run `ornith-stack up` again")
        if exporter is None:
            out.print("the exporter publishes no port: `ornith-stack logs exporter`")
            raise typer.Exit(1)
        rows = engine_status(exporter, interval)
        # Behind a gateway: whether it routes to each replica (its worker list, read with the operator's credential).
        rotation = [] if layout.gateway is None else ["rotation"]
        table = Table("engine", "health", "acceptance", "decode tok/s", "running", "waiting", "KV use", *rotation)
        for row in rows:
            name = f"{row.target} {row.info.get('engine', '')} {row.info.get('version', '')}".strip()
            table.add_row(name, _health(row.up), _fmt(row.acceptance_length, ".2f"),
                          _fmt(row.decode_tok_s, ".1f"), _fmt(row.running, ".0f"), _fmt(row.waiting, ".0f"),
                          "-" if row.kv_usage is None else f"{row.kv_usage:.1%}",
                          *[_rotation(row.target, listed) for _ in rotation])
        if layout.gateway is not None:
            table.add_row(f"{layout.gateway} (Model Gateway, {layout.health_path})", _health(bool(gateway_up)),
                          *["-"] * 6)
        # A pipe or a log gets every row on one line, however narrow rich guesses the terminal is.
        (out if out.is_terminal else Console(highlight=False, width=200)).print(table)
        out_of_rotation = [row.target for row in rows if listed is not None and row.target.rstrip("/") not in listed]
        if out_of_rotation:
            out.print(f"out of the gateway's rotation: {', '.join(out_of_rotation)} (a rolling `up` under way, or one "
                      "interrupted: `ornith-stack up` puts a replica back once it is healthy)")
        elif rotation and listed is None:
            out.print(f"rotation unknown: the {layout.gateway} did not list its workers to the operator's credential "
                      f"({OPERATOR_VAR})")
        if not rows or not all(row.up for row in rows) or gateway_up is False:
            raise typer.Exit(1)

    @app.command("logs")
    def logs_cmd(service: Annotated[str | None, typer.Argument(
                     help="engine (every replica), engine-0, gateway, exporter, prometheus, ...")] = None,
                 project: ProjectOption = None,
                 follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
                 tail: Annotated[str, typer.Option(help="Lines from the end of each log, or all.")] = "200") -> None:
        """The services' logs (docker compose logs)."""
        if tail != "all" and not (tail.isascii() and tail.isdigit()):
            raise UserError(f"--tail must be a number of lines or all, not {shown(tail)}")
        stack = pick_stack(run, project)
        services = log_services(stack_services(run, stack), layout_for(load_profile(stack.profile)), service)
        argv = stack.compose("logs", "--tail", tail, *(["--follow"] if follow else []), *services)
        raise typer.Exit(subprocess.call(argv))

    @app.command("down")
    def down_cmd(project: ProjectOption = None,
                 volumes: Annotated[bool, typer.Option("--volumes", help="Also remove the named volumes "
                                                       "(Prometheus data, the in-volume model cache).")] = False) -> None:
        """Stop and remove the stack's containers and network (and with --volumes its volumes)."""
        stack = pick_stack(run, project)
        result = run(stack.compose("down", "--remove-orphans", *(["--volumes"] if volumes else [])), timeout=600)
        if result.returncode != 0:
            out.print(result.stderr.strip())
            raise typer.Exit(1)
        out.print(f"removed {stack.project}" + (" and its volumes" if volumes else ""))
