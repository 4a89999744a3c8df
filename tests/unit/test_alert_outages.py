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
from outages import COMPOSE, Fired, Outage, engine_hung, exporter_gone_from_discovery, promtool_file
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
