"""A real loopback HTTP server standing in for an engine: its answers set per path, its requests counted."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Route:
    def __init__(self, body: str | bytes = b"", status: int = 200, delay: float = 0.0,
                 content_type: str = "text/plain; version=0.0.4") -> None:
        self.body = body.encode() if isinstance(body, str) else body
        self.status, self.delay, self.content_type = status, delay, content_type


class FakeEngine:
    """A real HTTP server whose answers a test sets per path."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.hits: dict[str, int] = {}  # requests per path
        self.posts: list[tuple[str, str, bytes]] = []  # POSTs: path, Authorization header, body
        self.lock = threading.Lock()
        routes, engine = self.routes, self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                with engine.lock:
                    engine.hits[path] = engine.hits.get(path, 0) + 1
                route = routes.get(path, Route(b"not found", 404))
                if route.delay:
                    time.sleep(route.delay)
                try:
                    self.send_response(route.status)
                    self.send_header("Content-Type", route.content_type)
                    for key, val in getattr(route, "headers", {}).items():
                        self.send_header(key, val)
                    self.send_header("Content-Length", str(len(route.body)))
                    self.end_headers()
                    self.wfile.write(route.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with engine.lock:
                    engine.posts.append((self.path.split("?")[0], self.headers.get("Authorization", ""), body))
                self.do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def metrics(self, text: str, **kw: object) -> None:
        self.routes["/metrics"] = Route(text, **kw)  # type: ignore[arg-type]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
