"""The engines' own auth with the keys the project hands them: the users' key opens the API, never the routes
that change the engine.

SGLang: its own `decide_request_auth` (sglang/srt/utils/auth.py of the pinned 0.5.17 wheel,
$ORNITH_SGLANG0517_SRC, as tests/unit/test_engine_flags.py reads the wheels), fed the --config file the
entrypoint writes (turned into flags by SGLang's own ConfigArgumentMerger), on every route http_server.py
marks ADMIN_OPTIONAL or ADMIN_FORCE. Without `admin-api-key` in that file the users' key opened them all.

vLLM: 0.24.0 guards only /v1, /v2 and /inference (its GUARDED_PREFIX, read in $ORNITH_VLLM024_SRC); the
project's guard (engine_guard.RequireKey, added through vLLM's own --middleware) asks for the key on every
other route but health and metrics, driven here as vLLM's Starlette app drives it.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from ornith_stack.engine_guard import RequireKey
from ornith_stack.engines import adapter_for
from ornith_stack.profiles import load_profile

CACHE = Path(os.environ.get("ORNITH_CACHE_DIR", Path(__file__).resolve().parents[2] / ".cache"))
SGLANG = Path(os.environ.get("ORNITH_SGLANG0517_SRC", CACHE / "sglang-0.5.17-src")) / "sglang" / "srt"
VLLM = Path(os.environ.get("ORNITH_VLLM024_SRC", CACHE / "vllm-0.24.0-src")) / "vllm"
KEY, OPERATOR = "users-k3y-0123456789", "op3rator-k3y-9876543210"
# The admin routes the security review found open to the users' key (issue 42).
NAMED = {
    "/update_weights_from_disk",
    "/init_weights_update_group",
    "/send_weights_to_remote_instance",
    "/configure_logging",
    "/release_memory_occupation",
    "/pause_generation",
}


def _module(path: Path, name: str) -> ModuleType:
    if not path.is_file():
        pytest.skip(f"{path} is missing (scripts/test.sh unpacks the engine wheels' Python files)")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _routes_by_level(http_server: Path) -> dict[str, set[tuple[str, str]]]:
    """(method, path) of every route of http_server.py, by the AuthLevel its @auth_level names (NORMAL: none)."""
    found: dict[str, set[tuple[str, str]]] = {}
    for node in ast.walk(ast.parse(http_server.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        level, routes = "NORMAL", []
        for decorator in node.decorator_list:
            if not isinstance(decorator, ast.Call):
                continue
            called = decorator.func
            if isinstance(called, ast.Name) and called.id == "auth_level":  # @auth_level(AuthLevel.X)
                level = ast.unparse(decorator.args[0]).rsplit(".", 1)[-1]
            elif isinstance(called, ast.Attribute) and called.attr in ("get", "post", "put", "delete", "api_route"):
                path = decorator.args[0] if decorator.args else None
                if isinstance(path, ast.Constant) and isinstance(path.value, str):
                    methods = [k.value for k in decorator.keywords if k.arg == "methods"]
                    names = (
                        [e.value for e in methods[0].elts if isinstance(e, ast.Constant)]
                        if methods and isinstance(methods[0], ast.List)
                        else [called.attr.upper()]
                    )
                    routes += [(str(m), path.value) for m in names]
        found.setdefault(level, set()).update(routes)
    return found


@pytest.fixture(scope="module")
def sglang_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """api_key and admin_api_key as SGLang reads them from the --config file the entrypoint writes."""
    merger = _module(SGLANG / "server_args_config_parser.py", "sglang_config_parser").ConfigArgumentMerger()
    handoff = adapter_for(load_profile("gpu96")).api_key_handoff(KEY, tmp_path_factory.mktemp("key"), OPERATOR)
    flag, path = handoff.args
    assert flag == "--config" and (Path(path).stat().st_mode & 0o777) == 0o600
    words = merger._convert_config_to_args(json.loads(Path(path).read_text()))
    flags = dict(zip(words[::2], words[1::2], strict=True))
    assert "admin_api_key" in (SGLANG / "server_args.py").read_text()  # a ServerArgs field of 0.5.17
    return {"api_key": flags["--api-key"], "admin_api_key": flags["--admin-api-key"]}


def test_the_users_key_is_refused_on_every_sglang_admin_route(sglang_keys: dict[str, str]) -> None:
    auth = _module(SGLANG / "utils" / "auth.py", "sglang_auth")
    levels = _routes_by_level(SGLANG / "entrypoints" / "http_server.py")
    admin = {(level, route) for level in ("ADMIN_OPTIONAL", "ADMIN_FORCE") for route in levels.get(level, ())}
    assert NAMED <= {path for _, (_, path) in admin}, "http_server.py no longer marks a route the issue names"

    def allowed(level: str, method: str, path: str, key: str | None) -> bool:
        return auth.decide_request_auth(
            method=method,
            path=path,
            authorization_header=key and f"Bearer {key}",
            auth_level=auth.AuthLevel[level],
            **sglang_keys,
        ).allowed

    for level, (method, path) in sorted(admin):
        assert not allowed(level, method, path, KEY), (method, path)
        assert not allowed(level, method, path, None), (method, path)
        assert allowed(level, method, path, OPERATOR), (method, path)
    assert allowed("NORMAL", "POST", "/v1/chat/completions", KEY)
    assert not allowed("NORMAL", "POST", "/v1/chat/completions", None)
    assert allowed("NORMAL", "GET", "/health", None) and allowed("NORMAL", "GET", "/metrics", None)


def test_vllm_guards_only_its_v1_prefixes_upstream_and_takes_a_middleware_class() -> None:
    utils = VLLM / "entrypoints" / "serve" / "utils" / "server_utils.py"
    api_server = VLLM / "entrypoints" / "openai" / "api_server.py"
    if not utils.is_file():
        pytest.skip(f"{utils} is missing (scripts/test.sh unpacks the engine wheels' Python files)")
    assert 'GUARDED_PREFIX = ("/v1", "/v2", "/inference")' in utils.read_text()  # /invocations: open upstream
    text = api_server.read_text()
    assert "for middleware in args.middleware:" in text and "app.add_middleware(imported)" in text


async def _ok(scope: dict, receive: object, send) -> None:  # type: ignore[no-untyped-def]
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"served"})


class Guarded:
    """Requests to the guard around an app that answers "served", over ASGI as uvicorn would send them."""

    def __init__(self) -> None:
        self.app = RequireKey(_ok)  # reads $VLLM_API_KEY now, as when vLLM builds its app

    def request(self, method: str, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)  # type: ignore[arg-type]
            async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
                return await client.request(method, path, headers=headers)

        return asyncio.run(send())


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> Guarded:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    return Guarded()


ROUTES = [
    ("POST", "/invocations"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/pooling"),
    ("POST", "/classify"),
    ("POST", "/score"),
    ("GET", "/server_info"),
    ("POST", "/pause"),
    ("POST", "/collective_rpc"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/healthz"),
    ("GET", "/metricsx"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_the_vllm_guard_asks_for_the_key_on_every_route_but_health_and_metrics(
    guarded: Guarded, method: str, path: str
) -> None:
    assert guarded.request(method, path).status_code == 401
    assert guarded.request(method, path, headers={"Authorization": "Bearer not-it"}).status_code == 401
    refused = guarded.request(method, path, headers={"Authorization": f"Basic {KEY}"})
    assert refused.status_code == 401 and refused.json() == {"error": "Unauthorized"}
    assert guarded.request(method, path, headers={"Authorization": f"Bearer {KEY}"}).text == "served"


@pytest.mark.parametrize("path", ["/health", "/metrics", "/ping", "/metrics/"])
def test_the_vllm_guard_leaves_health_and_metrics_open(guarded: Guarded, path: str) -> None:
    assert guarded.request("GET", path).text == "served"


def test_without_a_key_the_vllm_guard_guards_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert Guarded().request("POST", "/invocations").text == "served"


def test_the_entrypoint_adds_the_guard_to_vllm_with_the_key_only(tmp_path: Path) -> None:
    adapter = adapter_for(load_profile("cpu-demo"))
    handoff = adapter.api_key_handoff(KEY, tmp_path)
    assert handoff.args == ("--middleware", "ornith_stack.engine_guard.RequireKey") and handoff.env == ("VLLM_API_KEY",)
    assert adapter.api_key_handoff("", tmp_path, OPERATOR).args == ()
