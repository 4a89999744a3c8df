"""Alertmanager's configuration: critical alerts to the paging webhook, warnings to a receiver of their
own, the always-firing watchdog to a separate heartbeat URL (a dead man's switch), info alerts to
nobody, and the inhibitions that keep one outage from paging once per symptom.

Three URLs, each set in one place per deployment: the paging webhook (critical), the warning (ticket) webhook
(empty: warnings stay in Alertmanager's UI, never at the pager) and the heartbeat (empty: the watchdog goes
nowhere). One builder, three files:
monitoring/alertmanager/alertmanager.yml (compose: a one-shot service runs
`python -m ornith_stack.generate.alertmanager` before Alertmanager starts, which writes the configuration
again through a YAML library with the URLs from the environment (`ORNITH_ALERT_WEBHOOK_URL`,
`ORNITH_ALERT_WARNING_WEBHOOK_URL`, `ORNITH_HEARTBEAT_URL`), so any URL, `&` and `|` included, arrives
intact), the Ansible monitoring role's template (its `monitoring_alertmanager_webhook_url`,
`monitoring_alertmanager_warning_webhook_url` and `monitoring_alertmanager_heartbeat_url`), and the Helm
chart's files/alertmanager-config.yaml: the same route, receivers and inhibitions as the spec of a
prometheus-operator AlertmanagerConfig, each webhook's URL the names of the chart values that give it
(templates/alertmanagerconfig.yaml puts the first non-empty one in its place).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ornith_stack import deployment as D
from ornith_stack.generate import alerts as A
from ornith_stack.generate.core import GeneratedFile, with_header
from ornith_stack.generate.prometheus import dump

CONFIG = "monitoring/alertmanager/alertmanager.yml"
ANSIBLE_TEMPLATE = "ansible/roles/monitoring/templates/alertmanager.yml.j2"
SOURCE = "src/ornith_stack/generate/alertmanager.py and the alert rules"
PLACEHOLDER_URL = D.ALERT_WEBHOOK_PLACEHOLDER
WEBHOOK_ENV = "ORNITH_ALERT_WEBHOOK_URL"
WARNING_WEBHOOK_ENV = "ORNITH_ALERT_WARNING_WEBHOOK_URL"
HEARTBEAT_ENV = "ORNITH_HEARTBEAT_URL"
# The paging receiver (critical, and the route's default), the warning one, the heartbeat, nobody.
RECEIVER, WARNING, NOBODY, HEARTBEAT = "ornith-webhook", "ornith-warning", "ornith-nobody", D.HEARTBEAT_RECEIVER
# The watchdog is repeated this often: a dead man's switch on the receiving side expects it.
HEARTBEAT_REPEAT = "5m"
# An Alertmanager matcher as this module writes them: label, operator, double-quoted value.
_MATCHER = re.compile(r'(?P<name>[A-Za-z_]\w*)(?P<op>=~|!~|!=|=)"(?P<value>[^"\\]*)"')

# One page per incident (issue 44): pages are grouped per deployment (profile, and namespace in Kubernetes), so
# the replicas of one outage, and an engine's OrnithEngineDown then OrnithEngineDownLong, are one notification
# group (one incident at the pager: Alertmanager's group key) whose later notifications update it; tickets
# stay one per alert and target.
PAGE_GROUP_BY = ["profile", "namespace"]
TICKET_GROUP_BY = ["alertname", "profile", "namespace", "target"]
NOTIFICATIONS_FAILING = "OrnithNotificationsFailing"
# Alerts of a target that an engine starting or down explains: inhibited while it lasts.
ENGINE_STATE = ("OrnithEngineStarting", "OrnithEngineDown", "OrnithEngineDownLong")
# A profile with no ready replica (or its gateway down) pages once: its engines' own pages and the SLO
# burn it causes are inhibited while it lasts.
OUTAGE = ("OrnithNoReadyReplicas", "OrnithGatewayDown")
OUTAGE_SYMPTOMS = ("OrnithEngineDown", "OrnithEngineDownLong", "OrnithEngineFlapping", "OrnithCanaryFailing",
                   "OrnithErrorBudgetBurn", "OrnithErrorBudgetBurnSlow", "OrnithTargetDown")
SYMPTOMS = ("OrnithCanaryFailing", "OrnithCanaryWrong", "OrnithCanaryStale", "OrnithSpecAcceptanceLow",
            "OrnithTimeToFirstTokenHigh", "OrnithQueueBacklog", "OrnithKVCacheNearlyFull",
            "OrnithMambaSlotsNearlyFull", "OrnithTargetDown")
# The exporter down explains the discovery it serves failing.
EXPORTER_SYMPTOMS = ("OrnithDiscoveryFailing",)


def _any_of(names: tuple[str, ...]) -> str:
    return f'alertname=~"{"|".join(names)}"'


@dataclass(frozen=True)
class Webhooks:
    """The receivers' URLs as a deployment gives them; empty: the default each one states."""

    critical: str = ""
    warning: str = ""  # empty: no ticket webhook (warnings stay in Alertmanager's UI, never at the pager)
    heartbeat: str = ""  # empty: no heartbeat webhook (the watchdog goes nowhere, never to the pager)

    def urls(self) -> dict[str, str]:
        return {RECEIVER: self.critical or PLACEHOLDER_URL, WARNING: self.warning, HEARTBEAT: self.heartbeat}

    @classmethod
    def from_env(cls) -> Webhooks:
        return cls(os.environ.get(WEBHOOK_ENV, ""), os.environ.get(WARNING_WEBHOOK_ENV, ""),
                   os.environ.get(HEARTBEAT_ENV, ""))


def alertmanager_config(urls: dict[str, str] | None = None, repeat_interval: str = "4h",
                        group_wait: str = "30s", group_interval: str = "5m") -> dict[str, Any]:
    """The configuration with `urls` (receiver -> URL; default: the placeholders of Webhooks())."""
    known = {alert.name for alert in A.ALERTS}
    named = set(ENGINE_STATE + SYMPTOMS + OUTAGE + OUTAGE_SYMPTOMS + EXPORTER_SYMPTOMS)
    assert named <= known, named - known
    urls = urls or {**Webhooks().urls(), WARNING: PLACEHOLDER_URL, HEARTBEAT: PLACEHOLDER_URL}

    def receiver(name: str) -> dict[str, Any]:
        return {"name": name, "webhook_configs": [{"url": urls[name], "send_resolved": True}]}

    return {
        "route": {
            "receiver": RECEIVER,
            "group_by": PAGE_GROUP_BY,
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
            "routes": [
                # The always-firing watchdog, repeated so that its absence is noticed.
                {"matchers": [_any_of(A.ALWAYS_FIRING)], "receiver": HEARTBEAT, "group_interval": "1m",
                 "repeat_interval": HEARTBEAT_REPEAT},
                # Failing notifications reach people through two receivers, the tickets' and (continue) the
                # pager's, so that one of them failing is still heard through the other.
                {"matchers": [f'alertname="{NOTIFICATIONS_FAILING}"'], "receiver": WARNING, "continue": True},
                {"matchers": [f'alertname="{NOTIFICATIONS_FAILING}"'], "receiver": RECEIVER},
                # Info alerts (OrnithEngineStarting) exist to inhibit, not to notify.
                {"matchers": ['severity="info"'], "receiver": NOBODY},
                # Warnings are tickets, not pages: a receiver of their own.
                {"matchers": ['severity="warning"'], "receiver": WARNING, "group_by": TICKET_GROUP_BY},
            ],
        },
        "inhibit_rules": [
            {"source_matchers": [_any_of(ENGINE_STATE)], "target_matchers": [_any_of(SYMPTOMS)],
             "equal": ["target"]},
            # An engine down past its start budget pages once, as OrnithEngineDownLong.
            {"source_matchers": ['alertname="OrnithEngineDownLong"'],
             "target_matchers": [_any_of(("OrnithEngineDown", "OrnithEngineFlapping"))], "equal": ["target"]},
            {"source_matchers": [_any_of(OUTAGE)], "target_matchers": [_any_of(OUTAGE_SYMPTOMS)],
             "equal": ["profile", "namespace"]},
            {"source_matchers": ['alertname="OrnithExporterDown"'], "target_matchers": [_any_of(EXPORTER_SYMPTOMS)],
             "equal": ["namespace"]},
            # A budget burning fast pages; the same SLO's slow burn (a ticket) says nothing new meanwhile.
            {"source_matchers": ['alertname="OrnithErrorBudgetBurn"'],
             "target_matchers": ['alertname="OrnithErrorBudgetBurnSlow"'], "equal": ["profile", "namespace", "slo"]},
        ],
        "receivers": [receiver(RECEIVER), receiver(WARNING), receiver(HEARTBEAT), {"name": NOBODY}],
    }


def with_webhooks(config: dict[str, Any], hooks: Webhooks) -> dict[str, Any]:
    """`config` with each receiver's URL from `hooks`, else the real URL `config` already holds (the
    Ansible role writes the file before compose's one-shot runs); a receiver left without one gets the
    default Webhooks states (the heartbeat: no webhook)."""
    held = {r["name"]: r["webhook_configs"][0]["url"] for r in config.get("receivers", [])
            if r.get("webhook_configs") and r["webhook_configs"][0].get("url") != PLACEHOLDER_URL}
    given = {RECEIVER: hooks.critical, WARNING: hooks.warning, HEARTBEAT: hooks.heartbeat}
    urls = Webhooks(*(given[name] or held.get(name, "") for name in (RECEIVER, WARNING, HEARTBEAT))).urls()
    for receiver in config.get("receivers", []):
        url = urls.get(receiver["name"])
        if url is None or "webhook_configs" not in receiver:
            continue
        if url:
            for webhook in receiver["webhook_configs"]:
                webhook["url"] = url
        else:
            del receiver["webhook_configs"]
    return config


def write_with_webhooks(source: Path, destination: Path, hooks: Webhooks) -> None:
    """Alertmanager's configuration from `source`, written to `destination` with the URLs set by a YAML
    library: whatever a URL holds is quoted as YAML needs, nothing is substituted in text."""
    config = with_webhooks(yaml.safe_load(source.read_text()), hooks)
    destination.write_text(dump(config))


# The role's variables: an empty paging URL keeps the placeholder (alerts stay in Alertmanager's UI); an empty
# warning or heartbeat URL leaves that receiver without a webhook (never the pager's).
ANSIBLE_URL = 'monitoring_alertmanager_webhook_url | default("' + PLACEHOLDER_URL + '", true)'
ANSIBLE_URLS = {
    RECEIVER: ANSIBLE_URL,
    WARNING: "monitoring_alertmanager_warning_webhook_url",
    HEARTBEAT: "monitoring_alertmanager_heartbeat_url",
}


def ansible_config() -> dict[str, Any]:
    """The role's template: its variables in place of the URLs and repeat interval."""
    return alertmanager_config({name: "{{ " + expr + " }}" for name, expr in ANSIBLE_URLS.items()},
                               "{{ monitoring_alertmanager_repeat_interval }}")


def ansible_template() -> str:
    """The role's template as text: each URL goes in as a JSON string (valid YAML), so whatever it holds
    (`&`, `|`, quotes) is escaped by Jinja2's tojson instead of pasted into a YAML scalar; the heartbeat
    and warning receivers' webhook lists are JSON lists, empty without their URL."""
    text = dump(ansible_config())
    for name, expr in ANSIBLE_URLS.items():
        quoted = "url: '{{ " + expr + " }}'"
        assert quoted in text, f"the {name} URL expression is no longer where ansible_template expects it"
        if name in (WARNING, HEARTBEAT):
            listed = f"- {quoted}\n    send_resolved: true"
            assert listed in text, f"the {name} webhook is no longer where ansible_template expects it"
            text = text.replace("webhook_configs:\n  " + listed, "webhook_configs: {{ ([{'url': " + expr
                                + ", 'send_resolved': true}] if " + expr + " else []) | tojson }}")
        else:
            text = text.replace(quoted, "url: {{ " + expr + " | tojson }}")
    return text


# Each receiver's URL in the Helm chart: the values (under monitoring.alertmanagerConfig) that give it, the
# first non-empty one wins; none: the receiver gets no webhook. The chart's template reads these names.
HELM_URL_VALUES = {RECEIVER: "webhookUrl", WARNING: "warningWebhookUrl", HEARTBEAT: "heartbeatUrl"}


def crd_matcher(matcher: str) -> dict[str, str]:
    """`alertname=~"A|B"` as an AlertmanagerConfig matcher: {name: alertname, value: "A|B", matchType: "=~"}."""
    found = _MATCHER.fullmatch(matcher)
    if not found:
        raise ValueError(f"not a matcher this translation knows: {matcher!r}")
    return {"name": found["name"], "value": found["value"], "matchType": found["op"]}


def _only(mapping: dict[str, Any], *keys: str) -> dict[str, Any]:
    """`mapping`, refusing keys the translation does not know (they would be dropped silently)."""
    unknown = set(mapping) - set(keys)
    assert not unknown, f"no AlertmanagerConfig translation for {sorted(unknown)}"
    return mapping


def _crd_route(route: dict[str, Any]) -> dict[str, Any]:
    _only(route, "matchers", "receiver", "group_by", "group_interval", "repeat_interval", "continue")
    out: dict[str, Any] = {"receiver": route["receiver"], "matchers": [crd_matcher(m) for m in route["matchers"]]}
    if route.get("continue"):
        out["continue"] = True
    for key, crd_key in (("group_by", "groupBy"), ("group_interval", "groupInterval"),
                         ("repeat_interval", "repeatInterval")):
        if key in route:
            out[crd_key] = route[key]
    return out


def alertmanager_config_spec(config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The spec of a prometheus-operator AlertmanagerConfig (monitoring.coreos.com/v1alpha1) with the
    route, receivers and inhibitions of `config` (default: alertmanager_config(), the placeholder URL).

    The operator scopes an AlertmanagerConfig to its namespace (matcher strategy OnNamespace, the
    default): it adds a `namespace="<the object's namespace>"` matcher to the top route and to both sides
    of every inhibition, so these apply only to alerts carrying that namespace label."""
    config = _only(config or alertmanager_config(HELM_URL_VALUES), "route", "inhibit_rules", "receivers")
    route = _only(config["route"], "receiver", "group_by", "group_wait", "group_interval", "repeat_interval",
                  "routes")
    receivers = []
    for receiver in config["receivers"]:
        out: dict[str, Any] = {"name": _only(receiver, "name", "webhook_configs")["name"]}
        if "webhook_configs" in receiver:
            out["webhookConfigs"] = [{"url": _only(c, "url", "send_resolved")["url"], "sendResolved": c["send_resolved"]}
                                     for c in receiver["webhook_configs"]]
        receivers.append(out)
    return {
        "route": {
            "receiver": route["receiver"],
            "groupBy": route["group_by"],
            "groupWait": route["group_wait"],
            "groupInterval": route["group_interval"],
            "repeatInterval": route["repeat_interval"],
            "routes": [_crd_route(r) for r in route["routes"]],
        },
        "receivers": receivers,
        "inhibitRules": [
            {"sourceMatch": [crd_matcher(m) for m in rule["source_matchers"]],
             "targetMatch": [crd_matcher(m) for m in rule["target_matchers"]],
             "equal": rule["equal"]}
            for rule in (_only(r, "source_matchers", "target_matchers", "equal") for r in config["inhibit_rules"])
        ],
    }


def files(root: Path) -> Iterator[GeneratedFile]:
    yield GeneratedFile(CONFIG, SOURCE, lambda: with_header(SOURCE, dump(alertmanager_config()), "yaml"))
    yield GeneratedFile(ANSIBLE_TEMPLATE, SOURCE, lambda: with_header(SOURCE, ansible_template(), "yaml"))


if __name__ == "__main__":  # compose's alertmanager-config service: SOURCE DESTINATION, URLs from the environment
    write_with_webhooks(Path(sys.argv[1]), Path(sys.argv[2]), Webhooks.from_env())
