"""Run the engine as a child and pass its output on with a secret replaced, to the last byte.

An engine that holds the API key may print it (SGLang logs its server_args, key included, at start), so
with a key its output goes through a filter. Filters beside an `exec`'d engine die with it before they
flush (the kernel kills a PID namespace's processes when its first one exits): its last lines, usually
why it crashed, were lost. Here the supervisor stays: it forwards the stop signals to the engine, reaps
every orphan it inherits as PID 1, reads both pipes until they close, and exits with the engine's status.
"""

from __future__ import annotations

import base64
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


# A piece of an encoded secret shorter than this is not redacted on its own (a base64 run cut by its
# neighbours' bits, a key's end at a line break): a few characters tell nothing, and matching them would
# redact ordinary words.
MIN_PIECE = 6


def _base64_pieces(secret: bytes) -> set[str]:
    """The characters that encode `secret` alone inside a longer base64 text (such as `user:key` in a Basic
    header), at each of the three alignments, in the standard and the URL-safe alphabet."""
    pieces = set()
    for offset in range(3):
        text = base64.b64encode(b"\0" * offset + secret).decode().rstrip("=")
        start = -(-offset * 8 // 6)  # characters holding a bit of the bytes before
        end = (offset + len(secret)) * 8 // 6  # characters holding only the secret's bits
        piece = text[start:end]
        pieces |= {piece, piece.replace("+", "-").replace("/", "_")}
    return pieces


def secret_forms(secret: str) -> list[bytes]:
    """`secret` as it may appear in a log: as is, Python repr-escaped, JSON-escaped (once and twice, as a JSON
    string inside a JSON string), URL-escaped, hex and base64 (standard and URL-safe, at any alignment).
    Longest first, so that a form containing another is replaced whole."""
    escaped = {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    escaped |= {json.dumps(form)[1:-1] for form in escaped}
    raw = secret.encode()
    encoded = {quote(secret, safe=""), quote_plus(secret, safe=""), raw.hex(), raw.hex().upper(),
               *_base64_pieces(raw)}
    forms = escaped | {f for f in encoded if len(f) >= MIN_PIECE}
    return sorted((f.encode() for f in forms if f), key=len, reverse=True)


def redact(line: bytes, forms: Iterable[bytes]) -> bytes:
    for form in forms:
        line = line.replace(form, REDACTED)
    return line


class Redactor:
    """Redacts a stream line by line, as it comes, a secret wrapped across lines included: the end of a line
    that begins a form (MIN_PIECE characters or more) is redacted, and the start of the next line that
    completes a form the previous line began."""

    def __init__(self, forms: list[bytes]) -> None:
        self.forms = forms
        self.pending: list[bytes] = []  # the rests of the forms the last line ended in the middle of
        # For each form, by byte: the lengths of its beginnings that end in that byte, longest first (a line
        # ending in that byte can only end in those).
        self.beginnings: list[tuple[bytes, dict[int, list[int]]]] = []
        for form in forms:
            sizes: dict[int, list[int]] = {}
            for size in range(len(form) - 1, 0, -1):
                sizes.setdefault(form[size - 1], []).append(size)
            self.beginnings.append((form, sizes))

    def line(self, line: bytes) -> bytes:
        body = line.rstrip(b"\r\n")
        ending = line[len(body):]
        indent = body[:len(body) - len(body.lstrip())]
        rest = next((r for r in sorted(self.pending, key=len, reverse=True) if body.lstrip().startswith(r)), None)
        if rest is not None:
            body = indent + REDACTED + body[len(indent) + len(rest):]
        body = redact(body, self.forms)
        self.pending = []
        cut = 0
        for form, sizes in self.beginnings if body else ():
            for size in sizes.get(body[-1], ()):
                if body.endswith(form[:size]):
                    self.pending.append(form[size:])
                    if size >= MIN_PIECE:
                        cut = max(cut, size)
                    break
        if cut:
            body = body[:-cut] + REDACTED
        return body + ending


def _pump(source: IO[bytes], sink: IO[bytes], forms: list[bytes]) -> None:
    """Copy `source` to `sink` line by line, as it comes, each line redacted."""
    redactor = Redactor(forms)
    for line in iter(source.readline, b""):
        sink.write(redactor.line(line))
        sink.flush()
    source.close()


def supervise(argv: Sequence[str], env: dict[str, str], secrets: Sequence[str]) -> int:
    """Run `argv` with `env`, its stdout and stderr passed on with every form of each of `secrets` redacted;
    return its exit status (128 + N for a signal N, as a shell reports it)."""
    forms = sorted({f for secret in secrets if secret for f in secret_forms(secret)}, key=len, reverse=True)
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
