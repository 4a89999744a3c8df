"""Loopback TCP ports for test servers, reserved until the test process ends (tests/ is on sys.path beside its
conftest.py).

A port found free and then let go can be taken by anyone before its server binds it (a CI run lost 17 set-ups
of test_ansible.py that way: "bind: address already in use"). So the port stays bound here, by a socket that
never listens, for as long as this process lives: the kernel hands it to no other bind(0) or outgoing
connection, while the server the test hands it to binds it beside the reservation. Every server the tests
start binds with SO_REUSEADDR (Python's socket.create_server and socketserver, Go's net.Listen: Prometheus,
Alertmanager, docker-proxy; Rust's std and tokio: the Model Gateway; uvicorn: the engines), which Linux lets
share the port with a bound socket that does not listen. Nothing listens on a reserved port before its server
does, so a connection to it is refused: a dead target too.
"""

from __future__ import annotations

import socket

_HELD: list[socket.socket] = []  # the reservations; closed when the process exits


def free_port(host: str = "127.0.0.1") -> int:
    """A port reserved for this test process: no other process can take it; its server binds it next."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    _HELD.append(sock)
    return int(sock.getsockname()[1])
