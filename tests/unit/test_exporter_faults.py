"""The exporter process under three concurrent scrapers beside hostile targets on loopback.

Good targets serve the recorded SGLang 0.5.17 and vLLM 0.24.0 /metrics (tests/fixtures/engines/); the
hostile ones trickle their body (Connection: close and HTTP/1.0 framing), trickle their headers, close or
stall short of their Content-Length, end mid-line, or expose every family twice (tests/hostile.py).
"""

from __future__ import annotations

from hostile import fault_load
from ports import free_port

from ornith_stack.exporter.server import Settings

SCRAPE_TIMEOUT_S = 2.0  # Prometheus' scrape timeout, sent in its header
SECONDS = 15


def test_hostile_targets_never_take_the_good_ones_down_and_every_scrape_keeps_its_deadline() -> None:
    report = fault_load(free_port(), SECONDS, scrapers=3, scrape_timeout=SCRAPE_TIMEOUT_S)
    took = [a.took for a in report.answers]
    print(f"{len(took)} answers in {SECONDS} s, slowest {max(took):.2f} s; threads max {max(report.threads)}, "
          f"RSS max {max(report.rss_kib) / 1024:.1f} MiB")
    assert not report.failures
    assert len(took) >= 3 * SECONDS / SCRAPE_TIMEOUT_S  # every scraper got an answer each deadline or sooner
    assert max(took) < SCRAPE_TIMEOUT_S
    for answer in report.answers:
        for url, kind in report.targets.items():
            assert answer.up[url] == (1.0 if kind.startswith("good") else 0.0), kind
    for url, reason in report.expected.items():  # each bad target down for its own reason, and only that one
        reasons = {r for (target, r) in report.errors if target == url}
        assert reasons == {reason}, report.targets[url]
    assert not any(target not in report.expected for target, _ in report.errors)
    # Threads: one scrape worker per target, the render pool, the watchdog, the main thread (the event loop).
    assert max(report.threads) <= len(report.targets) + Settings([]).workers + 2
