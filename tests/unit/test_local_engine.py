"""The engine launcher without an engine: argv from the profile, failure reports, clean stops."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import local_engine as le
import pytest

from ornith_stack.engines import adapter_for

VLLM = adapter_for("vllm")


def test_argv_comes_from_the_cpu_demo_profile_with_model_and_port_replaced(tmp_path: Path) -> None:
    profile = le.engine_profile(tmp_path)
    argv, env = le.engine_command(profile, port=12345)
    assert argv[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == str(tmp_path.resolve())
    assert argv[argv.index("--port") + 1] == "12345" and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--speculative-config" in argv and "--no-enable-prefix-caching" in argv
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"


def test_without_speculation_only_the_speculative_flag_goes(tmp_path: Path) -> None:
    with_spec, _ = le.engine_command(le.engine_profile(tmp_path), port=1)
    without, _ = le.engine_command(le.engine_profile(tmp_path, speculative=False), port=1)
    i = with_spec.index("--speculative-config")
    assert without == with_spec[:i] + with_spec[i + 2 :]


def test_an_engine_that_exits_is_reported_with_the_last_40_log_lines(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    script = "import sys\nfor i in range(100): print(f'line {i}')\nsys.exit(3)"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=fh, stderr=subprocess.STDOUT)
        with pytest.raises(le.EngineStartError) as caught:
            le._wait_healthy(proc, VLLM, f"http://127.0.0.1:{le.free_port()}", log, timeout_s=60)
    message = str(caught.value)
    assert message.startswith("the engine exited with status 3")
    assert message.splitlines()[1:] == [f"line {i}" for i in range(60, 100)]


def test_an_engine_that_never_answers_times_out_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(60)"],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            with pytest.raises(le.EngineStartError, match=r"not healthy after 2 s[^\n]*\nloading$"):
                le._wait_healthy(proc, VLLM, f"http://127.0.0.1:{le.free_port()}", log, timeout_s=2)
        finally:
            le.stop_process_group(proc)


def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    # The parent ignores SIGTERM and its child would outlive it: both must still go.
    proc, child = _group_with_a_child(tmp_path, ignore_sigterm=True)
    le.stop_process_group(proc, grace_s=1)
    assert proc.returncode is not None
    for _ in range(50):  # the child is reaped by init; give it a moment
        if not _alive(child):
            break
        time.sleep(0.1)
    assert not _alive(child)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin a process to one")
def test_an_engine_pinned_to_one_busy_core_is_allowed_every_core_while_it_starts(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        os.sched_setaffinity(proc.pid, {min(os.sched_getaffinity(0))})
        with pytest.raises(le.EngineStartError):
            le._wait_healthy(proc, VLLM, f"http://127.0.0.1:{le.free_port()}", log, timeout_s=1)
        assert os.sched_getaffinity(proc.pid) == os.sched_getaffinity(0)
    finally:
        le.stop_process_group(proc)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin a process to one")
def test_an_engine_that_binds_nothing_has_every_process_unpinned_while_it_starts(tmp_path: Path) -> None:
    """VLLM_CPU_OMP_THREADS_BIND=nobind: the worker too, not only the first process."""
    proc, child = _group_with_a_child(tmp_path)
    try:
        one_core = {min(os.sched_getaffinity(0))}
        for pid in (proc.pid, child):
            os.sched_setaffinity(pid, one_core)
        log = tmp_path / "engine.log"
        log.write_text("")
        with pytest.raises(le.EngineStartError):
            le._wait_healthy(proc, VLLM, f"http://127.0.0.1:{le.free_port()}", log, timeout_s=1, whole_group=True)
        assert os.sched_getaffinity(child) == os.sched_getaffinity(proc.pid) == os.sched_getaffinity(0)
    finally:
        le.stop_process_group(proc)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to pin a process to one")
def test_stop_allows_every_process_of_the_group_every_core_so_that_it_can_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A killed process that gets no CPU cannot finish exiting: the stop unpins the group first."""
    proc, child = _group_with_a_child(tmp_path)
    seen: list[set[int]] = []
    real_signal = le._signal_group

    def signal_and_look(pgid: int, sig: int) -> None:  # what the group was allowed when the signal went
        seen.append(os.sched_getaffinity(child))
        real_signal(pgid, sig)

    os.sched_setaffinity(child, {min(os.sched_getaffinity(0))})
    monkeypatch.setattr(le, "_signal_group", signal_and_look)
    le.stop_process_group(proc, grace_s=1)
    assert seen and seen[0] == os.sched_getaffinity(0)


def _group_with_a_child(tmp_path: Path, ignore_sigterm: bool = False) -> tuple[subprocess.Popen[bytes], int]:
    """A process group: a leader (optionally ignoring SIGTERM) and the child it started; returns both."""
    pidfile = tmp_path / "child.pid"
    script = (
        "import signal, subprocess, sys, time\n"
        + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_sigterm else "")
        + "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 30
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline, "the test process did not start its child"
        time.sleep(0.1)
    return proc, int(pidfile.read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def test_missing_engine_names_the_install_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(le.UserError, match="install-vllm-cpu.sh"):
        le.check_engine_installed(le.engine_profile(tmp_path))
