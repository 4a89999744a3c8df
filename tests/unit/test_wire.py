"""wire/ is the one layer of engine I/O: no other module speaks HTTP, reads an OpenAI stream or parses exposition
text itself, and what it does holds for every caller (the exporter, the canary, the bench, status, up, tune)."""

from __future__ import annotations

import ast
import asyncio
import gzip
import json
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from hostile import GOOD, RawTarget, behaviours, head

from ornith_stack.wire.http import WireError, fetch
from ornith_stack.wire.metrics import BadExposition, parse
from ornith_stack.wire.session import Session
from ornith_stack.wire.stream import BadStream, ChatStream

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "ornith_stack"
WIRE = PACKAGE / "wire"
# HTTP clients: only wire/ imports them.
CLIENTS = ("httpx", "aiohttp", "http.client", "urllib.request", "requests", "urllib3")
# socket outside wire/ only listens, never connects: the exporter's server (httpd.py, server.py) and the
# tuner's free loopback port (tune/measure.py).
LISTENERS = {"exporter/httpd.py", "exporter/server.py", "tune/measure.py"}
# What a client-side socket does.
CONNECTING = {"create_connection", "connect", "connect_ex"}
# Private names of the standard library that a module may read, and why: the bench's sandbox needs the
# interpreter a virtual environment was made from (no public name says it; venv itself reads this one).
PRIVATE_ALLOWED = {"bench/sandbox.py: sys._base_executable"}


def modules(outside_wire: bool = True) -> list[tuple[str, ast.Module]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if outside_wire and WIRE in path.parents:
            continue
        found.append((path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path))))
    return found


def imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_no_module_outside_wire_speaks_http_itself() -> None:
    found = []
    for name, tree in modules():
        found += [f"{name}: import {m}" for m in imports(tree) if m.split(".")[0] in CLIENTS or m in CLIENTS]
        found += [f"{name}: import socket" for m in imports(tree) if m == "socket" and name not in LISTENERS]
        found += [
            f"{name}:{node.lineno}: .{node.attr}()"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in CONNECTING
        ]
        text = (PACKAGE / name).read_text()
        found += [f"{name}: {lib}." for lib in ("httpx.", "aiohttp.") if lib in text.replace(f"{lib[:-1]}'s", "")]
    assert found == [], "HTTP outside wire/ (call wire.http.fetch or wire.http.Session):\n" + "\n".join(found)


def test_no_module_parses_exposition_or_sse_itself() -> None:
    """prometheus_client's parser is read through wire.metrics, server-sent events through wire.stream."""
    found = [
        f"{name}: prometheus_client.parser" for name, tree in modules() if "prometheus_client.parser" in imports(tree)
    ]
    found += [f"{name}: a data: line" for name, _ in modules() if '"data:' in (PACKAGE / name).read_text()]
    assert found == []


def test_no_private_attribute_of_a_library_is_used() -> None:
    """httpx's `_pool` once held the bench's deadline; a library's private names change without notice. In
    the modules that use an HTTP library only `self` has private attributes, and no module anywhere reaches
    a private name of something it imported from outside ornith_stack."""
    found = []
    for name, tree in modules(outside_wire=False):
        libraries = {
            alias.asname or alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            and not (
                isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("ornith_stack"))
            )
            for alias in node.names
        }
        speaks_http = bool({m.split(".")[0] for m in imports(tree)} & set(CLIENTS))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "setattr")
            ):
                if (
                    len(node.args) > 1
                    and isinstance(node.args[1], ast.Constant)
                    and str(node.args[1].value).startswith("_")
                ):
                    owner = node.args[0].id if isinstance(node.args[0], ast.Name) else ""
                    found.append(f"{name}: {owner}.{node.args[1].value}")
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            root: ast.expr = node.value
            while isinstance(root, ast.Attribute | ast.Subscript | ast.Call):
                root = root.func if isinstance(root, ast.Call) else root.value
            owner = root.id if isinstance(root, ast.Name) else ""
            if owner in libraries or (speaks_http and owner not in ("self", "cls")):
                found.append(f"{name}: {owner}.{node.attr}")
    assert set(found) - PRIVATE_ALLOWED == set()


def test_the_synchronous_callers_load_no_async_http_library() -> None:
    """The exporter (its image and its start), status, up and the tuner speak HTTP through wire.http, the
    standard library only: aiohttp and httpx are the bench's."""
    script = (
        "import sys\n"
        "import ornith_stack.exporter.server, ornith_stack.stack.bringup, ornith_stack.tune.measure\n"
        "print(sorted(m for m in ('aiohttp', 'httpx') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_the_wire_contract_forbids_every_other_module() -> None:
    """A top-level module left out of the `wire` import contract could be imported by wire/ unchecked."""
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    forbidden = set(next(c for c in contracts if c["id"] == "wire")["forbidden_modules"])
    allowed = {"ornith_stack.wire", "ornith_stack.errors", "ornith_stack.urls", "ornith_stack.__init__"}
    top = {
        f"ornith_stack.{p.stem if p.is_file() else p.name}"
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" or (p / "__init__.py").exists())
    }
    assert top - allowed - forbidden == set(), "add these to the wire contract in pyproject.toml"
    assert forbidden - top == set(), "the wire contract names modules that do not exist"


# -- one policy for the synchronous call and the bench's asynchronous layer ------------------------------
HTTP_FAULTS = ("trickle_close", "trickle_http10", "slow_headers", "early_close", "short_stalled")
DEADLINE_S = 0.8


def _async_reason(url: str) -> tuple[str, float]:
    async def once() -> tuple[str, float]:
        session = Session(DEADLINE_S)
        start = time.monotonic()
        try:
            await session.fetch("GET", url, 1 << 20)
        except WireError as exc:
            return exc.reason, time.monotonic() - start
        finally:
            await session.close()
        return "answered", time.monotonic() - start

    return asyncio.run(once())


def _sync_reason(url: str) -> tuple[str, float]:
    start = time.monotonic()
    try:
        fetch(url, DEADLINE_S)
    except WireError as exc:
        return exc.reason, time.monotonic() - start
    return "answered", time.monotonic() - start


@pytest.mark.parametrize("fault", HTTP_FAULTS)
def test_a_hostile_server_fails_both_calls_alike_within_the_deadline(fault: str) -> None:
    """A server that trickles its headers or body, or stops short of its length, costs the exporter's
    synchronous call and the bench's asynchronous one the same: the same reason, by the deadline."""
    behaviour, reason = behaviours(GOOD["vllm"].read_bytes())[fault]
    server = RawTarget(behaviour)
    try:
        sync, async_ = _sync_reason(server.url + "/metrics"), _async_reason(server.url + "/metrics")
    finally:
        server.close()
    assert sync[0] == async_[0] == reason, (sync, async_)
    assert sync[1] < DEADLINE_S + 0.5 and async_[1] < DEADLINE_S + 0.5, (sync, async_)


def test_nothing_listening_is_connect_in_both_calls() -> None:
    with socket.socket() as unused:  # bound, never listening: the port refuses connections
        unused.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{unused.getsockname()[1]}"
        assert _sync_reason(url)[0] == _async_reason(url)[0] == "connect"


@pytest.mark.parametrize("gzipped", [False, True])
def test_a_body_past_the_limit_is_refused_or_cut(gzipped: bool) -> None:
    """4 MiB of zeros gzip to 4 KiB: the limit counts what the body inflates to, so a gzip bomb stops
    at the limit."""
    body = b"0" * (4 << 20)
    sent = gzip.compress(body) if gzipped else body
    encoding = b"Content-Encoding: gzip\r\n" if gzipped else b""
    server = RawTarget(lambda conn, stop: conn.sendall(head(len(sent))[:-2] + encoding + b"\r\n" + sent))
    try:
        with pytest.raises(WireError, match="more than 1 MiB") as refused:
            fetch(server.url, 5, limit=1 << 20)
        assert refused.value.reason == "too_large"
        assert fetch(server.url, 5, limit=1 << 20, cut=True).body == body[: 1 << 20]
    finally:
        server.close()


# -- one stream reader -------------------------------------------------------------------------------------
def _stream(*events: object, clock_step: float = 1.0) -> ChatStream:
    ticks = iter(range(1, 100))
    stream = ChatStream(lambda: next(ticks) * clock_step)
    for event in events:
        stream.feed(f"data: {json.dumps(event)}\n\n".encode())
    stream.feed(b"data: [DONE]\n\n")
    stream.close()
    return stream


def test_time_to_first_token_and_the_decode_interval_are_timed_on_the_chunks_both_callers_use() -> None:
    """The role chunk ends TTFT (as `vllm bench serve`), the decode interval runs from the first to the
    last chunk with generated tokens: the closing chunk and the usage chunk are not in it."""
    stream = _stream(
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},  # t=1
        {"choices": [{"delta": {"reasoning_content": "hm"}}]},  # t=2
        {"choices": [{"delta": {"content": "4"}}]},  # t=3
        {"choices": [{"delta": {"content": "2"}}]},  # t=4
        {"choices": [{"delta": {}, "finish_reason": "stop"}]},  # t=5
        {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
    )  # t=6
    assert stream.ttft(0.0) == 1.0 and stream.decode_s() == 2.0 and stream.ended_at() == 5.0
    assert (stream.text, stream.reasoning, stream.finish_reason) == ("42", "hm", "stop")
    assert (stream.prompt_tokens, stream.completion_tokens) == (9, 3) and len(stream.itl()) == 4


@pytest.mark.parametrize(
    "event",
    [
        '"just a string"',
        "[1, 2]",
        '{"choices": ["x"]}',
        '{"choices": [{"delta": 3}]}',
        "{not json",
        '{"error": {"message": "overloaded"}}',
        "[" * 100_000,
    ],
)
def test_a_malformed_event_is_one_bad_stream(event: str) -> None:
    with pytest.raises(BadStream):
        ChatStream(time.monotonic).feed(f"data: {event}\n".encode())


# -- one metrics parser ------------------------------------------------------------------------------------
@pytest.mark.parametrize("engine", sorted(GOOD))
def test_the_exporters_fast_path_reads_what_prometheus_client_reads(engine: str) -> None:
    text = GOOD[engine].read_text()
    full = parse(text)
    keep = {name for name in full if name.endswith(("_total", "_bucket", "_sum"))}
    kept = parse(text, keep=keep)
    assert kept.keys() == keep
    for name in keep:
        assert [(s.labels, s.value) for s in kept[name]] == [(s.labels, s.value) for s in full[name]], name


def test_both_parsers_refuse_garbage() -> None:
    for keep in (None, {"x"}):
        with pytest.raises(BadExposition):
            parse("<html>not metrics</html>\n", keep=keep)
