"""Every outage of issue 33 against the shipped rules in promtool: each pages once, at its severity, by its
stated minute; a planned restart and a traffic lull page nobody (tests/outages.py describes each).
Alertmanager's inhibitions turn the alerts firing beside a page into nothing: checked against the
shipped configuration, as Alertmanager matches them."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from outages import (
    COMPOSE,
    ISSUE_44,
    Fired,
    Outage,
    engine_hung,
    exporter_dies_while_an_engine_is_hung,
    exporter_gone_from_discovery,
    promtool_file,
    replica_gone_from_discovery,
)
from test_helm import NAMESPACE, find, rendered

from ornith_stack import deployment as D
from ornith_stack.generate import alertmanager, alerts

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "monitoring" / "prometheus" / "rules"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")
_MATCHER = re.compile(r'(?P<name>\w+)(?P<op>=~|=)"(?P<value>[^"]*)"')


def run_promtool(tmp_path: Path, outages: list[Outage], rule_files: list[Path], evaluation: str = "1m") -> None:
    path = tmp_path / "outages.test.yml"
    path.write_text(yaml.safe_dump(promtool_file(outages, [str(f) for f in rule_files], evaluation), width=10_000))
    assert PROMTOOL
    result = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


@needs_promtool
def test_every_compose_outage_pages_once_in_time_and_a_restart_or_lull_pages_nobody(tmp_path: Path) -> None:
    run_promtool(tmp_path, [build() for build in COMPOSE], sorted(RULES.glob("*.yml")))


SHIPPED_EVALUATION_S = int(D.SCRAPE_INTERVAL.removesuffix("s"))


@needs_promtool
def test_a_hung_engine_has_an_alert_at_every_evaluation_and_one_page_at_a_time(tmp_path: Path) -> None:
    """Evaluated every 15 s, as the shipped Prometheus does: OrnithEngineDown (up within the start budget)
    must still fire when OrnithEngineDownLong (down for the start budget) takes over, not stop an
    evaluation before it."""
    run_promtool(tmp_path, [engine_hung(SHIPPED_EVALUATION_S)], sorted(RULES.glob("*.yml")), D.SCRAPE_INTERVAL)


def test_a_hung_engine_pages_once_at_each_phase() -> None:
    """Where OrnithEngineDown and OrnithEngineDownLong overlap, Alertmanager inhibits one of them."""
    for minute, fired in engine_hung(SHIPPED_EVALUATION_S).phases:
        paging = [f for f in fired if not any(inhibited(other, f) for other in fired if other != f)]
        assert len(paging) == 1, f"minute {minute}: {[f.alert for f in paging]} page"


@needs_promtool
def test_an_exporter_gone_from_kubernetes_discovery_pages(tmp_path: Path) -> None:
    """The rules as the chart renders them for namespace NAMESPACE (the absent() checks are Helm's)."""
    (rule,) = find(rendered("values-gpu96.yaml"), "PrometheusRule")
    path = tmp_path / "helm-rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, width=10_000))
    run_promtool(tmp_path, [exporter_gone_from_discovery(NAMESPACE)], [path])


@needs_promtool
def test_an_engine_pod_gone_from_the_gateway_s_discovery_pages(tmp_path: Path) -> None:
    """The chart's rules with the gateway and engine.replicas 2: a replica whose pod is gone took its sidecar
    along, and the gateway's worker list still says one is missing."""
    (rule,) = find(rendered("ci/gpu96-gateway.yaml"), "PrometheusRule")
    assert "< 2" in next(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]
                         if r.get("alert") == "OrnithReplicasMissing")
    path = tmp_path / "helm-rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}, width=10_000))
    run_promtool(tmp_path, [replica_gone_from_discovery(NAMESPACE)], [path])


def _matches(matchers: list[str], labels: dict[str, str]) -> bool:
    for matcher in matchers:
        found = _MATCHER.fullmatch(matcher)
        assert found, matcher
        value = labels.get(found["name"], "")
        if not (re.fullmatch(found["value"], value) if found["op"] == "=~" else value == found["value"]):
            return False
    return True


def inhibited(page: Fired, target: Fired) -> bool:
    """Whether the shipped Alertmanager configuration inhibits `target` while `page` fires."""
    config = yaml.safe_load((REPO / alertmanager.CONFIG).read_text())
    source = {"alertname": page.alert, "severity": page.severity, **page.labels}
    other = {"alertname": target.alert, "severity": target.severity, **target.labels}
    return any(_matches(rule["source_matchers"], source) and _matches(rule["target_matchers"], other)
               and all(source.get(k, "") == other.get(k, "") for k in rule["equal"])
               for rule in config["inhibit_rules"])


@pytest.mark.parametrize("build", COMPOSE, ids=lambda b: b().name)
def test_what_fires_beside_a_page_is_inhibited(build) -> None:  # type: ignore[no-untyped-def]
    outage = build()
    for other in (*outage.beside, *outage.inhibited):
        assert outage.page and inhibited(outage.page, other), f"{other.alert} pages beside {outage.page}"


def test_an_inhibition_needs_the_same_profile() -> None:
    """One profile's outage does not silence another profile's burn."""
    page = Fired("OrnithNoReadyReplicas", "critical", {"profile": "gpu96"})
    assert inhibited(page, Fired("OrnithErrorBudgetBurn", "critical", {"profile": "gpu96", "slo": "gateway"}))
    assert not inhibited(page, Fired("OrnithErrorBudgetBurn", "critical", {"profile": "spark", "slo": "engine"}))


def test_outages_cover_the_new_alerts() -> None:
    paged = {o.page.alert for o in (*(b() for b in COMPOSE), exporter_gone_from_discovery(NAMESPACE)) if o.page}
    new = {"OrnithErrorBudgetBurn", "OrnithNoReadyReplicas", "OrnithGatewayDown", "OrnithExporterAbsent",
           "OrnithSpecAcceptanceLow"}
    assert new <= paged and new <= {a.name for a in (*alerts.ALERTS, *alerts.HELM_ONLY)}


def test_a_ttft_threshold_between_buckets_is_refused_with_the_choices() -> None:
    """The good-events count is the bucket at the threshold: a bound the engine's histogram lacks is a user
    mistake, said in one line with the bounds to pick from."""
    from ornith_stack.errors import UserError
    from ornith_stack.profiles import load_profile

    spark = load_profile("spark", {"slo.ttft_seconds": "150"})
    with pytest.raises(UserError, match=r"slo.ttft_seconds 150 is not a bucket of vllm's TTFT histogram; pick one of .*160\.0"):
        alerts.bad_share("ttft", "5m", [spark])
    assert 'profile="spark", le=~"160|160.0"' in alerts.bad_share("ttft", "5m", [load_profile("spark")])


@needs_promtool
def test_issue_44s_outages_page_once_in_time_and_its_noise_pages_nobody(tmp_path: Path) -> None:
    """Six hours of history before each outage, so the 6-hour windows hold real traffic; evaluated at the shipped
    15 s interval."""
    run_promtool(tmp_path, [build() for build in ISSUE_44], sorted(RULES.glob("*.yml")), D.SCRAPE_INTERVAL)


def test_the_exporters_death_is_one_page() -> None:
    """While the exporter is down, what it last saw holds: the hung replica's pages continue beside
    OrnithExporterDown, which inhibits nothing and is inhibited by nothing."""
    outage = exporter_dies_while_an_engine_is_hung()
    for minute, fired in outage.phases:
        paging = [f for f in fired if not any(inhibited(other, f) for other in fired if other != f)]
        assert [f.alert for f in paging if f.alert != "OrnithExporterDown"] in (["OrnithEngineDown"], ["OrnithEngineDownLong"]), minute


def pages(fired: tuple[Fired, ...] | list[Fired]) -> set[tuple[str, ...]]:
    """The incidents the pager gets for these firing alerts: the notification groups (Alertmanager's group key,
    the shipped route's group_by) of the critical alerts no other one inhibits."""
    route = yaml.safe_load((REPO / alertmanager.CONFIG).read_text())["route"]
    paging = [f for f in fired if f.severity == "critical"
              and not any(inhibited(other, f) for other in fired if other != f)]
    return {tuple({"alertname": f.alert, **f.labels}.get(k, "") for k in route["group_by"]) for f in paging}


def test_a_hung_replica_is_one_incident_from_its_first_page_to_its_last() -> None:
    """Issue 44: a hung replica paged twice (OrnithEngineDown at +2m, OrnithEngineDownLong at +20m)."""
    phases = engine_hung(SHIPPED_EVALUATION_S).phases
    assert len(set().union(*(pages(fired) for _, fired in phases))) == 1


def test_all_replicas_hung_is_one_incident() -> None:
    """Issue 44: four hung replicas were five pages (4x OrnithEngineDown, then OrnithNoReadyReplicas)."""
    replicas = [Fired("OrnithEngineDown", "critical", {"target": f"http://replica-{i}:30000", "profile": "gpu96"})
                for i in range(4)]
    assert len(pages(replicas)) == 1
    assert len(pages([*replicas, Fired("OrnithNoReadyReplicas", "critical", {"profile": "gpu96"})])) == 1
    # Another deployment's outage is another incident.
    assert len(pages([*replicas, Fired("OrnithNoReadyReplicas", "critical", {"profile": "spark"})])) == 2


AMTOOL = shutil.which("amtool")


def routed(config: Path, **labels: str) -> list[str]:
    """The receivers the real Alertmanager routing (amtool) picks for an alert with these labels."""
    assert AMTOOL
    done = subprocess.run([AMTOOL, "config", "routes", "test", f"--config.file={config}",
                           *(f"{k}={v}" for k, v in labels.items())], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(",")


@pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (Debian: apt-get install prometheus-alertmanager)")
def test_warnings_never_reach_the_pager_and_failing_notifications_go_two_ways(tmp_path: Path) -> None:
    """Issue 44: warnings went to the pager's URL by default, and OrnithNotificationsFailing only through the
    integration that was failing."""
    config = tmp_path / "alertmanager.yml"
    alertmanager.write_with_webhooks(REPO / alertmanager.CONFIG, config, alertmanager.Webhooks("https://pager.example/x"))
    loaded = {r["name"]: r.get("webhook_configs", []) for r in yaml.safe_load(config.read_text())["receivers"]}
    assert loaded[alertmanager.WARNING] == [] and loaded[alertmanager.HEARTBEAT] == []
    assert routed(config, alertname="OrnithQueueBacklog", severity="warning") == [alertmanager.WARNING]
    assert routed(config, alertname="OrnithEngineDown", severity="critical") == [alertmanager.RECEIVER]
    assert routed(config, alertname="OrnithNotificationsFailing", severity="critical") == [
        alertmanager.WARNING, alertmanager.RECEIVER]
