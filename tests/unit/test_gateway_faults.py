"""Faults survived behind the Model Gateway (issue 43, item 2), on the rendered compose file of a two-replica
profile: each engine restarts by its own restart policy, and the gateway runs with the retry, circuit-breaker
and health-check settings, every flag one that smg 0.3.2 itself accepts (its own --help, where installed)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ornith_stack import deployment
from ornith_stack.generate.profile_files import render_profile
from ornith_stack.profiles import from_data, load_profile


def two_replicas() -> dict[str, dict[str, object]]:
    data = load_profile("cpu-demo").model_dump(mode="json", exclude_none=True)
    data["name"], data["serve"]["replicas"] = "cpu-demo-x2", 2
    profile = from_data(data, Path("cpu-demo-x2.yaml"))
    return dict(yaml.safe_load(render_profile(profile, "compose.yml.j2", "compose"))["services"])


def test_a_killed_engine_is_restarted_by_its_restart_policy_and_its_healthcheck_gates_it() -> None:
    services = two_replicas()
    for name in deployment.engine_services(2):
        # unless-stopped: a crash or a SIGKILL (exit 137) restarts it; only `docker stop` / `down` does not.
        assert services[name]["restart"] == "unless-stopped", name
        assert "healthcheck" in services[name], name
    assert services["gateway"]["restart"] == "unless-stopped"


def flag(command: list[str], name: str) -> float:
    return float(command[command.index(name) + 1])


def test_the_gateway_retries_before_the_first_token_and_takes_a_dead_replica_out_in_the_stated_time() -> None:
    command = [str(w) for w in two_replicas()["gateway"]["command"]]  # type: ignore[union-attr]
    retries, breaker = flag(command, "--retry-max-retries"), flag(command, "--cb-failure-threshold")
    # smg counts the first attempt: the last one comes after the dead replica's breaker opened.
    assert retries == breaker + 1
    interval, failures = flag(command, "--health-check-interval-secs"), flag(command, "--health-failure-threshold")
    assert interval * failures == deployment.GATEWAY_OUT_OF_ROTATION_S <= 30
    # A request the gateway ends is the longest that can pass it (the Helm drain waits at most that).
    assert flag(command, "--request-timeout-secs") == deployment.GATEWAY_REQUEST_TIMEOUT_S


def test_every_gateway_flag_is_one_smg_accepts() -> None:
    if shutil.which("smg") is None and not Path(sys.executable).with_name("smg").exists():
        pytest.skip("sglang-router 0.3.2 is not installed (the dev extra)")
    done = subprocess.run([sys.executable, "-m", "sglang_router.launch_router", "--help"], capture_output=True,
                          text=True, timeout=60, check=True)
    command = [str(w) for w in two_replicas()["gateway"]["command"]]  # type: ignore[union-attr]
    flags = [w for w in command if w.startswith("--")]
    assert "--retry-max-retries" in flags and "--cb-window-duration-secs" in flags
    assert [f for f in flags if f not in done.stdout.split()] == []
