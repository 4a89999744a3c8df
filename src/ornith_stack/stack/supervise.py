"""Run the engine as a child and pass its output on with a secret replaced, to the last byte.

An engine that holds the API key may print it (SGLang logs its server_args, key included, at start), so
with a key its output goes through a filter. Filters beside an `exec`'d engine die with it before they
flush (the kernel kills a PID namespace's processes when its first one exits): its last lines, usually
why it crashed, were lost. Here the supervisor stays: it forwards the stop signals to the engine, reaps
every orphan it inherits as PID 1, reads both pipes until they close, and exits with the engine's status.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from typing import IO
from urllib.parse import quote, quote_plus

REDACTED = b"<redacted>"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# After the engine exits, how long its pipes may stay open (a grandchild still holding them) before the
# supervisor stops reading; an engine's own last lines are in the pipe by then.
DRAIN_AFTER_EXIT_S = 10.0


def secret_forms(secret: str) -> list[bytes]:
    """`secret` as it may appear in a log: as is, Python repr-escaped, JSON-escaped and URL-escaped.
    Longest first, so that a form containing another is replaced whole."""
    forms = {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1],
             quote(secret, safe=""), quote_plus(secret, safe="")}
    return sorted((f.encode() for f in forms if f), key=len, reverse=True)


def redact(line: bytes, forms: Iterable[bytes]) -> bytes:
    for form in forms:
        line = line.replace(form, REDACTED)
    return line


def _pump(source: IO[bytes], sink: IO[bytes], forms: list[bytes]) -> None:
    """Copy `source` to `sink` line by line, as it comes, each line redacted."""
    for line in iter(source.readline, b""):
        sink.write(redact(line, forms))
        sink.flush()
    source.close()


def supervise(argv: Sequence[str], env: dict[str, str], secret: str) -> int:
    """Run `argv` with `env`, its stdout and stderr passed on with every form of `secret` redacted; return
    its exit status (128 + N for a signal N, as a shell reports it)."""
    forms = secret_forms(secret)
    try:
        # stdin stays the engine's own (inherited): only its output is filtered.
        proc = subprocess.Popen(list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        print(f"ornith-entrypoint: cannot start {argv[0]}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    assert proc.stdout is not None and proc.stderr is not None

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(proc.pid, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, sys.stdout.buffer, forms), daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, sys.stderr.buffer, forms), daemon=True)]
    for pump in pumps:
        pump.start()
    status = _wait_reaping(proc.pid)
    proc.returncode = status  # reaped above; Popen must not wait for it again
    for pump in pumps:
        pump.join(DRAIN_AFTER_EXIT_S)
    return status


def _wait_reaping(pid: int) -> int:
    """Wait for `pid`, reaping any other child on the way (orphans re-parented to PID 1); its exit status."""
    while True:
        try:
            done, status = os.waitpid(-1, 0)
        except ChildProcessError:  # someone else reaped it: nothing more to learn
            return 1
        if done == pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code
