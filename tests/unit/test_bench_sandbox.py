"""The code sandbox: the escapes that beat the old in-process audit hook, each contained.

Every escape runs as the solution under test, then tries one thing the sandbox must stop: read a file
of the host, write a file on the host, reach a listener on 127.0.0.1, read a secret from the bench's
environment, or forge a pass. The host-side effect is checked on the host, and the verdict must be a fail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ornith_stack.bench.checkers import check_humaneval
from ornith_stack.bench.sandbox import CodeJob, Limits, SandboxUnavailable, isolation, run_tests

SECRET = "hunter2-" + uuid.uuid4().hex
PROMPT = 'def solve() -> int:\n    """Return 1."""\n'
TEST = "def check(candidate):\n    assert candidate() == 1\n"

# Each escape runs ACTION (Python source that stores what it got in `result`) its own way and leaves
# the outcome in /tmp/outcome, which `probe()` returns.
ESCAPES = {
    # The old guard resolved paths with os.path.realpath: replacing it made every path look inside.
    "realpath": "import os.path\nos.path.realpath = lambda p, **k: '/tmp'\nexec(ACTION)\n",
    # The old guard's closure was reachable through gc and could be rewritten to allow everything.
    "gc-closure": textwrap.dedent("""\
        import gc
        for f in gc.get_objects():
            if getattr(f, '__name__', '') in ('hook', 'check_path', 'inside') and getattr(f, '__closure__', None):
                for cell in f.__closure__:
                    if isinstance(cell.cell_contents, (str, tuple)):
                        cell.cell_contents = '/'
        exec(ACTION)
        """),
    # Audit hooks do not follow code into a subinterpreter.
    "subinterpreter": textwrap.dedent("""\
        try:
            import _xxsubinterpreters as interpreters
        except ImportError:
            import _interpreters as interpreters  # Python 3.13 and later
        interp = interpreters.create()
        interpreters.run_string(interp, "ACTION = " + repr(ACTION) + "\\nexec(ACTION)\\n"
                                "open('/tmp/outcome', 'w').write(str(result))")
        """),
    # _posixsubprocess.fork_exec starts a process without the audit events subprocess raises.
    "fork-exec": textwrap.dedent("""\
        import _posixsubprocess, os, sys
        code = "ACTION = " + repr(ACTION) + "\\nexec(ACTION)\\nopen('/tmp/outcome', 'w').write(str(result))"
        args = [sys.executable, '-c', code]
        err_r, err_w = os.pipe()
        common = [args, [os.fsencode(sys.executable)], True, (), None, None, -1, -1, -1, -1, -1, -1,
                  err_r, err_w, True, False, -1, None, None, None, -1, None]
        try:
            pid = _posixsubprocess.fork_exec(*common, False)  # 3.11.3 and later take allow_vfork
        except TypeError:
            pid = _posixsubprocess.fork_exec(*common)
        os.waitpid(pid, 0)
        """),
}


def _solution(escape: str, action: str) -> str:
    return (
        f"ACTION = {action!r}\n"
        "result = 'nothing'\n"
        "try:\n"
        + textwrap.indent(ESCAPES[escape], "    ")
        + "except BaseException as exc:\n"
        "    result = 'blocked: ' + repr(exc)\n"
        "import os\n"
        "if not os.path.exists('/tmp/outcome'):\n"
        "    open('/tmp/outcome', 'w').write(str(result))\n"
        "def probe():\n"
        "    return open('/tmp/outcome').read()\n"
    )


def _run(escape: str, action: str, expect: str) -> bool:
    """Run the escape; True when the judge saw `probe()` return `expect` (the escape worked)."""
    job = CodeJob(_solution(escape, action), setup="", tests=f"assert probe() == {expect!r}\n", functions=("probe",))
    return run_tests(job, Limits(wall_s=15)).passed


@pytest.fixture(scope="module", autouse=True)
def _needs_bubblewrap() -> None:
    # CI installs bubblewrap (scripts/test.sh): a host without it fails here rather than skipping.
    assert isolation().problem is None, isolation().problem


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    received: list[bytes] = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            received.append(conn.recv(100) or b"connected")
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], received
    stop.set()
    thread.join(timeout=2)
    server.close()


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_each_escape_really_runs_its_action(escape: str) -> None:
    """The escapes below fail because the sandbox stops them, not because the trick itself broke."""
    assert _run(escape, "import sys\nresult = 'ran on ' + sys.platform", "ran on linux")


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_an_escape_cannot_read_a_host_file(escape: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    assert not _run(escape, f"result = open({str(secret)!r}).read()", SECRET)


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_an_escape_cannot_write_a_host_file(escape: str, tmp_path: Path) -> None:
    target = tmp_path / "written-from-the-sandbox.txt"
    action = f"import os\nos.makedirs({str(tmp_path)!r}, exist_ok=True)\nopen({str(target)!r}, 'w').write('x')\nresult = 'done'"
    _run(escape, action, "done")  # it may write into its own tmpfs: the host's file is what matters
    assert not target.exists()


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_an_escape_cannot_reach_a_loopback_listener(escape: str, listener: tuple[int, list[bytes]]) -> None:
    port, received = listener
    action = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'leak')\nresult = 'sent'"
    assert not _run(escape, action, "sent")
    assert received == []


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_an_escape_cannot_read_the_bench_environment(escape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORNITH_SANDBOX_SECRET", SECRET)
    action = textwrap.dedent(f"""\
        import os
        found = [os.environ.get('ORNITH_SANDBOX_SECRET', '')]
        for pid in os.listdir('/proc'):
            try:
                found.append(open('/proc/' + pid + '/environ').read())
            except OSError:
                pass
        result = {SECRET!r} if any({SECRET!r} in text for text in found) else 'not found'
        """)
    assert not _run(escape, action, SECRET)


def test_a_solution_cannot_forge_a_pass() -> None:
    """The old pass token was readable from sys.orig_argv; there is no token now, and nothing the
    solution prints, writes on its pipes or returns makes the judge's asserts hold."""
    forgeries = [
        # Print a verdict, answer every call in advance with a constant, and leave before the tests.
        "import os, sys, json\nprint(json.dumps({'passed': True, 'detail': ''}), flush=True)\n"
        "print(sys.orig_argv, open('/proc/self/cmdline').read())\n"
        "for fd in range(3, 12):\n"
        "    try:\n        os.write(fd, b\"('ready', None)\\n\" + b\"('ok', 1)\\n\" * 50)\n"
        "    except OSError:\n        pass\n"
        "os._exit(0)\n",
        # An object that claims equality with everything.
        "class Anything:\n    def __eq__(self, other):\n        return True\n"
        "    def __repr__(self):\n        return 'Anything()'\n"
        "def add(a, b):\n    return Anything()\n",
        # Reach the judge through /proc: it is in another PID namespace.
        "import os, signal\nfor pid in filter(str.isdigit, os.listdir('/proc')):\n    try:\n"
        "        if b'judge' in open('/proc/' + pid + '/cmdline', 'rb').read() and int(pid) != os.getpid():\n"
        "            os.kill(int(pid), signal.SIGKILL)\n    except OSError:\n        pass\n"
        "def add(a, b):\n    return 0\n",
    ]
    tests = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert add(10, 5) == 15\n"
    for solution in forgeries:
        result = run_tests(CodeJob(solution, "", tests, ("add",)))
        assert not result.passed, solution


def test_the_sandbox_is_minimal_and_read_only() -> None:
    solution = textwrap.dedent("""\
        import os
        def listing():
            return sorted(os.listdir('/'))
        def environment():
            return dict(os.environ)
        def can_write(path):
            try:
                open(path, 'w').write('x')
                return True
            except OSError:
                return False
        def processes():
            return sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
        """)
    tests = textwrap.dedent("""\
        assert set(listing()) <= {'bin', 'dev', 'lib', 'lib32', 'lib64', 'libx32', 'proc', 'sbin', 'tmp', 'usr', 'root'}, listing()
        assert set(environment()) <= {'PATH', 'HOME', 'LANG', 'PWD', 'LC_CTYPE'}, environment()
        assert not can_write('/usr/ornith-sandbox-test')
        assert can_write('/tmp/scratch.txt')
        assert len(processes()) <= 3, processes()
        """)
    result = run_tests(CodeJob(solution, "", tests, ("listing", "environment", "can_write", "processes")))
    assert result.passed, result.detail


BIG = 120 << 20  # more than any writable mount of the sandbox holds


def test_120_mib_cannot_be_written_to_the_root_dev_or_dev_shm() -> None:
    """The root and /dev are read-only; /dev/shm and /tmp are tmpfs of a stated size (host RAM otherwise)."""
    solution = textwrap.dedent("""\
        import os
        def written(path, size):
            done = 0
            try:
                with open(path, 'wb', buffering=0) as out:
                    while done < size:
                        done += out.write(b'x' * min(1 << 20, size - done))
            except OSError:
                pass
            return done
        def shm_files(count, size):
            return sum(written('/dev/shm/f%d' % i, size) for i in range(count))
        """)
    limits = Limits(wall_s=20)
    tests = textwrap.dedent(f"""\
        assert written('/ornith-big', {BIG}) == 0
        assert written('/dev/ornith-big', {BIG}) == 0
        assert written('/dev/shm/big', {BIG}) <= {limits.file_mb << 20}
        # Many files cannot add up past the mount's size either.
        assert shm_files(12, 10 << 20) <= {limits.file_mb << 20}, shm_files(12, 10 << 20)
        assert written('/tmp/big', {BIG}) <= {limits.file_mb << 20}
        """)
    result = run_tests(CodeJob(solution, "", tests, ("written", "shm_files")), limits)
    assert result.passed, result.detail


def test_eight_forked_children_stay_inside_the_documented_memory_bound() -> None:
    """Each process is held to memory_mb (address space) and the sandbox to `processes` of them, so the
    whole sandbox holds at most processes x memory_mb plus its tmpfs mounts."""
    limits = Limits(wall_s=30)
    assert limits.memory_bound_mb == limits.processes * limits.memory_mb + 3 * limits.file_mb == 8240
    solution = textwrap.dedent("""\
        import os, time
        def children(count, mb):
            pids = []
            for _ in range(count):
                pid = os.fork()
                if pid == 0:
                    try:
                        blob = bytearray(mb << 20)
                        blob[::4096] = b'x' * len(blob[::4096])
                        os._exit(0)
                    except MemoryError:
                        os._exit(3)
                pids.append(pid)
            return sorted(os.waitpid(pid, 0)[1] >> 8 for pid in pids)
        """)
    tests = textwrap.dedent(f"""\
        # Eight children each asking for more than one process may hold: every one is refused.
        assert children(8, {limits.memory_mb + 64}) == [3] * 8, children(8, {limits.memory_mb + 64})
        # Asking for less than the limit works, so the refusals above are the limit's.
        assert children(8, 64) == [0] * 8
        """)
    result = run_tests(CodeJob(solution, "", tests, ("children",)), limits)
    assert result.passed, result.detail


def test_a_16_mib_reply_cannot_push_the_judge_past_its_memory_limit(tmp_path: Path) -> None:
    """A reply whose literal would take gigabytes of syntax tree to parse is refused unread; every child
    of the run (judge, bubblewrap, candidate) stays under the judge's 1 GiB limit, measured in a fresh
    interpreter so no other test's children count."""
    from ornith_stack.bench.sandbox_child import JUDGE_MEMORY_MB, MAX_REPLY

    code = textwrap.dedent("""\
        import json, resource
        from ornith_stack.bench.sandbox import CodeJob, Limits, run_tests
        solution = "def big():\\n    return [0] * (8 << 20)\\n"
        result = run_tests(CodeJob(solution, "", "big()\\n", ("big",)), Limits(wall_s=30, memory_mb=1024))
        print(json.dumps({"passed": result.passed, "detail": result.detail,
                          "max_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert not outcome["passed"] and f"longer than {MAX_REPLY} characters" in outcome["detail"], outcome
    assert outcome["max_rss_mb"] < JUDGE_MEMORY_MB, outcome


def test_the_sandbox_cannot_make_another_user_namespace() -> None:
    solution = textwrap.dedent("""\
        import ctypes
        def unshare():
            libc = ctypes.CDLL(None, use_errno=True)
            return 'made' if libc.unshare(0x10000000) == 0 else 'refused'  # CLONE_NEWUSER
        """)
    result = run_tests(CodeJob(solution, "", "assert unshare() == 'refused', unshare()\n", ("unshare",)))
    assert result.passed, result.detail


def test_correct_code_passes_and_its_demo_block_does_not_run() -> None:
    answer = "```python\ndef solve():\n    return 1\n\nif __name__ == '__main__':\n    raise SystemExit(3)\n```"
    assert check_humaneval(PROMPT, answer, TEST, "solve").passed


def test_a_runaway_tree_is_killed_at_the_wall_clock_limit() -> None:
    marker = f"ornith-sandbox-{uuid.uuid4().hex}"
    solution = (f"import subprocess\nsubprocess.Popen(['sleep', '300', {marker!r}])\n"
                "import time\ntime.sleep(300)\n")
    result = run_tests(CodeJob(solution, "", "assert add(1, 1) == 2\n", ("add",)), Limits(wall_s=2))
    assert (result.passed, result.status) == (False, "timeout")
    survivors = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                survivors.append(cmdline.parent.name)
        except OSError:
            pass
    assert survivors == []


def test_a_busy_loop_and_a_memory_hog_fail() -> None:
    loop = run_tests(CodeJob("while True:\n    pass\n", "", "assert f() == 1\n", ("f",)), Limits(wall_s=2))
    assert (loop.passed, loop.status) == (False, "timeout")
    hog = run_tests(CodeJob("blob = bytearray(8 * 1024**3)\ndef f():\n    return 1\n", "", "assert f() == 1\n",
                            ("f",)), Limits(wall_s=5, memory_mb=512))
    assert not hog.passed and "MemoryError" in hog.detail


def test_a_fork_bomb_hits_the_process_limit() -> None:
    solution = textwrap.dedent("""\
        import os
        def forks():
            n = 0
            try:
                while n < 200:
                    if os.fork() == 0:
                        import time
                        time.sleep(5)
                        os._exit(0)
                    n += 1
            except OSError:
                pass
            return n
        """)
    result = run_tests(CodeJob(solution, "", "assert forks() < 200, forks()\n", ("forks",)), Limits(wall_s=10))
    assert result.passed, result.detail


def _without_bwrap(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter whose PATH has no bubblewrap."""
    env = {"PATH": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def test_without_bubblewrap_code_is_refused_unless_the_user_opts_in(tmp_path: Path) -> None:
    code = textwrap.dedent("""\
        from ornith_stack.bench.sandbox import Limits, SandboxUnavailable, CodeJob, run_tests
        job = CodeJob("def f():\\n    return 1\\n", "", "assert f() == 1\\n", ("f",))
        try:
            run_tests(job)
        except SandboxUnavailable as exc:
            print("refused:", exc)
        result = run_tests(job, Limits(unsafe_without_sandbox=True))
        print("unsafe:", result.passed, result.sandboxed)
        """)
    done = _without_bwrap(code, tmp_path)
    assert "refused: refusing to run model-written code: bubblewrap (bwrap) is not installed" in done.stdout, done.stderr
    assert "--unsafe-run-code-without-sandbox" in done.stdout
    assert "unsafe: True False" in done.stdout


def test_the_tasks_suite_refuses_before_sending_a_request(tmp_path: Path) -> None:
    code = textwrap.dedent("""\
        import sys
        from ornith_stack.cli import main
        sys.exit(main(["bench", "--url", "http://127.0.0.1:9", "--suite", "tasks", "--out", sys.argv[1]]))
        """)
    env = {"PATH": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out")], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "bubblewrap (bwrap) is not installed" in done.stderr
    assert "--unsafe-run-code-without-sandbox" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_refusal_is_a_user_error() -> None:
    from ornith_stack.errors import UserError

    assert issubclass(SandboxUnavailable, UserError)
