"""Two gpu96 SGLang 0.5.17 replicas on one H200 behind SGLang's Model Gateway, as recorded.

Recording: tests/fixtures/engines/sglang-0.5.17/gateway-2x-gpu96 (README beside it), made by
`tests/gpu/run_sglang_h200.sh gateway` (tests/gpu/gateway_run.py) on 2026-12-01: each replica from
`ornith-stack launch-args gpu96` with --mem-fraction-static 0.425 (half of seed 000's 0.85), the gateway with
the project's own arguments, the exporter over both, then `ornith-stack bench --suite serving` through a
gateway of replica 0 alone and through the gateway of both. Four sources count the same requests: the bench,
each engine's own counter, the gateway's per-worker outcomes and the exporter's per-replica series.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from ornith_stack import deployment
from ornith_stack.wire.metrics import parse

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "engines" / "sglang-0.5.17" / "gateway-2x-gpu96"
WORKERS = ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
RUNNING_LIMIT = 4  # gpu96's --max-running-requests
# SGLang sends one request of its own once the server is up (its start-up warm-up), before any client's.
STARTUP_WARMUP_REQUESTS = 1


@pytest.fixture(scope="module")
def summary() -> dict[str, Any]:
    return json.loads((RUN / "summary.json").read_text())


def _by(file: str, name: str, label: str, **match: str) -> dict[str, float]:
    """`name`'s samples in a recorded exposition, by one label (summed over the others)."""
    found: dict[str, float] = {}
    for sample in parse((RUN / file).read_text()).get(name, []):
        if all(sample.labels.get(k) == v for k, v in match.items()):
            found[sample.labels[label]] = found.get(sample.labels[label], 0.0) + sample.value
    return found


def _serving_run(summary: dict[str, Any], key: str) -> dict[str, Any]:
    result = summary[key]
    assert result["rc"] == 0
    (level,) = result["serving"]["levels"]
    (run,) = level["runs"]
    return dict(run)


def test_the_gateway_ran_with_the_arguments_the_compose_file_gives_it() -> None:
    """A change of deployment.gateway_args that this recording did not run fails here: record again.
    The recording predates the fault-handling flags (issue 43: retries, circuit breaker, health checks every
    10 s out after 2, the request timeout); they act only when a replica fails, and none did here, so they
    are compared as the recorded health-check interval until the next GPU recording."""
    argv = shlex.split((RUN / "gateway-command.txt").read_text())
    assert argv[1:3] == ["-m", "sglang_router.launch_router"]
    expected = deployment.gateway_args(WORKERS, 30080, host="127.0.0.1", metrics_host="127.0.0.1",
                                       balance_threshold=RUNNING_LIMIT)
    faults = deployment.gateway_fault_args()
    at = expected.index(faults[0])
    recorded_faults = ["--health-check-interval-secs", str(deployment.GATEWAY_HEALTH_CHECK_INTERVAL_S)]
    assert argv[3:] in (expected, expected[:at] + recorded_faults + expected[at + len(faults):])


@pytest.mark.parametrize("replica", [0, 1])
def test_each_replica_ran_gpu96_at_half_the_memory_fraction_and_sized_its_own_pools(replica: int) -> None:
    argv = (RUN / f"replica-{replica}" / "command.txt").read_text().split()
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.425"
    assert argv[argv.index("--max-running-requests") + 1] == str(RUNNING_LIMIT)
    lines = (RUN / f"replica-{replica}" / "key-lines.txt").read_text()
    assert "max_total_num_tokens=40960" in lines and "max_running_requests=4" in lines


def test_the_second_replica_sizes_its_state_cache_from_what_the_first_left_free(summary: dict[str, Any]) -> None:
    """SGLang sizes the mamba state cache from the memory free when it starts: the replica started second,
    on the same GPU, gets fewer slots. Both stay far above the 4 running requests they serve."""
    slots = []
    for replica in summary["replicas"]:
        line = next(ln for ln in replica["key_lines"] if "max_mamba_cache_size" in ln)
        slots.append(int(line.split("max_mamba_cache_size: ")[1].split(",")[0]))
    assert slots[1] < slots[0]
    assert min(slots) > 1000 * RUNNING_LIMIT


def test_requests_spread_and_every_source_counts_them_alike(summary: dict[str, Any]) -> None:
    counts = summary["requests_per_replica"]
    one, two = counts["bench_1_replica"], counts["bench_2_replicas"]
    assert one[1] == 0 and one[0] > 0, "the one-replica gateway routes to replica 0 only"
    assert min(two) > 0, "the two-replica gateway routes to both"
    outcomes = _by("gateway-metrics-after.txt", "smg_worker_cb_outcomes_total", "worker", outcome="success")
    assert [outcomes[w] for w in WORKERS] == two
    routed = _by("gateway-metrics-after.txt", "smg_router_requests_total", "endpoint")
    assert routed == {"chat": sum(two)}
    exported = _by("exporter-metrics-after.txt", "ornith_e2e_request_latency_seconds_count", "target")
    for i, worker in enumerate(WORKERS):
        assert exported[worker] == one[i] + two[i] + STARTUP_WARMUP_REQUESTS
    assert _by("exporter-metrics-after.txt", "ornith_engine_up", "target") == dict.fromkeys(WORKERS, 1.0)


def test_two_replicas_serve_the_same_load_without_failures(summary: dict[str, Any]) -> None:
    """At concurrency 8, twice one replica's running-request limit: printed side by side."""
    one, two = _serving_run(summary, "bench_1_replica"), _serving_run(summary, "bench_2_replicas")
    print(f"\n{'':>22} {'1 replica':>10} {'2 replicas':>10}")
    for name, read in {"output tok/s": lambda r: r["output_tok_s"], "requests/s": lambda r: r["request_throughput"],
                       "median TTFT ms": lambda r: r["ttft_ms"]["median"],
                       "median TPOT ms": lambda r: r["tpot_ms"]["median"]}.items():
        print(f"{name:>22} {read(one):>10.1f} {read(two):>10.1f}")
    for run in (one, two):
        assert run["failed"] == 0 and run["completed"] == summary["bench_1_replica"]["serving"]["num_prompts"]
    # One replica queues half the streams behind its 4 running requests; two run all 8 at once.
    assert two["ttft_ms"]["median"] < one["ttft_ms"]["median"]
    assert two["output_tok_s"] > one["output_tok_s"]
