"""Run model-written code against trusted tests, with the operating system as the boundary.

Two processes, joined only by two pipes:
- the candidate runs the solution under bubblewrap: new user, PID, network, IPC, UTS and mount namespaces,
  and no further user namespace (`--disable-userns`); a read-only root holding only /usr and the
  interpreter's own prefix, a read-only /dev; sized tmpfs mounts as /tmp (the working directory) and
  /dev/shm, the only writable places; an empty environment; no capabilities; rlimits on CPU, address
  space, file size, open files and processes, whose product bounds the sandbox's memory
  (`Limits.memory_bound_mb`); `--die-with-parent`; its own session;
- the judge runs the tests outside the sandbox: each tested function is a proxy that sends the arguments
  to the candidate and reads back the returned value as a Python literal. The judge prints the verdict on
  a pipe to this process. It reads replies of at most 1 MiB and runs under a 1 GiB address-space limit,
  so no reply can make it parse its way out of memory.

Why a candidate cannot forge a pass: the verdict is decided by the judge's asserts on plain values, in a
process the candidate cannot see (another PID namespace), signal, trace or share memory or files with; the
candidate holds only its end of the two pipes, and whatever it writes there is parsed as data, never run.
Exiting early, printing anything, patching the interpreter or returning an object that claims equality
with everything all end as a failed check. Without bubblewrap the same two processes run unconfined,
which `run_tests` does only when the caller opts in (`Limits.unsafe_without_sandbox`).

The judge executes the dataset's own test code (trusted, like the rest of the benchmark's inputs);
only solution code runs in the sandbox.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ornith_stack.bench import sandbox_child
from ornith_stack.errors import UserError

UNSAFE_FLAG = "--unsafe-run-code-without-sandbox"
_CHILD = Path(sandbox_child.__file__).read_text(encoding="utf-8")
_NOBODY = "nobody"


@dataclass(frozen=True)
class Limits:
    """Bounds of one sandboxed run. Memory is bounded per process (address space) and in processes, so
    the whole sandbox holds at most `memory_bound_mb`: processes x memory_mb plus its two tmpfs mounts
    (no cgroup is made; the rlimits hold wherever bubblewrap runs)."""

    wall_s: float = 10.0
    memory_mb: int = 512  # address space of each sandboxed process
    file_mb: int = 16  # largest file; /tmp holds 2 x file_mb, /dev/shm file_mb
    open_files: int = 64
    processes: int = 16  # processes of the sandbox's user
    unsafe_without_sandbox: bool = False  # run code with no isolation where bubblewrap cannot

    @property
    def tmpfs_mb(self) -> int:
        return 2 * self.file_mb + self.file_mb

    @property
    def memory_bound_mb(self) -> int:
        """The most memory the whole sandbox can hold: every process at its limit, both tmpfs full."""
        return self.processes * self.memory_mb + self.tmpfs_mb


@dataclass(frozen=True)
class CodeJob:
    """Untrusted `solution` (run in the sandbox as module `solution`) and the trusted tests: `setup` runs
    first in the judge, then each name in `functions` becomes a proxy of the solution's function, then
    `tests` runs; the job passes when `tests` completes without an exception."""

    solution: str
    setup: str
    tests: str
    functions: tuple[str, ...]


@dataclass(frozen=True)
class RunResult:
    passed: bool
    status: str  # passed | failed | timeout
    detail: str
    duration_s: float
    sandboxed: bool


class SandboxUnavailable(UserError):
    """bubblewrap cannot isolate code on this host, and the caller did not accept running it without."""


@dataclass(frozen=True)
class Isolation:
    """How candidates run here: the interpreter inside the sandbox and the user that starts bubblewrap."""

    interpreter: str
    prefix: str
    user: str | None  # run bubblewrap as this user (the harness runs as root), else as ourselves
    problem: str | None  # why code cannot be isolated here; None when it can


def run_tests(job: CodeJob, limits: Limits | None = None) -> RunResult:
    limits = limits or Limits()
    iso = isolation()
    if iso.problem and not limits.unsafe_without_sandbox:
        raise SandboxUnavailable(refusal(iso.problem))
    with tempfile.TemporaryDirectory(prefix="ornith-bench-") as scratch:
        return _run(job, limits, iso, Path(scratch))


def require_sandbox(limits: Limits) -> None:
    """Refuse, before any request is sent, a run that would have to execute code without isolation."""
    problem = isolation().problem
    if problem and not limits.unsafe_without_sandbox:
        raise SandboxUnavailable(refusal(problem))


def refusal(problem: str) -> str:
    return (f"refusing to run model-written code: {problem}. Install bubblewrap (Debian: apt-get install "
            f"bubblewrap) on a kernel that allows user namespaces, or pass {UNSAFE_FLAG} to run it "
            "unconfined on this host")


def _run(job: CodeJob, limits: Limits, iso: Isolation, scratch: Path) -> RunResult:
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    sandboxed = iso.problem is None
    sizes = (int(limits.wall_s) + 1, limits.memory_mb, limits.file_mb, limits.open_files, limits.processes)
    child = [iso.interpreter, "-I", "-S", "-B", "-c", _CHILD]
    cand_argv = [*child, "candidate", str(requests_r), str(replies_w), *map(str, sizes)]
    if sandboxed:
        cand_argv = bwrap_argv(iso, limits) + cand_argv
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    started = time.perf_counter()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(scratch / "candidate.log", "wb") as log:
            procs.append(subprocess.Popen(
                cand_argv, stdin=subprocess.PIPE, stdout=log, stderr=log, env=env, cwd="/" if sandboxed else scratch,
                pass_fds=(requests_r, replies_w), start_new_session=True, **_as_user(iso.user if sandboxed else None)))
            procs.append(subprocess.Popen(
                [*child, "judge", str(requests_w), str(replies_r)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, env=env, cwd=scratch, pass_fds=(replies_r, requests_w), start_new_session=True))
    except OSError:
        _kill(*procs)
        raise
    finally:
        for fd in (requests_r, requests_w, replies_r, replies_w):
            os.close(fd)
    cand, judge = procs
    _feed(cand, job.solution.encode())
    _feed(judge, json.dumps({"setup": job.setup, "tests": job.tests, "functions": job.functions}).encode())
    try:
        out, _ = judge.communicate(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        _kill(judge, cand)
        return RunResult(False, "timeout", f"timeout: killed after {limits.wall_s:g} s",
                         time.perf_counter() - started, sandboxed)
    _kill(cand)
    duration = time.perf_counter() - started
    try:
        verdict = json.loads(out.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        verdict = {"passed": False, "detail": f"the judge exited with status {judge.returncode}"}
    if verdict["passed"] and judge.returncode == 0:
        return RunResult(True, "passed", "", duration, sandboxed)
    return RunResult(False, "failed", str(verdict["detail"]) or "failed", duration, sandboxed)


def _feed(proc: subprocess.Popen[bytes], data: bytes) -> None:
    """Write a child's whole input and close it; a child that died early (a solution that exits at once)
    is not an error here, its verdict says so."""
    stream, proc.stdin = proc.stdin, None
    assert stream is not None
    try:
        stream.write(data)
    except OSError:
        pass
    finally:
        try:
            stream.close()
        except OSError:
            pass


def _kill(*procs: subprocess.Popen[bytes]) -> None:
    """SIGKILL each process group: the judge and, for the candidate, bubblewrap, whose sandbox's PID 1
    dies with it (`--die-with-parent`), taking every process of its PID namespace along."""
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def _as_user(name: str | None) -> dict[str, Any]:
    if name is None:
        return {}
    entry = pwd.getpwnam(name)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def bwrap_argv(iso: Isolation, limits: Limits) -> list[str]:
    argv = ["bwrap", "--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    if not _under(iso.prefix, "/usr"):
        argv += ["--ro-bind", iso.prefix, iso.prefix]
    # Writable: only two sized tmpfs mounts; the root and /dev (bubblewrap makes both tmpfs) turn read-only.
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.file_mb << 20), "--tmpfs", "/dev/shm",
             "--size", str(2 * limits.file_mb << 20), "--tmpfs", "/tmp", "--remount-ro", "/dev", "--remount-ro", "/",
             "--chdir", "/tmp", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
             "--setenv", "LANG", "C.UTF-8", "--"]
    return argv


@cache
def isolation() -> Isolation:
    """Whether and how this host isolates candidates: probes bubblewrap once with a real sandboxed run."""
    interpreter, prefix, user = _interpreter()
    if shutil.which("bwrap") is None:
        return Isolation(interpreter, prefix, user, "bubblewrap (bwrap) is not installed")
    iso = Isolation(interpreter, prefix, user, None)
    probe = bwrap_argv(iso, Limits()) + [interpreter, "-I", "-S", "-c", "import socket; print(socket.gethostname())"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False, **_as_user(user))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Isolation(interpreter, prefix, user, f"bubblewrap failed to start ({exc})")
    if done.returncode != 0 or done.stdout.strip() != "sandbox":
        reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return Isolation(interpreter, prefix, user, f"bubblewrap cannot make a sandbox here ({reason}); "
                         "user namespaces may be disabled")
    return iso


def _interpreter() -> tuple[str, str, str | None]:
    """The Python that runs candidates and the prefix to bind for it. As root, bubblewrap is started as
    `nobody` so sandboxed processes have a kernel uid that is not root (the kernel exempts root from the
    process-count limit); that needs an interpreter `nobody` can reach, which the system's /usr/bin/python3
    is when ours lives under a private home."""
    ours = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    candidates = [(ours, sys.base_prefix), (os.path.realpath("/usr/bin/python3"), "/usr")]
    if os.geteuid() != 0:
        return ours, sys.base_prefix, None
    try:
        pwd.getpwnam(_NOBODY)
    except KeyError:
        return ours, sys.base_prefix, None
    for path, prefix in candidates:
        if os.path.isfile(path) and _world_reachable(path) and _world_reachable(prefix):
            return path, prefix, _NOBODY
    return ours, sys.base_prefix, None


def _world_reachable(path: str) -> bool:
    """Every directory above `path` is searchable by others, and `path` itself is readable by them."""
    real = Path(os.path.realpath(path))
    if not real.exists() or not real.stat().st_mode & 0o004:
        return False
    return all(parent.stat().st_mode & 0o001 for parent in real.parents)


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")
