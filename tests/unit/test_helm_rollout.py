"""Changing a running chart without failed requests (issue 43, Helm): per profile and scenario, the rendered
engine rollout (strategy, PodDisruptionBudget, grace period) and the pod's own readiness probe and drain,
the latter run exactly as the rendered manifest runs them, against a loopback engine."""

from __future__ import annotations

import json
import math
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fake_engine import FakeEngine, Route
from test_helm import RENDERABLE, case_values, container, engine_pod_specs, find, render, rendered

from ornith_stack import deployment
from ornith_stack.engines import adapter_for
from ornith_stack.merge import deep_merge
from ornith_stack.profiles import load_profile

ROOT = Path(__file__).resolve().parents[2]
RECORDED = {  # the engines' own /metrics, recorded idle (running and waiting gauges at 0)
    "vllm": ROOT / "tests/fixtures/engines/vllm-0.24.0/ngram/metrics.txt",
    "sglang": ROOT / "tests/fixtures/engines/sglang-0.5.17/uncapped-tp1/metrics-idle.txt",
}


def engine_workload(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    return next(
        o
        for o in objects
        if o["kind"] in ("Deployment", "LeaderWorkerSet")
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"
    )


def option(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


# ------------------------------------------------------------------------------ the rendered rollout
@pytest.mark.parametrize("case", RENDERABLE)
def test_the_engine_rolls_one_copy_at_a_time_and_never_surges_onto_gpus_it_lacks(case: str) -> None:
    values = case_values(case)
    engine = values["engine"]
    workload = engine_workload(rendered(case))
    if workload["kind"] == "LeaderWorkerSet":
        assert workload["spec"]["rolloutStrategy"] == {
            "type": "RollingUpdate",
            "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
        }
        return
    rolling = workload["spec"]["strategy"]
    assert rolling["type"] == "RollingUpdate"
    if int(engine.get("gpusPerNode", 0)) > 0:
        # A surge pod would wait for GPUs the cluster does not have: one copy goes, then comes back.
        assert rolling["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    else:
        # On CPU the new pod fits beside the old: it is ready before the old one drains.
        assert rolling["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    startup = engine.get("probes", {}).get("startup", {"periodSeconds": 10, "failureThreshold": 180})
    assert workload["spec"]["progressDeadlineSeconds"] >= (
        startup["periodSeconds"] * startup["failureThreshold"] + engine["drain"]["maxRequestSeconds"]
    )


@pytest.mark.parametrize("case", RENDERABLE)
def test_several_copies_get_a_disruption_budget_of_one_and_a_single_copy_none(case: str) -> None:
    engine = case_values(case)["engine"]
    budgets = find(rendered(case), "PodDisruptionBudget")
    pods = [engine_workload(rendered(case))["spec"]]
    if int(engine.get("replicas", 1)) == 1 and int(engine.get("nodes", 1)) == 1:
        assert budgets == []  # a budget of 0 would block every node drain
        return
    assert [b["spec"]["maxUnavailable"] for b in budgets] == [1]
    selector = budgets[0]["spec"]["selector"]["matchLabels"]
    for spec in pods:
        templates = (
            [spec.get("template")]
            if "template" in spec
            else [spec["leaderWorkerTemplate"]["leaderTemplate"], spec["leaderWorkerTemplate"]["workerTemplate"]]
        )
        for template in templates:
            assert selector.items() <= template["metadata"]["labels"].items()


def longest_request_s(profile_name: str, overrides: dict[str, str], gateway: bool) -> int:
    """The arithmetic the values file claims, redone from the profile: its max tokens at its slowest
    measured single-stream decode rate (15 tok/s stated where it measured none), capped at the gateway's
    request timeout."""
    profile = load_profile(profile_name, overrides, shipped=True)
    args = profile.serve.args
    tokens = int(args.get("max-model-len") or args.get("context-length") or 262144)  # the shipped shapes' context
    rates = []
    if profile.expected:
        rates = [p.decode_tok_s for p in profile.expected.sweep if p.decode_tok_s]
        rates += [r for r in (profile.expected.decode_tok_s, profile.expected.baseline_decode_tok_s) if r]
    seconds = math.ceil(tokens / min(rates or [15.0]))
    return min(seconds, 1800) if gateway else seconds


SCENARIO_PROFILE = {
    "ci/gpu96-gateway.yaml": ("gpu96", {"serve.replicas": "2", "hardware.gpu.count": "2"}),
    "ci/gb300x2-two-4gpu-nodes.yaml": ("gb300x2", {"serve.args.tp-size": "8"}),
}


@pytest.mark.parametrize("case", RENDERABLE)
def test_the_grace_period_covers_the_readiness_turning_false_and_the_longest_request(case: str) -> None:
    values = case_values(case)
    name, overrides = SCENARIO_PROFILE.get(case, (values["profile"], {}))
    drain = values["engine"]["drain"]
    assert drain["maxRequestSeconds"] == longest_request_s(
        name, overrides, bool(values.get("gateway", {}).get("enabled"))
    )
    readiness = values["engine"].get("probes", {}).get("readiness", {"periodSeconds": 10, "failureThreshold": 3})
    unready = readiness["periodSeconds"] * readiness["failureThreshold"]
    for role, spec in engine_pod_specs(rendered(case)).items():
        assert spec["terminationGracePeriodSeconds"] == unready + drain["maxRequestSeconds"] + 30, role
        stop = container(spec, "engine")["lifecycle"]["preStop"]["exec"]["command"]
        assert stop[3] == "drain"
        assert float(option(stop, "--unready-seconds")) == unready
        assert float(option(stop, "--max-seconds")) == drain["maxRequestSeconds"]
        if role != "worker":  # a hung engine (liveness) is not drained for hours
            assert container(spec, "engine")["livenessProbe"]["terminationGracePeriodSeconds"] == 30


def test_the_gateway_caps_the_drain_at_its_request_timeout_and_spark_waits_for_its_slowest_decode() -> None:
    gateway = case_values("ci/gpu96-gateway.yaml")
    assert gateway["engine"]["drain"]["maxRequestSeconds"] == deployment.GATEWAY_REQUEST_TIMEOUT_S == 1800
    assert "--request-timeout-secs" in gateway["gateway"]["args"]
    # Spark: 262,144 tokens at 18.1 tok/s (its seed's slowest sweep point).
    assert case_values("ci/spark-model-repo.yaml")["engine"]["drain"]["maxRequestSeconds"] == 14484
    assert case_values("values-cpu-demo.yaml")["engine"]["drain"]["maxRequestSeconds"] == math.ceil(4096 / 15)


@pytest.mark.parametrize("case", RENDERABLE)
def test_the_drain_waits_on_the_engines_own_running_and_waiting_gauges(case: str) -> None:
    adapter = adapter_for(case_values(case)["engine"]["kind"])
    for role, spec in engine_pod_specs(rendered(case)).items():
        stop = container(spec, "engine")["lifecycle"]["preStop"]["exec"]["command"]
        metrics = [stop[i + 1] for i, word in enumerate(stop) if word == "--metric"]
        assert metrics == [adapter.metrics.requests_running, adapter.metrics.requests_waiting]
        # A worker node of a group keeps the collective up while its leader drains.
        assert ("--host-env" in stop) == (role == "worker")


def test_the_gateway_learns_of_pods_from_their_readiness_and_deletion() -> None:
    objects = rendered("ci/gpu96-gateway.yaml")
    gateway = next(d for d in find(objects, "Deployment") if d["metadata"]["name"].endswith("-gateway"))
    args = gateway["spec"]["template"]["spec"]["containers"][0]["args"]
    # Service discovery watches the pods (not a list of addresses), so a pod's readiness turning false and its
    # deletion reach the gateway as events, before the pod's drain ends.
    assert "--service-discovery" in args
    for flag, value in (
        ("--retry-max-retries", deployment.GATEWAY_RETRIES),
        ("--cb-failure-threshold", deployment.GATEWAY_CB_FAILURES),
        ("--health-check-interval-secs", deployment.GATEWAY_HEALTH_CHECK_INTERVAL_S),
    ):
        assert option(args, flag) == str(value)


# --------------------------------------------------------------------- the probe and drain, executed
def fast(case: str, max_request_s: int = 5) -> dict[str, Any]:
    """The case's values with a 1 s readiness turn and a short drain bound, so the test runs in seconds."""
    return deep_merge(
        case_values(case),
        {
            "engine": {
                "probes": {"readiness": {"periodSeconds": 1, "failureThreshold": 1, "timeoutSeconds": 5}},
                "drain": {"maxRequestSeconds": max_request_s},
            }
        },
    )


def pod_command(values: dict[str, Any], which: str, port: int, tmp: Path) -> list[str]:
    """The engine container's readiness (`ready`) or preStop (`drain`) command as rendered, pointed at
    `port` and with its files under `tmp`."""
    engine = container(engine_pod_specs(tuple(render(values)))["single"], "engine")
    command = list(
        engine["readinessProbe"]["exec"]["command"]
        if which == "ready"
        else engine["lifecycle"]["preStop"]["exec"]["command"]
    )
    command[command.index("--port") + 1] = str(port)
    for flag in ("--marker", "--served", "--key-file"):
        if flag in command:
            command[command.index(flag) + 1] = str(tmp / Path(command[command.index(flag) + 1]).name)
    return command


def container_start() -> str:
    """The start time of PID 1 (/proc/1/stat field 22): how the pod's markers name the container's start."""
    return Path("/proc/1/stat").read_text().rsplit(")", 1)[1].split()[19]


def run(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)


def with_gauges(kind: str, running: float, waiting: float) -> str:
    adapter = adapter_for(kind)
    text = RECORDED[kind].read_text()
    for name, value in ((adapter.metrics.requests_running, running), (adapter.metrics.requests_waiting, waiting)):
        text, count = re.subn(rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", rf"\g<1> {value}", text, flags=re.M)
        assert count == 1, name
    return text


@pytest.fixture()
def engine() -> Any:
    fake = FakeEngine()
    yield fake
    fake.close()


@pytest.mark.parametrize("case", ["values-cpu-demo.yaml", "values-gpu96.yaml"])
def test_ready_only_after_a_real_generation_and_false_once_draining(
    case: str, engine: FakeEngine, tmp_path: Path
) -> None:
    port = int(engine.url.rsplit(":", 1)[1])
    ready = pod_command(fast(case), "ready", port, tmp_path)
    engine.routes["/health"] = Route("")
    engine.routes["/v1/models"] = Route(json.dumps({"data": [{"id": "ornith"}]}), content_type="application/json")
    # The HTTP server is up, the health route answers, but no generation succeeded yet: not ready.
    engine.routes["/v1/chat/completions"] = Route("model not loaded", 503)
    assert run(ready).returncode == 1
    engine.routes["/v1/chat/completions"] = Route(
        json.dumps({"choices": [{"message": {"content": "y"}}]}), content_type="application/json"
    )
    done = run(ready)
    assert done.returncode == 0, done.stdout + done.stderr
    path, _, body = engine.posts[-1]
    assert path == "/v1/chat/completions"
    assert json.loads(body)["max_tokens"] == 1 and json.loads(body)["model"] == "ornith"
    # Once served, later probes ask only the health route: no generation queued behind users' requests.
    posts = len(engine.posts)
    assert run(ready).returncode == 0 and len(engine.posts) == posts
    engine.routes["/health"] = Route("", 503)
    assert run(ready).returncode == 1
    engine.routes["/health"] = Route("")
    # A drain marker left by an earlier start of the container (the emptyDir outlives a restart) is ignored.
    (tmp_path / "ornith-draining").write_text("1\ndraining\n")
    assert run(ready).returncode == 0
    (tmp_path / "ornith-draining").write_text(f"{container_start()}\ndraining\n")
    done = run(ready)
    assert done.returncode == 1 and "draining" in done.stdout
    # ... and a restarted engine proves itself again: the generation of an earlier start does not count.
    (tmp_path / "ornith-served").write_text("1\nornith\n")
    (tmp_path / "ornith-draining").unlink()
    engine.routes["/v1/chat/completions"] = Route("model not loaded", 503)
    assert run(ready).returncode == 1


def test_the_readiness_generation_carries_the_key_from_the_engines_key_file(engine: FakeEngine, tmp_path: Path) -> None:
    values = deep_merge(fast("values-gpu96.yaml"), {"apiKey": {"secretName": "ornith-api-key"}})
    ready = pod_command(values, "ready", int(engine.url.rsplit(":", 1)[1]), tmp_path)
    (tmp_path / "api-key.yaml").write_text(json.dumps({"api-key": "k3y"}))  # as write-api-key writes it
    engine.routes["/health"] = Route("")
    engine.routes["/v1/models"] = Route(json.dumps({"data": [{"id": "m"}]}))
    engine.routes["/v1/chat/completions"] = Route(json.dumps({"choices": [{}]}))
    assert run(ready).returncode == 0
    assert engine.posts[-1][1] == "Bearer k3y"


@pytest.mark.parametrize(("case", "kind"), [("values-cpu-demo.yaml", "vllm"), ("values-gpu96.yaml", "sglang")])
def test_the_drain_turns_readiness_false_then_waits_for_the_running_requests(
    case: str, kind: str, engine: FakeEngine, tmp_path: Path
) -> None:
    values = fast(case, max_request_s=30)
    drain = pod_command(values, "drain", int(engine.url.rsplit(":", 1)[1]), tmp_path)
    engine.metrics(with_gauges(kind, running=2, waiting=1))

    def requests_finish() -> None:
        time.sleep(3)
        engine.metrics(with_gauges(kind, running=1, waiting=0))
        time.sleep(1.5)
        engine.metrics(with_gauges(kind, running=0, waiting=0))

    threading.Thread(target=requests_finish, daemon=True).start()
    started = time.monotonic()
    done = run(drain)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    # The readiness probe now fails: the marker names this container's start.
    assert (tmp_path / "ornith-draining").read_text().split()[0] == container_start()
    assert 4.5 <= took < 15, took  # it waited for the last request, not for the 30 s bound
    assert "no request running or waiting" in done.stdout


def test_the_drain_gives_up_at_the_longest_request_the_profile_allows(engine: FakeEngine, tmp_path: Path) -> None:
    drain = pod_command(
        fast("values-cpu-demo.yaml", max_request_s=3), "drain", int(engine.url.rsplit(":", 1)[1]), tmp_path
    )
    engine.metrics(with_gauges("vllm", running=1, waiting=0))
    started = time.monotonic()
    done = run(drain)
    assert done.returncode == 1 and "still running after 3" in done.stdout
    assert 3 <= time.monotonic() - started < 10
