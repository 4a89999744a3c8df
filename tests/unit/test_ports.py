"""tests/ports.py: a reserved port cannot be taken by another process, and its server still binds it."""

from __future__ import annotations

import socket
import subprocess
import sys

from ports import free_port

TAKE = """
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(3)
"""


def test_another_process_cannot_take_a_reserved_port() -> None:
    port = free_port()
    taken = subprocess.run([sys.executable, "-c", TAKE, str(port)], check=False, timeout=60)
    assert taken.returncode == 3
    # And the kernel hands it to no bind(0) of this process either.
    others = []
    for _ in range(200):
        other = socket.socket()
        other.bind(("127.0.0.1", 0))
        others.append(other)
    assert port not in {o.getsockname()[1] for o in others}
    for other in others:
        other.close()


def test_the_server_binds_its_reserved_port_and_nothing_answers_before() -> None:
    port = free_port()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0  # refused: a dead target until its server listens
    with socket.create_server(("127.0.0.1", port)) as server, socket.create_connection(("127.0.0.1", port)):
        assert server.getsockname()[1] == port
