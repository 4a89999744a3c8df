"""Two gpu96 SGLang engines on one GPU at half the memory fraction, behind SGLang's Model Gateway.

    python3 tests/gpu/gateway_run.py OUT_DIR --target T --draft D [--fraction 0.425]

The data-parallel layout of issue 21 on the one H200 a session is lent: `ornith-stack launch-args gpu96`
for each replica (sglang_run.engine_command: the tiny checkpoints and the overrides it names) with
`--mem-fraction-static` halved, replica 1 started once replica 0 has sized its memory pools (SGLang sizes
them from the memory free when it starts, so the order is part of the result), then the gateway with the
project's own arguments (deployment.gateway_args, the compose file's) and the exporter over both replicas
and the gateway. Then `ornith-stack bench --suite serving` through a gateway of one replica and through
the gateway of both, at a concurrency twice one replica's running-request limit. Writes into OUT_DIR:

  replica-N/                   command.txt, engine.log, health.txt, key-lines.txt, metrics-before/after.txt
  gateway.log, gateway-1.log   the two gateways' logs (both replicas; replica 0 alone)
  gateway-metrics-*.txt        the gateway's smg_* metrics before and after the traffic
  exporter-metrics-after.txt   the exporter reading both replicas and the gateway
  bench-1/, bench-2/           the bench through one and through two replicas; bench-*.log
  summary.json                 start-up seconds, memory lines, requests per replica, both bench results
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_run  # noqa: E402

from ornith_stack import deployment  # noqa: E402

PORTS = (30000, 30001)
GATEWAY_PORT, GATEWAY_METRICS_PORT = 30080, 29000
# Replica 0 alone behind a gateway of its own: the one-replica side of the comparison.
SOLO_GATEWAY_PORT, SOLO_GATEWAY_METRICS_PORT = 30081, 29001
EXPORTER_PORT = 9400
RUNNING_LIMIT = 4  # gpu96's --max-running-requests (seed 000)
BENCH = ["--suite", "serving", "--random-input-len", "256", "--random-output-len", "128", "--num-prompts", "48",
         "--max-concurrency", str(2 * RUNNING_LIMIT), "--warmup", "1", "--repeats", "1"]  # fmt: skip
# SGLang's counter of finished requests, one series per scheduler.
REQUESTS = re.compile(r"^sglang:num_requests_total\{[^}]*\}\s+([0-9.eE+]+)", re.M)


def _requests(metrics: bytes) -> float:
    return sum(float(v) for v in REQUESTS.findall(metrics.decode(errors="replace")))


def _with_fraction(cmd: list[str], fraction: str) -> list[str]:
    i = cmd.index("--mem-fraction-static")
    return [*cmd[: i + 1], fraction, *cmd[i + 2 :]]


def _wait_for_line(log: Path, pattern: str, proc: subprocess.Popen, deadline_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode}; see {log}")
        if re.search(pattern, log.read_text(errors="replace")):
            return time.monotonic() - t0
        time.sleep(1)
    raise RuntimeError(f"{pattern!r} not in {log} after {deadline_s} s")


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def _gateway(workers: list[str], port: int, metrics_port: int, log: Path) -> subprocess.Popen:
    argv = [sys.executable, "-m", "sglang_router.launch_router",
            *deployment.gateway_args(workers, port, host="127.0.0.1", metrics_host="127.0.0.1",
                                     metrics_port=metrics_port, balance_threshold=RUNNING_LIMIT)]  # fmt: skip
    (log.parent / f"{log.stem}-command.txt").write_text(" ".join(argv) + "\n")
    proc = _start(argv, log)
    for _ in range(120):
        try:
            if sglang_run._get(f"http://127.0.0.1:{port}{deployment.GATEWAY_HEALTH_PATH}", timeout=2)[0] == 200:
                return proc
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"gateway on {port} not ready; see {log}")


def _bench(url: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "ornith_stack", "bench", "--url", url, "--out", str(out), *BENCH]
    with open(f"{out}.log", "wb") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=240).returncode
    result = json.loads((out / "bench.json").read_text()) if (out / "bench.json").is_file() else {}
    return {"rc": rc, "serving": result.get("suites", {}).get("serving")}


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def record(out: Path, target: str, draft: str, fraction: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {"fraction": fraction, "ports": PORTS, "bench_args": BENCH, "replicas": []}
    engines: list[sglang_run.Engine] = []
    procs: list[subprocess.Popen] = []
    try:
        for i, port in enumerate(PORTS):
            rdir = out / f"replica-{i}"
            rdir.mkdir(exist_ok=True)
            cmd, added = sglang_run.engine_command("gpu96", target, draft, port)
            cmd = _with_fraction(cmd, fraction)
            (rdir / "command.txt").write_text(" ".join(cmd) + "\n")
            engine = sglang_run.Engine(cmd, rdir, port)
            engines.append(engine)
            summary["replicas"].append({"port": port})
            # The next replica starts once this one's pools are sized, as the order of a staggered start.
            sized = _wait_for_line(rdir / "engine.log", r"KV Cache is allocated", engine.proc, 420)
            summary["replicas"][i]["pools_sized_after_s"] = round(sized, 1)
        for i, engine in enumerate(engines):
            healthy = engine.wait_healthy(out / f"replica-{i}" / "health.txt", 480)
            summary["replicas"][i]["healthy_after_s"] = round(healthy, 1)
            sglang_run._save(out / f"replica-{i}" / "metrics-before.txt", f"{engine.base}/metrics")
        workers = [e.base for e in engines]
        procs.append(_gateway(workers, GATEWAY_PORT, GATEWAY_METRICS_PORT, out / "gateway.log"))
        procs.append(_gateway(workers[:1], SOLO_GATEWAY_PORT, SOLO_GATEWAY_METRICS_PORT, out / "gateway-1.log"))
        procs.append(_start([sys.executable, "-m", "ornith_stack", "exporter", *[a for w in workers for a in ("--target", w)],
                             "--gateway", f"http://127.0.0.1:{GATEWAY_METRICS_PORT}", "--listen",
                             f"127.0.0.1:{EXPORTER_PORT}"], out / "exporter.log"))  # fmt: skip
        sglang_run._save(out / "gateway-metrics-before.txt", f"http://127.0.0.1:{GATEWAY_METRICS_PORT}/metrics")
        before = [_requests(sglang_run._get(f"{e.base}/metrics")[1]) for e in engines]
        summary["bench_1_replica"] = _bench(f"http://127.0.0.1:{SOLO_GATEWAY_PORT}", out / "bench-1")
        middle = [_requests(sglang_run._get(f"{e.base}/metrics")[1]) for e in engines]
        summary["bench_2_replicas"] = _bench(f"http://127.0.0.1:{GATEWAY_PORT}", out / "bench-2")
        time.sleep(2)
        after = [_requests(sglang_run._get(f"{e.base}/metrics")[1]) for e in engines]
        summary["requests_per_replica"] = {
            "bench_1_replica": [m - b for m, b in zip(middle, before, strict=True)],
            "bench_2_replicas": [a - m for a, m in zip(after, middle, strict=True)],
        }
        sglang_run._save(out / "gateway-metrics-after.txt", f"http://127.0.0.1:{GATEWAY_METRICS_PORT}/metrics")
        sglang_run._save(out / "exporter-metrics-after.txt", f"http://127.0.0.1:{EXPORTER_PORT}/metrics")
        for i, engine in enumerate(engines):
            sglang_run._save(out / f"replica-{i}" / "metrics-after.txt", f"{engine.base}/metrics")
    finally:
        for proc in procs:
            _stop(proc)
        for i, engine in enumerate(engines):
            engine.stop()
            lines = sglang_run.key_lines(out / f"replica-{i}" / "engine.log")
            (out / f"replica-{i}" / "key-lines.txt").write_text("\n".join(lines) + "\n")
            summary["replicas"][i]["key_lines"] = [ln for ln in lines if "allocated" in ln or "max_total" in ln]
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--fraction", default="0.425", help="each replica's --mem-fraction-static (gpu96's 0.85 / 2)")
    args = ap.parse_args()
    # `timeout` ends a run that overstays with SIGTERM: exit through record()'s finally, which stops the
    # engines and writes what was recorded.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    s = record(args.out, args.target, args.draft, args.fraction)
    print(json.dumps({k: s.get(k) for k in ("replicas", "requests_per_replica")}, indent=1)[:3000])
    for key in ("bench_1_replica", "bench_2_replicas"):
        print(key, json.dumps(s.get(key))[:1500])


if __name__ == "__main__":
    main()
