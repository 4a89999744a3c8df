"""Run generated code against unit tests in a confined child process.

Layers, each cheap and independent:
- a fresh temporary directory as the working directory, removed afterwards;
- `python -I` with a clean environment, and a guard installed before the program runs: a PEP 578 audit
  hook that refuses files outside the temporary directory (reads of Python's own library are allowed,
  imports need them), sockets, subprocesses and ctypes;
- a private network namespace (`unshare -rn`) where the kernel allows unprivileged user namespaces,
  so even code that slips past the hook has no network;
- resource limits (CPU seconds, address space, file size, open files, no core dumps) and a wall-clock
  limit after which the whole process group is killed.

A run passes only when the program exits 0 *and* prints a per-run random token after the tests: code
that calls `os._exit(0)` or `sys.exit(0)` before the tests cannot pass. This confines honest mistakes
and casual escapes of model-written code; it is not a boundary against a determined adversary.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_GUARD = r'''
import os, sys

def _install(root, readable):
    sep = os.sep
    root = os.path.realpath(root)
    readable = tuple(os.path.realpath(p) for p in readable)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    path_events = {"os.listdir": False, "os.scandir": False, "os.chdir": False, "os.mkdir": True,
                   "os.remove": True, "os.rmdir": True, "os.rename": True, "os.chmod": True,
                   "os.chown": True, "os.truncate": True, "os.utime": True, "os.symlink": True,
                   "os.link": True, "shutil.rmtree": True, "shutil.copyfile": True}
    banned = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
              "os.forkpty", "os.kill", "os.killpg", "ctypes.", "socket.", "urllib.", "http.", "ftplib.",
              "smtplib.", "poplib.", "imaplib.", "nntplib.", "telnetlib.", "webbrowser.", "pty.")

    def inside(path, bases):
        return any(path == b or path.startswith(b.rstrip(sep) + sep) for b in bases)

    def check_path(path, write):
        if path is None or isinstance(path, int):
            return
        real = os.path.realpath(os.fsdecode(path))
        if inside(real, (root,)) or (not write and inside(real, readable)):
            return
        raise PermissionError(f"sandbox: {os.fsdecode(path)} is outside the sandbox directory")

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            write = any(c in (mode or "") for c in "wax+") or bool((flags or 0) & write_flags)
            check_path(path, write)
        elif event in path_events:
            check_path(args[0], path_events[event])
            if event in ("os.rename", "os.symlink", "os.link") and len(args) > 1:
                check_path(args[1], True)
        elif event == "import" and args[0].split(".")[0] in ("ctypes", "_ctypes", "cffi"):
            raise ImportError(f"sandbox: {args[0]} is not allowed")
        elif event.startswith(banned):
            raise PermissionError(f"sandbox: {event} is not allowed")

    sys.addaudithook(hook)

def _limit(cpu_s, memory_mb, file_mb, open_files):
    import resource
    for which, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_mb << 20),
                         (resource.RLIMIT_FSIZE, file_mb << 20), (resource.RLIMIT_NOFILE, open_files),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))

def _main():
    root, token = sys.argv[1], sys.argv[2]
    _limit(*(int(v) for v in sys.argv[3:7]))
    program = open(os.path.join(root, "program.py")).read()
    del sys.argv[1:]
    readable = [p for p in sys.path if p and os.path.isabs(p)] + [sys.prefix, sys.base_prefix,
                "/dev/null", "/dev/urandom"]
    code = compile(program, "program.py", "exec")
    _install(root, readable)
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    sys.stdout.flush()
    print("\n" + token, flush=True)

_main()
'''


@dataclass(frozen=True)
class RunResult:
    passed: bool
    status: str  # passed | failed | timeout | error
    detail: str
    duration_s: float
    network_namespace: bool


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    memory_mb: int = 1024
    file_mb: int = 16
    open_files: int = 64


def run_program(program: str, limits: Limits | None = None) -> RunResult:
    """Run `program` (solution plus its tests) in the sandbox; pass means exit 0 after the tests ran."""
    token = secrets.token_hex(16)
    root = Path(tempfile.mkdtemp(prefix="ornith-bench-"))
    try:
        (root / "program.py").write_text(program)
        (root / "guard.py").write_text(_GUARD)
        return _run(root, token, limits or Limits())
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(root: Path, token: str, limits: Limits) -> RunResult:
    netns = network_namespace_available()
    # The guard sets the resource limits itself before it reads the program (no preexec_fn: the bench
    # may have HTTP threads alive, and forking with threads must not run Python code in the child).
    sizes = (int(limits.wall_s) + 1, limits.memory_mb, limits.file_mb, limits.open_files)
    argv = [sys.executable, "-I", "-B", str(root / "guard.py"), str(root), token, *map(str, sizes)]
    if netns:
        argv = ["unshare", "--user", "--map-root-user", "--net", "--", *argv]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(root), "TMPDIR": str(root)}
    started = time.perf_counter()
    with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
        proc = subprocess.Popen(argv, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return RunResult(False, "timeout", f"timeout: killed after {limits.wall_s:g} s", limits.wall_s, netns)
    duration = time.perf_counter() - started
    stdout = (root / "stdout").read_text(errors="replace")
    stderr = (root / "stderr").read_text(errors="replace")
    if rc == 0 and stdout.rstrip().endswith(token):
        return RunResult(True, "passed", "", duration, netns)
    if rc < 0 and -rc in (signal.SIGXCPU, signal.SIGKILL):
        return RunResult(False, "timeout", f"timeout: killed by signal {-rc} (CPU limit)", duration, netns)
    detail = _last_line(stderr) or (f"exit status {rc}" if rc else "exited before the tests finished")
    return RunResult(False, "failed", detail, duration, netns)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@cache
def network_namespace_available() -> bool:
    """Whether this kernel lets us make a private network namespace without privileges."""
    if shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--", "true"],
                              check=False, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
