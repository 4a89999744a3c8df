"""The typed bench result: saved results load, a run survives bench.json unchanged, and a malformed or
hostile --baseline is one error line naming the file and the field."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from ornith_stack.bench import result as result_module
from ornith_stack.bench.codec import to_json
from ornith_stack.bench.report import render_markdown
from ornith_stack.bench.result import BenchResult, load_result

FIXTURES = Path(__file__).parents[1] / "fixtures"
SAVED = sorted(FIXTURES.rglob("bench/bench.json"))
# Keys older versions wrote that the result no longer has (a sandbox flag, a level's wall time).
DROPPED = {"network_namespace", "wall_s"}
# The oldest format kept one request per sweep point, its fields on the point itself.
FLAT_SWEEP_POINT = re.compile(r"\.suites\.ttft_sweep\.points\[\d+\]")


def _dropped(path: str, key: str, value: Any) -> bool:
    """Whether leaving out `key` loses nothing: a null (the same as absent), or a key listed above."""
    return value is None or key in DROPPED or FLAT_SWEEP_POINT.fullmatch(path) is not None


def _changes(saved: Any, written: Any, path: str = "") -> list[str]:
    """Where `written` lost a key of `saved` or holds another value (keys added since are allowed)."""
    if isinstance(saved, dict) and isinstance(written, dict):
        lost = [f"{path}.{k}: lost" for k, v in saved.items() if k not in written and not _dropped(path, k, v)]
        return lost + [c for k in saved if k in written for c in _changes(saved[k], written[k], f"{path}.{k}")]
    if isinstance(saved, list) and isinstance(written, list) and len(saved) == len(written):
        return [c for i, (a, b) in enumerate(zip(saved, written, strict=True)) for c in _changes(a, b, f"{path}[{i}]")]
    return [] if saved == written else [f"{path}: {saved!r} became {written!r}"]


def test_the_saved_results_are_there() -> None:
    assert len(SAVED) >= 5, SAVED


@pytest.mark.parametrize("path", SAVED, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_saved_result_loads_with_every_figure_kept(path: Path) -> None:
    saved = json.loads(path.read_text())
    loaded = load_result(path)
    assert _changes(saved, to_json(loaded)) == []
    assert loaded.suites_requested and loaded.url == saved["url"]
    table = render_markdown(loaded)
    assert "| this run |" in table and f"at {saved['url']}" in table


def test_the_newest_saved_result_is_written_back_as_it_was() -> None:
    """Written by the current format: loading and writing again gives the same JSON but for keys added since."""
    path = FIXTURES / "engines/sglang-0.5.17/tp1/bench/bench.json"
    written = to_json(load_result(path))
    saved = json.loads(path.read_text())
    added = {"settings": {"task_order"}, "suites": set()}
    assert set(written) == set(saved) and set(written["settings"]) - set(saved["settings"]) == added["settings"]
    assert written["suites"]["concurrency"]["levels"][0]["samples"] == saved["suites"]["concurrency"]["levels"][0]["samples"]


HOSTILE: list[tuple[str, Any, str]] = [
    ("a wrong type deep inside", {"suites": {"decode": {"samples": [{"ttft_s": "abc"}]}}},
     "suites.decode.samples[0].ttft_s: expected a number or null, got 'abc'"),
    ("true for a count", {"suites": {"tasks": {"tasks": {"gsm8k": {"n": True}}}}},
     "suites.tasks.tasks.gsm8k.n: expected a whole number, got True"),
    ("a string for a list", {"suites": {"concurrency": {"levels": "many"}}},
     "suites.concurrency.levels: expected a list, got 'many'"),
    ("no suites", {"url": "http://x"}, "suites: not an ornith-stack bench result (no 'suites')"),
    ("another format", {"format": "other/2", "suites": {}}, "format: not an ornith-stack bench result"),
    ("a list at the top", [1, 2], "expected a JSON object at the top level, got list"),
    ("a megabyte key", {"suites": {"tasks": {"tasks": {"k" * 1_000_000: {"n": "x"}}}}},
     "suites.tasks.tasks.kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk….n: expected a whole number, got 'x'"),
]


@pytest.mark.parametrize(("what", "content", "message"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_malformed_baseline_is_one_error_line_naming_the_file_and_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str, content: Any, message: str) -> None:
    baseline = tmp_path / "base.json"
    baseline.write_text(json.dumps(content))
    _refused(tmp_path, capsys, baseline, message)


@pytest.mark.parametrize(("what", "message"), [
    ("a FIFO", "is not a regular file"),
    ("nested 10,000 deep", "nested deeper than 64 levels"),
    ("over the size cap", "is larger than 1,000 bytes"),
    ("not JSON", "not valid JSON (line 1"),
])
def test_a_baseline_that_is_no_result_file_is_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        what: str, message: str) -> None:
    baseline = tmp_path / "base.json"
    if what == "a FIFO":
        os.mkfifo(baseline)
    elif what == "nested 10,000 deep":
        baseline.write_text('{"suites": ' + "[" * 10_000 + "]" * 10_000 + "}")
    elif what == "over the size cap":
        monkeypatch.setattr(result_module, "MAX_RESULT_BYTES", 1_000)
        baseline.write_text(json.dumps({"suites": {}, "url": "x" * 2_000}))
    else:
        baseline.write_text("{suites")
    _refused(tmp_path, capsys, baseline, message)


def _refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], baseline: Path, message: str) -> None:
    """The bench with --baseline BASELINE: one error line with `message` naming the file, exit 2, and no
    --out made (the baseline is read before any request)."""
    from ornith_stack.cli import main

    rc = main(["bench", "--url", "http://127.0.0.1:9", "--baseline", str(baseline), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and message in err and str(baseline) in err, err
    assert len(err) < 400 and not (tmp_path / "out").exists()


def test_a_result_is_frozen() -> None:
    import dataclasses

    result = load_result(SAVED[0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.url = "http://elsewhere"  # type: ignore[misc]
    assert isinstance(result, BenchResult)
