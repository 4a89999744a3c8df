"""`ornith-stack status` figures from two recorded exporter scrapes (SGLang 0.5.17 on an H200, tp 1:
tests/fixtures/engines/sglang-0.5.17/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ornith_stack.stack.status import compare

TP1 = Path(__file__).resolve().parents[1] / "fixtures" / "engines" / "sglang-0.5.17" / "tp1"


def scrape(name: str) -> str:
    return (TP1 / f"exporter-metrics-{name}.txt").read_text()


def test_acceptance_over_the_window_between_two_reads() -> None:
    [row] = compare(scrape("idle"), scrape("after"), elapsed=60.0)
    assert row.up and row.target == "http://127.0.0.1:30000"
    # 1 + (2215 - 3) accepted / (4385 - 5) steps between the idle and the after scrape.
    assert row.acceptance_length == pytest.approx(1 + 2212 / 4380)
    assert row.running == 0.0 and row.info["engine"] == "sglang"


def test_without_steps_in_the_window_acceptance_is_the_lifetime_one() -> None:
    # SGLang's step counter moves when a request finishes: two reads during generation see no new step.
    [row] = compare(scrape("during-01"), scrape("during-02"), elapsed=1.0)
    assert row.acceptance_length == pytest.approx(1 + 209 / 391)
    assert row.running == 2.0
