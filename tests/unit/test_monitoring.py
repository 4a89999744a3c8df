"""Prometheus config, rules and dashboards: valid for promtool, alert tests pass, every query parses and
names only metrics that exist (the exporter's catalogue, the recording rules, the pinned engines'
declared metrics in shared/engine-metrics/, or Alertmanager's and the Model Gateway's recorded /metrics)."""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from outages import COMPOSE
from prometheus_client.parser import text_string_to_metric_families

from ornith_stack.exporter import catalogue as C
from ornith_stack.generate import alerts, dashboards
from ornith_stack.profiles import load_all

REPO = Path(__file__).resolve().parents[2]
PROM = REPO / "monitoring" / "prometheus"
PROMTOOL = shutil.which("promtool")
AMTOOL = shutil.which("amtool")
needs_amtool = pytest.mark.skipif(
    AMTOOL is None, reason="amtool not installed (Debian: apt-get install prometheus-alertmanager)")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")

# Grafana's variables, replaced by what they stand for so that promtool can parse the query.
GRAFANA_VARS = {"$__rate_interval": "1m", "$profile": ".*", "$target": ".*"}
# Grafana unit ids the dashboards use (Grafana's valueFormats registry); custom units are "suffix:<text>".
GRAFANA_UNITS = {"short", "none", "s", "percentunit", "bool", "ops", "reqps", "bytes"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset", "inf", "nan"}


def promtool(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=120)  # type: ignore[list-item]


def all_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every rule and every dashboard panel query."""
    found = []
    for path in sorted((PROM / "rules").glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                found.append((f"{path.name}: {rule.get('record') or rule.get('alert')}", rule["expr"]))
    for path in sorted((REPO / dashboards.DASHBOARD_DIR).glob("*.json")):
        for title, expr in dashboards.panel_queries(json.loads(path.read_text())):
            found.append((f"{path.name}: {title}", expr))
    return found


def grafana_free(expr: str) -> str:
    for var, replacement in GRAFANA_VARS.items():
        expr = expr.replace(var, replacement)
    return expr


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (strings, label matchers, grouping lists, ranges removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", text):
        if match.group(2) is None and match.group(1).lower() not in PROMQL_WORDS:
            names.add(match.group(1))
    return names


def engine_series(shared: Path) -> set[str]:
    """Every sample name the pinned engines can expose (declared names plus prometheus_client suffixes)."""
    names = set()
    for path in (shared / "engine-metrics").glob("*.txt"):
        for name in path.read_text().split():
            base = name.removesuffix("_total")
            names |= {name, base, *(base + s for s in ("_total", "_bucket", "_sum", "_count", "_created"))}
    return names


def gateway_series() -> set[str]:
    """The sample names of the Model Gateway's (sglang-router 0.3.2) own /metrics (tests/fixtures/gateway/)."""
    text = (REPO / "tests" / "fixtures" / "gateway" / "metrics.txt").read_text()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def prometheus_series() -> set[str]:
    """Prometheus 2.42's own /metrics, plus the upstream-only names Debian's build lacks (tests/fixtures/prometheus/)."""
    here = REPO / "tests" / "fixtures" / "prometheus"
    text = (here / "metrics.txt").read_text()
    upstream = {line.split("\t")[0] for line in (here / "upstream-only.txt").read_text().splitlines()
                if line and not line.startswith("#")}
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples} | upstream


def alertmanager_series() -> set[str]:
    """The sample names of Alertmanager 0.25.0's own /metrics (tests/fixtures/alertmanager/README.md)."""
    text = (REPO / "tests" / "fixtures" / "alertmanager" / "metrics.txt").read_text()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


@needs_promtool
def test_promtool_checks_config_and_rules() -> None:
    config = promtool("check", "config", "prometheus.yml", cwd=PROM)
    assert config.returncode == 0, config.stdout + config.stderr
    checked = promtool("check", "rules", *map(str, sorted((PROM / "rules").glob("*.yml"))))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_promtool
def test_promtool_alert_unit_tests_pass() -> None:
    result = promtool("test", "rules", *map(str, sorted((PROM / "tests").glob("*.yml"))))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    names = {a.name for a in alerts.ALERTS}
    fired, quiet = set(), set()
    for path in (PROM / "tests").glob("*.yml"):
        for case in yaml.safe_load(path.read_text())["tests"]:
            series = [s["series"] for s in case["input_series"]]
            for check in case.get("alert_rule_test", []):
                firing_targets = {a["exp_labels"].get("target") or a["exp_labels"].get("instance")
                                  for a in check["exp_alerts"]}
                if firing_targets:
                    fired.add(check["alertname"])
                # Quiet: an empty expectation, or input series of another target that did not fire.
                others = [s for s in series if not any(f'"{t}"' in s for t in firing_targets)]
                if not check["exp_alerts"] or others:
                    quiet.add(check["alertname"])
    # The outages of tests/outages.py (test_alert_outages.py): what they page and what fires beside it;
    # their quiet minutes (a planned restart, a lull) assert that nothing pages at all.
    for outage in (build() for build in COMPOSE):
        fired |= {f.alert for f in (outage.page, *outage.beside, *outage.inhibited) if f}
        if outage.quiet:
            quiet |= names
    assert names == fired, f"no firing case: {names - fired}"
    assert names == quiet, f"no quiet case: {names - quiet}"


@needs_promtool
def test_every_query_parses(tmp_path: Path) -> None:
    queries = all_queries()
    assert len(queries) > 20
    body = {"groups": [{"name": "parse-check", "rules": [
        {"record": f"check:q{i}", "expr": grafana_free(expr)} for i, (_, expr) in enumerate(queries)]}]}
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(body))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_named_metric_exists(shared: Path) -> None:
    recorded = {r["record"] for path in (PROM / "rules").glob("*.yml")
                for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"] if "record" in r}
    known = (C.exported_sample_names() | recorded | engine_series(shared) | alertmanager_series() | gateway_series()
             | prometheus_series() | {"up"})
    unknown = {(where, name) for where, expr in all_queries() for name in metric_names(grafana_free(expr))
               if name not in known}
    assert not unknown, sorted(unknown)


def test_metric_name_extraction_sees_through_promql() -> None:
    expr = ('1 + sum by (target, le) (rate(ornith_spec_accepted_tokens_total{profile=~"$p"}[5m])) '
            '/ on(profile) group_left() vllm:num_requests_running > bool 0.5 * vector(6.1)')
    assert metric_names(expr) == {"ornith_spec_accepted_tokens_total", "vllm:num_requests_running"}


def test_acceptance_thresholds_come_from_the_profiles() -> None:
    expected = {r["labels"]["profile"]: float(r["expr"][len("vector("):-1]) for r in alerts.threshold_rules()
                if r["record"] == alerts.EXPECTED_ACCEPTANCE}
    published = {p.name: min(p.expected.acceptance_length.values())
                 for p in load_all() if p.expected and p.expected.acceptance_length}
    assert published, "some profile publishes an acceptance length (seed 000: 6.1 GSM8K, 7.7 HumanEval)"
    assert expected == published


def test_ttft_thresholds_follow_the_profiles_published_sweep() -> None:
    """spark serves 262K-token prompts (122 s to the first token in its seed): its threshold is far above
    the 10 s default that a 40K pool without a published sweep gets."""
    thresholds = {r["labels"]["profile"]: float(r["expr"][len("vector("):-1]) for r in alerts.threshold_rules()
                  if r["record"] == alerts.TTFT_THRESHOLD}
    assert thresholds["spark"] > 10 * alerts.TTFT_P95_DEFAULT_S
    assert "gpu96" not in thresholds  # no sweep: the default applies


def test_every_alert_has_summary_description_and_a_complete_runbook() -> None:
    for group in yaml.safe_load((PROM / "rules" / "ornith-alerts.yml").read_text())["groups"]:
        for rule in group["rules"]:
            notes = rule["annotations"]
            assert notes["summary"] and notes["description"], rule["alert"]
            # An absolute link (an on-call engineer opens it from the page), to a runbook in this checkout.
            url = notes["runbook_url"]
            assert url.startswith(f"{alerts.runbook_base()}/") and url.startswith("https://"), url
            runbook = REPO / alerts.RUNBOOK_DIR / url.rpartition("/")[2]
            assert runbook.is_file(), runbook
            text = runbook.read_text()
            assert all(f"## {part}" in text for part in ("Meaning", "Check", "Fix")), runbook
            assert rule["expr"] in text, f"{runbook} states the expression that fires"
    assert {p.stem for p in (REPO / alerts.RUNBOOK_DIR).glob("*.md")} == {a.name for a in (*alerts.ALERTS, *alerts.HELM_ONLY)}


def test_dashboards_have_fixed_unique_uids_and_a_query_per_panel() -> None:
    uids = set()
    for path in sorted((REPO / dashboards.DASHBOARD_DIR).glob("*.json")):
        board = json.loads(path.read_text())
        assert board["uid"] == path.stem and board["uid"] not in uids
        uids.add(board["uid"])
        for panel in board["panels"]:
            if panel["type"] != "row":
                assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
                # The dashboard's datasource variable, never a fixed uid (kube-prometheus-stack has none).
                assert panel["datasource"]["uid"] == "${datasource}"
                assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
                assert panel["fieldConfig"]["defaults"]["unit"] in GRAFANA_UNITS or \
                    panel["fieldConfig"]["defaults"]["unit"].startswith("suffix:"), panel["title"]
        names = {v["name"] for v in board["templating"]["list"]}
        assert {"datasource", "profile", "target"} <= names
    assert uids == set(dashboards.DASHBOARDS)


def test_grafana_provisioning_points_at_the_dashboards_and_datasource() -> None:
    grafana = REPO / "monitoring" / "grafana" / "provisioning"
    source = yaml.safe_load((grafana / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert source["uid"] == dashboards.DATASOURCE_UID and source["type"] == "prometheus"
    provider = yaml.safe_load((grafana / "dashboards" / "ornith.yml").read_text())["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


def test_prometheus_scrapes_the_exporter_and_the_engines_it_watches() -> None:
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["ornith-exporter"]["static_configs"][0]["targets"] == ["exporter:9400"]
    # No fixed engine port list (a stack serves one profile): the exporter's own targets, discovered.
    assert jobs["engine"]["http_sd_configs"] == [{"url": "http://exporter:9400/sd/engines"}]
    # A runaway engine cannot flood Prometheus (a 50 MB body was read once), nor any other target: every
    # job, in compose and in Ansible's template, has each limit (issue 33).
    assert jobs["engine"]["body_size_limit"] == "8MB" and jobs["engine"]["sample_limit"] == 6000
    ansible = yaml.safe_load((REPO / "ansible/roles/monitoring/templates/prometheus.yml.j2").read_text())
    for job in [*config["scrape_configs"], *ansible["scrape_configs"]]:
        assert {"sample_limit", "label_limit", "label_value_length_limit", "body_size_limit"} <= set(job), job
    # Meta-monitoring: Prometheus itself and Alertmanager (its failed-notification counter).
    assert jobs["prometheus"]["static_configs"] == [{"targets": ["localhost:9090"]}]
    assert jobs["alertmanager"]["static_configs"] == [{"targets": ["alertmanager:9093"]}]


def test_readme_documents_every_metric() -> None:
    readme = (REPO / "monitoring" / "README.md").read_text()
    missing = [m.series for m in C.CATALOGUE if f"`{m.series}`" not in readme]
    assert not missing
    assert "histogram" in readme.lower()


def test_ansible_prometheus_template_fills_the_host_s_addresses_and_passes_promtool(tmp_path: Path) -> None:
    """The host-mode template (generated by the builder of compose's file), filled as the role fills it
    with a custom exporter address and interval: every job reaches the host's loopback addresses, and
    the result passes promtool with the rules at their installed paths."""
    import jinja2

    template = REPO / "ansible" / "roles" / "monitoring" / "templates" / "prometheus.yml.j2"
    text = jinja2.Template(template.read_text()).render(
        monitoring_exporter_listen="127.0.0.1:9555", monitoring_prometheus_scrape_interval="30s")
    host, compose = yaml.safe_load(text), yaml.safe_load((PROM / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in host["scrape_configs"]}
    exporter, engine, gateway = jobs["ornith-exporter"], jobs["engine"], jobs["gateway"]
    itself, alertmanager = jobs["prometheus"], jobs["alertmanager"]
    assert exporter["static_configs"] == [{"targets": ["127.0.0.1:9555"]}]
    assert itself["static_configs"] == [{"targets": ["localhost:9090"]}]
    assert alertmanager["static_configs"] == [{"targets": ["127.0.0.1:9093"]}]
    assert engine["http_sd_configs"] == [{"url": "http://127.0.0.1:9555/sd/engines"}]
    assert gateway["http_sd_configs"] == [{"url": "http://127.0.0.1:9555/sd/gateways"}]
    assert host["global"]["scrape_interval"] == "30s"
    assert [Path(f).name for f in host["rule_files"]] == [Path(f).name for f in compose["rule_files"]]
    if PROMTOOL:  # the role validates with promtool from a temporary copy, rules at absolute paths
        (tmp_path / "prometheus.yml").write_text(text.replace("/etc/prometheus/rules", str(PROM / "rules")))
        checked = promtool("check", "config", str(tmp_path / "prometheus.yml"))
        assert checked.returncode == 0, checked.stdout + checked.stderr


@needs_amtool
def test_alertmanager_configs_pass_amtool(tmp_path: Path) -> None:
    """compose's file, and the Ansible role's template filled with a webhook URL and with none."""
    import jinja2

    from ornith_stack.generate import alertmanager

    template = jinja2.Template((REPO / alertmanager.ANSIBLE_TEMPLATE).read_text())
    configs = {"compose.yml": (REPO / alertmanager.CONFIG).read_text()}
    for name, url in (("hook.yml", "https://hooks.example.org/ornith"), ("none.yml", ""), ("odd.yml", ODD_URL)):
        configs[name] = template.render(monitoring_alertmanager_webhook_url=url,
                                        monitoring_alertmanager_repeat_interval="4h")
    configs["three.yml"] = template.render(monitoring_alertmanager_webhook_url="https://pager.example.org/p",
                                           monitoring_alertmanager_warning_webhook_url="https://tickets.example.org/t",
                                           monitoring_alertmanager_heartbeat_url=ODD_URL,
                                           monitoring_alertmanager_repeat_interval="4h")
    for name, text in configs.items():
        (tmp_path / name).write_text(text)
        checked = subprocess.run([AMTOOL, "check-config", str(tmp_path / name)], capture_output=True, text=True,  # type: ignore[list-item]
                                 timeout=60, check=False)
        assert checked.returncode == 0, name + checked.stdout + checked.stderr
    assert "https://hooks.example.org/ornith" in configs["hook.yml"]
    odd = yaml.safe_load(configs["odd.yml"])
    assert {c["url"] for r in odd["receivers"] for c in r.get("webhook_configs", [])} == {ODD_URL}
    assert _urls(yaml.safe_load(configs["three.yml"])) == {
        alertmanager.RECEIVER: ["https://pager.example.org/p"], alertmanager.WARNING: ["https://tickets.example.org/t"],
        alertmanager.HEARTBEAT: [ODD_URL], alertmanager.NOBODY: []}
    assert _urls(odd)[alertmanager.HEARTBEAT] == []  # no heartbeat URL: the watchdog never reaches the pager


def _urls(config: dict[str, Any]) -> dict[str, list[str]]:
    return {r["name"]: [c["url"] for c in r.get("webhook_configs", [])] for r in config["receivers"]}


# A webhook URL that a text substitution corrupts: sed's replacement reads & as the match and | was its
# delimiter; the quotes and the space break a hand-quoted YAML scalar.
ODD_URL = "https://hooks.example.org/ornith?team=llm&route=a|b&note='on call'#x"


def test_compose_writes_the_webhook_url_through_a_yaml_library(tmp_path: Path) -> None:
    """What compose's alertmanager-config service runs: the URL arrives byte for byte, the result passes
    amtool, and an unset URL keeps the placeholder."""
    import os
    import sys

    from ornith_stack.generate import alertmanager

    pager, tickets, heartbeat = "https://pager.example.org/p", "https://tickets.example.org/t", ODD_URL
    # An unset warning URL is no webhook (tickets never at the pager), as an unset heartbeat URL is.
    for env, expected in (({alertmanager.WEBHOOK_ENV: ODD_URL}, [ODD_URL, None, None]),
                          ({alertmanager.WEBHOOK_ENV: ""}, [alertmanager.PLACEHOLDER_URL, None, None]),
                          ({alertmanager.WEBHOOK_ENV: pager, alertmanager.WARNING_WEBHOOK_ENV: tickets,
                            alertmanager.HEARTBEAT_ENV: heartbeat}, [pager, tickets, heartbeat])):
        out = tmp_path / "alertmanager.yml"
        subprocess.run([sys.executable, "-m", "ornith_stack.generate.alertmanager", str(REPO / alertmanager.CONFIG),
                        str(out)], env={**os.environ, **env}, check=True, timeout=60)
        urls = _urls(yaml.safe_load(out.read_text()))
        receivers = (alertmanager.RECEIVER, alertmanager.WARNING, alertmanager.HEARTBEAT)
        assert [(urls[r] or [None])[0] for r in receivers] == expected
        if AMTOOL:
            checked = subprocess.run([AMTOOL, "check-config", str(out)], capture_output=True, text=True, timeout=60,
                                     check=False)
            assert checked.returncode == 0, checked.stdout + checked.stderr
    # Ansible's compose mode writes the file with its URLs first: the one-shot, its variables unset, keeps them.
    written = tmp_path / "ansible.yml"
    alertmanager.write_with_webhooks(REPO / alertmanager.CONFIG, written, alertmanager.Webhooks(pager, tickets, heartbeat))
    alertmanager.write_with_webhooks(written, out, alertmanager.Webhooks())
    assert _urls(yaml.safe_load(out.read_text())) == _urls(yaml.safe_load(written.read_text()))
    assert _urls(yaml.safe_load(out.read_text()))[alertmanager.HEARTBEAT] == [heartbeat]
    compose = yaml.safe_load((REPO / "compose" / "cpu-demo.yml").read_text())
    service = compose["services"]["alertmanager"]
    assert service["depends_on"]["alertmanager-config"]["condition"] == "service_completed_successfully"
    assert "sed" not in json.dumps(service) and "sed" not in json.dumps(compose["services"]["alertmanager-config"])


def test_alertmanager_routes_alerts_to_the_webhook_and_inhibits_symptoms_of_a_starting_engine() -> None:
    from ornith_stack.generate import alertmanager

    config = yaml.safe_load((REPO / alertmanager.CONFIG).read_text())
    assert config["route"]["receiver"] == alertmanager.RECEIVER
    hook = next(r for r in config["receivers"] if r["name"] == alertmanager.RECEIVER)
    assert hook["webhook_configs"][0]["url"] == alertmanager.PLACEHOLDER_URL
    starting = next(rule for rule in config["inhibit_rules"] if "OrnithEngineStarting" in rule["source_matchers"][0])
    assert "OrnithCanaryFailing" in starting["target_matchers"][0] and starting["equal"] == ["target"]
    # Warnings to a receiver of their own, the watchdog to the heartbeat: neither reaches the pager.
    routes = {r["receiver"]: r["matchers"] for r in config["route"]["routes"]}
    assert routes[alertmanager.WARNING] == ['severity="warning"']
    assert "OrnithWatchdog" in routes[alertmanager.HEARTBEAT][0]
    compose = yaml.safe_load((REPO / "compose" / "cpu-demo.yml").read_text())
    env = compose["services"]["alertmanager-config"]["environment"]
    assert {alertmanager.WEBHOOK_ENV, alertmanager.WARNING_WEBHOOK_ENV, alertmanager.HEARTBEAT_ENV} <= set(env)
    prometheus_config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert prometheus_config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]


@pytest.mark.parametrize(("matcher", "expected"), [
    ('alertname=~"A|B"', {"name": "alertname", "value": "A|B", "matchType": "=~"}),
    ('severity="info"', {"name": "severity", "value": "info", "matchType": "="}),
    ('target!~"x.*"', {"name": "target", "value": "x.*", "matchType": "!~"}),
    ('severity!=""', {"name": "severity", "value": "", "matchType": "!="}),
])
def test_matchers_translate_to_the_alertmanagerconfig_shape(matcher: str, expected: dict[str, str]) -> None:
    from ornith_stack.generate import alertmanager

    assert alertmanager.crd_matcher(matcher) == expected


def test_alertmanagerconfig_translation_refuses_what_it_does_not_know() -> None:
    """A matcher it cannot read, or a new key of the configuration, fails instead of vanishing from the chart."""
    from ornith_stack.generate import alertmanager

    with pytest.raises(ValueError, match="not a matcher"):
        alertmanager.crd_matcher('alertname=~"a\\"b"')
    config = alertmanager.alertmanager_config()
    config["route"]["continue"] = False
    with pytest.raises(AssertionError, match="continue"):
        alertmanager.alertmanager_config_spec(config)


def test_every_dashboard_passes_grafanas_published_schema() -> None:
    """monitoring/grafana/schema/dashboard.jsonschema.json: grafana-foundation-sdk's dashboard schema of
    the 11.3 branch (the pinned grafana/grafana:11.3.0). The generated-file notice `$comment` is ours and
    left out; fields the schema requires but Grafana fills by default are not required of us."""
    import jsonschema

    schema = json.loads((REPO / "monitoring" / "grafana" / "schema" / "dashboard.jsonschema.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    for path in sorted((REPO / dashboards.DASHBOARD_DIR).glob("*.json")):
        board = json.loads(path.read_text())
        board.pop("$comment")
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(board)]
        assert not errors, f"{path.name}: " + "; ".join(errors[:10])
    # The schema does reject what Grafana does not know: a misspelt field fails.
    assert list(validator.iter_errors({**board, "panles": []}))


def test_latency_panels_show_the_p95_the_alert_reads_and_a_mean() -> None:
    board = dashboards.build("ornith-overview")
    by_title = {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in board["panels"]}
    for title in ("Time to first token", "Inter-token latency", "End-to-end request latency", "Queue time",
                  "Prefill and decode time", "Time per output token (TPOT)"):
        assert any(e.startswith("histogram_quantile(0.95,") for e in by_title[title]), title
    for title in ("Time to first token", "Inter-token latency", "End-to-end request latency"):
        assert any("_sum" in e and "_count" in e for e in by_title[title]), f"{title}: mean line"
    # What an on-call engineer looks for next to the alerts: the acceptance alert's guard, why requests
    # wait (vLLM), and the prompt/output length distributions.
    assert any(C.SPEC_VERIFY_STEPS_PER_SECOND.name in e for e in by_title["Verification steps per second"])
    assert any("vllm:num_requests_waiting_by_reason" in e and "reason" in e
               for e in by_title["Waiting requests by reason"])
    heatmaps = {p["title"] for p in board["panels"] if p["type"] == "heatmap"}
    assert {"Prompt length: distribution", "Output length: distribution"} <= heatmaps


def test_the_replica_variable_selects_engine_targets() -> None:
    """Every replica is one exporter target: the `target` variable (queries, saved links' var-target) is
    shown as "Replica", several or all at once."""
    board = json.loads((REPO / dashboards.DASHBOARD_DIR / "ornith-overview.json").read_text())
    variable = {v["name"]: v for v in board["templating"]["list"]}["target"]
    assert variable["label"] == "Replica"
    assert variable["multi"] and variable["includeAll"] and variable["allValue"] == ".*"
    assert variable["query"] == f'label_values({C.ENGINE_UP.series}{{profile=~"$profile"}}, target)'


# Three replicas of profile a100x2, one broken (replica-1), sampled every 15 s for 20 minutes: per
# minute 600 verification steps each, 3000, 1200 and 3000 accepted tokens (acceptance 6, 3, 6), 600,
# 300 and 600 decode tokens; 2, 10 and 0 requests waiting; 4, 4 and 2 running.
REPLICAS = ("http://replica-0:30000", "http://replica-1:30000", "http://replica-2:30000")
REPLICA_INPUT = {
    "ornith_spec_verify_steps_total": ("0+150x80",) * 3,
    "ornith_spec_accepted_tokens_total": ("0+750x80", "0+300x80", "0+750x80"),
    "ornith_decode_tokens_total": ("0+150x80", "0+75x80", "0+150x80"),
    "ornith_requests_waiting": ("2x80", "10x80", "0x80"),
    "ornith_requests_running": ("4x80", "4x80", "2x80"),
}
# What each query of the "Per replica" row reads from them, by (panel, legend): per replica, then the
# pool (acceptance 1 + 5400 / 1800 accepted per step, not the mean of 6, 3 and 6).
REPLICA_EXPECTED = {
    ("Acceptance length by replica", "{{target}}"): (6, 3, 6),
    ("Decode throughput by replica", "{{target}}"): (10, 5, 10),
    ("Requests queued and running by replica", "{{target}} waiting"): (2, 10, 0),
    ("Requests queued and running by replica", "{{target}} running"): (4, 4, 2),
    ("Acceptance length, all replicas", "{{profile}} all replicas"): (5,),
    ("Decode throughput, all replicas", "{{profile}} all replicas"): (25,),
    ("Requests queued and running, all replicas", "{{profile}} waiting"): (12,),
    ("Requests queued and running, all replicas", "{{profile}} running"): (10,),
}


@needs_promtool
def test_per_replica_panels_show_each_replica_and_the_pool(tmp_path: Path) -> None:
    """The row's queries, run by promtool over the recording rules: each replica by its own `target`,
    the totals by profile, the broken replica visible beside its healthy siblings, and the gateway's
    requests and health per replica (`worker`)."""
    board = json.loads((REPO / dashboards.DASHBOARD_DIR / "ornith-overview.json").read_text())
    row_at = next(i for i, p in enumerate(board["panels"]) if p["type"] == "row" and p["title"] == "Per replica")
    row = list(itertools.takewhile(lambda p: p["type"] != "row", board["panels"][row_at + 1:]))
    queries = {(p["title"], t["legendFormat"]): grafana_free(t["expr"]) for p in row for t in p["targets"]}
    assert set(REPLICA_EXPECTED) <= set(queries), sorted(set(REPLICA_EXPECTED) - set(queries))
    labels = 'profile="a100x2", engine="sglang", model="m"'
    series = [{"series": f'{name}{{target="{target}", {labels}}}', "values": values}
              for name, per_replica in REPLICA_INPUT.items() for target, values in zip(REPLICAS, per_replica, strict=True)]
    tests = []
    for (title, legend), values in REPLICA_EXPECTED.items():
        by = "target" if legend.startswith("{{target}}") else "profile"
        keys = REPLICAS if by == "target" else ("a100x2",)
        tests.append({"expr": queries[title, legend], "eval_time": "20m",
                      "exp_samples": [{"labels": f'{{{by}="{key}"}}', "value": value}
                                      for key, value in zip(keys, values, strict=True)]})
    # The gateway (its own target) routed 30 requests a minute to replica-0 and 15 to replica-1; its health
    # checks took replica-2 out.
    gateway = 'target="http://gateway:29000", profile="a100x2"'
    routed, healthy = ("0+7.5x80", "0+3.75x80", "0x80"), ("1x80", "1x80", "0x80")
    for replica, requests, health in zip(REPLICAS, routed, healthy, strict=True):
        series += [{"series": f'smg_worker_cb_outcomes_total{{worker="{replica}", outcome="success", {gateway}}}',
                    "values": requests},
                   {"series": f'smg_worker_health{{worker="{replica}", {gateway}}}', "values": health}]
    tests += [
        {"expr": queries["Gateway: requests per replica", "{{worker}} {{outcome}}"], "eval_time": "20m",
         "exp_samples": [{"labels": f'{{worker="{replica}", outcome="success"}}', "value": value}
                         for replica, value in zip(REPLICAS, (0.5, 0.25, 0), strict=True)]},
        {"expr": queries["Gateway: replica health", "{{worker}}"], "eval_time": "20m",
         "exp_samples": [{"labels": f'smg_worker_health{{worker="{replica}", {gateway}}}', "value": value}
                         for replica, value in zip(REPLICAS, (1, 1, 0), strict=True)]},
    ]
    path = tmp_path / "per-replica.test.yml"
    path.write_text(yaml.safe_dump({
        "rule_files": [str(PROM / "rules" / "ornith-recording.yml")], "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": series, "promql_expr_test": tests}]}))
    result = promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


AGGREGATION = re.compile(r"\b(sum|avg|min|max|count|group|stddev|stdvar|topk|bottomk|quantile|count_values)\s*"
                         r"(?:(by|without)\s*\(([^)]*)\))?\s*\(")


def test_alerts_about_an_engine_keep_its_target_through_every_aggregation() -> None:
    """An alert whose summary names the target fires per target (per replica): no aggregation in its
    expression, or in the recording rules it reads, drops `target` (an average would hide a replica)."""
    recorded = {r.name: r.expr for r in C.RECORDED}
    checked = set()
    for alert in alerts.ALERTS:
        if "$labels.target" not in alert.summary:
            continue
        exprs = [alert.expr, *(expr for name, expr in recorded.items() if name in alert.expr)]
        for expr in exprs:
            for match in AGGREGATION.finditer(expr):
                op, mode, labels = match.groups()
                kept = {label.strip() for label in (labels or "").split(",")}
                assert mode == "by" and "target" in kept or mode == "without" and "target" not in kept, \
                    f"{alert.name}: {match.group(0)} drops target in {expr}"
        checked.add(alert.name)
    assert {"OrnithSpecAcceptanceLow", "OrnithQueueBacklog", "OrnithTimeToFirstTokenHigh", "OrnithEngineDown",
            "OrnithKVCacheNearlyFull"} <= checked


RUNBOOKS = sorted((REPO / alerts.RUNBOOK_DIR).glob("*.md"))


@pytest.mark.parametrize("path", RUNBOOKS, ids=lambda p: p.stem)
def test_a_runbook_reads_without_prometheus_templates_and_says_what_to_run_on_each_path(path: Path) -> None:
    text = path.read_text()
    # The alert's own text says `{{ $labels.target }}`; read in a runbook, that is the engine's name.
    assert "{{" not in text and "$labels" not in text, path.name
    table = text.split("## Commands", 1)[1]
    assert [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ")][1:] == [
        "compose (`ornith-stack up`)", "Helm", "Ansible host"]
    assert "restart" in table and "logs" in table
    uid = re.search(r"`/d/([\w-]+)`", text)
    assert uid and (REPO / dashboards.DASHBOARD_DIR / f"{uid[1]}.json").is_file(), path.name


def test_templates_become_what_the_alert_puts_there() -> None:
    assert alerts.untemplated("scrape {{ $labels.target }}/metrics at {{ $value | humanizePercentage }}") == (
        "scrape `<target>`/metrics at `<value>`")
