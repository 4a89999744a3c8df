"""The code sandbox: runaway, snooping or networking solutions are stopped and counted as failed."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from ornith_stack.bench.checkers import check_humaneval
from ornith_stack.bench.sandbox import Limits, run_program

PROMPT = 'def solve() -> int:\n    """Return 1."""\n'
TEST = "def check(candidate):\n    assert candidate() == 1\n"


def _answer(body: str) -> str:
    return "```python\ndef solve():\n" + "".join(f"    {line}\n" for line in body.splitlines()) + "```"


def test_a_correct_solution_passes() -> None:
    assert check_humaneval(PROMPT, _answer("return 1"), TEST, "solve").passed


def test_a_solution_that_loops_forever_is_killed_at_the_time_limit() -> None:
    started = time.monotonic()
    verdict = check_humaneval(PROMPT, _answer("while True:\n    pass\nreturn 1"), TEST, "solve", Limits(wall_s=2))
    assert not verdict.passed
    assert verdict.detail.startswith("timeout")
    assert time.monotonic() - started < 10


def test_a_sleeping_solution_is_killed_too() -> None:
    result = run_program("import time\ntime.sleep(60)\n", Limits(wall_s=1.5))
    assert (result.passed, result.status) == (False, "timeout")


def test_reading_a_file_outside_the_sandbox_fails(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("hunter2")
    body = f"data = open({str(secret)!r}).read()\nreturn 1 if data == 'hunter2' else 0"
    verdict = check_humaneval(PROMPT, _answer(body), TEST, "solve")
    assert not verdict.passed
    assert "outside the sandbox" in verdict.detail
    for program in ("open('/etc/hostname').read()", "open('../escape.txt', 'w').write('x')",
                    "import os\nos.listdir('/')"):
        assert not run_program(program).passed, program


def test_files_inside_the_sandbox_directory_are_fine() -> None:
    assert run_program("open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'\n").passed


def test_opening_a_socket_fails_and_nothing_reaches_the_listener() -> None:
    received: list[bytes] = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(5)
    port = server.getsockname()[1]

    def accept() -> None:
        try:
            conn, _ = server.accept()
            received.append(conn.recv(100))
            conn.close()
        except OSError:
            pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    body = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}))\ns.sendall(b'leak')\nreturn 1"
    verdict = check_humaneval(PROMPT, _answer(body), TEST, "solve")
    server.close()
    thread.join(timeout=6)
    assert not verdict.passed
    assert received == []


def test_subprocesses_and_early_exits_fail() -> None:
    assert not run_program("import subprocess\nsubprocess.run(['true'])\n").passed
    assert not run_program("import os\nos.system('true')\n").passed
    # Exiting with status 0 before the tests finish is not a pass.
    assert not run_program("import os\nos._exit(0)\n").passed


def test_a_memory_hog_fails_instead_of_eating_the_host() -> None:
    result = run_program("blob = bytearray(8 * 1024**3)\n", Limits(wall_s=5, memory_mb=512))
    assert not result.passed
