"""Alertmanager's configuration: every Ornith alert to one webhook receiver, info alerts to nobody, and
the inhibitions that keep a starting or dead engine from paging once per symptom.

One builder, three files: monitoring/alertmanager/alertmanager.yml (compose: a one-shot service runs
`python -m ornith_stack.generate.alertmanager` before Alertmanager starts, which writes the configuration
again through a YAML library with `ORNITH_ALERT_WEBHOOK_URL` as every webhook's URL, so any URL, `&` and
`|` included, arrives intact), the Ansible monitoring role's
template (its `monitoring_alertmanager_webhook_url`), and the Helm chart's files/alertmanager-config.yaml:
the same route, receivers and inhibitions as the spec of a prometheus-operator AlertmanagerConfig, whose
template (templates/alertmanagerconfig.yaml) puts the chart value `monitoring.alertmanagerConfig.webhookUrl`
in place of the URL.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
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
RECEIVER, NOBODY, HEARTBEAT = "ornith-webhook", "ornith-nobody", "ornith-heartbeat"
# The watchdog is repeated this often: a dead man's switch on the receiving side expects it.
HEARTBEAT_REPEAT = "5m"
# An Alertmanager matcher as this module writes them: label, operator, double-quoted value.
_MATCHER = re.compile(r'(?P<name>[A-Za-z_]\w*)(?P<op>=~|!~|!=|=)"(?P<value>[^"\\]*)"')

# Alerts of a target that an engine starting or down explains: inhibited while it lasts.
ENGINE_STATE = ("OrnithEngineStarting", "OrnithEngineDown", "OrnithEngineDownLong")
SYMPTOMS = ("OrnithCanaryFailing", "OrnithCanaryWrong", "OrnithCanaryStale", "OrnithSpecAcceptanceLow",
            "OrnithTimeToFirstTokenHigh", "OrnithQueueBacklog", "OrnithKVCacheNearlyFull",
            "OrnithMambaSlotsNearlyFull")


def _any_of(names: tuple[str, ...]) -> str:
    return f'alertname=~"{"|".join(names)}"'


def alertmanager_config(webhook_url: str = PLACEHOLDER_URL, repeat_interval: str = "4h",
                        group_wait: str = "30s", group_interval: str = "5m") -> dict[str, Any]:
    known = {alert.name for alert in A.ALERTS}
    assert set(ENGINE_STATE + SYMPTOMS) <= known, set(ENGINE_STATE + SYMPTOMS) - known
    return {
        "route": {
            "receiver": RECEIVER,
            "group_by": ["alertname", "target"],
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
            "routes": [
                # The always-firing watchdog, repeated so that its absence is noticed.
                {"matchers": [_any_of(A.ALWAYS_FIRING)], "receiver": HEARTBEAT, "group_interval": "1m",
                 "repeat_interval": HEARTBEAT_REPEAT},
                # Info alerts (OrnithEngineStarting) exist to inhibit, not to notify.
                {"matchers": ['severity="info"'], "receiver": NOBODY},
            ],
        },
        "inhibit_rules": [
            {"source_matchers": [_any_of(ENGINE_STATE)], "target_matchers": [_any_of(SYMPTOMS)],
             "equal": ["target"]},
            # An engine down past its start budget pages once, as OrnithEngineDownLong.
            {"source_matchers": ['alertname="OrnithEngineDownLong"'],
             "target_matchers": [_any_of(("OrnithEngineDown", "OrnithEngineFlapping"))], "equal": ["target"]},
        ],
        "receivers": [
            {"name": RECEIVER, "webhook_configs": [{"url": webhook_url, "send_resolved": True}]},
            {"name": HEARTBEAT, "webhook_configs": [{"url": webhook_url, "send_resolved": True}]},
            {"name": NOBODY},
        ],
    }


def with_webhook(config: dict[str, Any], url: str) -> dict[str, Any]:
    """`config` with `url` as the URL of every webhook receiver (an empty `url` keeps the placeholder)."""
    for receiver in config.get("receivers", []):
        for webhook in receiver.get("webhook_configs", []):
            webhook["url"] = url or PLACEHOLDER_URL
    return config


def write_with_webhook(source: Path, destination: Path, url: str) -> None:
    """Alertmanager's configuration from `source`, written to `destination` with the webhook URL set by
    a YAML library: whatever the URL holds is quoted as YAML needs, nothing is substituted in text."""
    config = with_webhook(yaml.safe_load(source.read_text()), url)
    destination.write_text(dump(config))


ANSIBLE_URL = 'monitoring_alertmanager_webhook_url | default("' + PLACEHOLDER_URL + '", true)'


def ansible_config() -> dict[str, Any]:
    """The role's template: its variables in place of the URL and repeat interval (an empty URL keeps
    the placeholder, so alerts stay in Alertmanager's UI)."""
    return alertmanager_config("{{ " + ANSIBLE_URL + " }}", "{{ monitoring_alertmanager_repeat_interval }}")


def ansible_template() -> str:
    """The role's template as text: the URL goes in as a JSON string (valid YAML), so whatever it holds
    (`&`, `|`, quotes) is escaped by Jinja2's tojson instead of pasted into a YAML scalar."""
    quoted = "'{{ " + ANSIBLE_URL + " }}'"
    text = dump(ansible_config())
    assert quoted in text, "the webhook URL expression is no longer where ansible_template expects it"
    return text.replace(quoted, "{{ " + ANSIBLE_URL + " | tojson }}")


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
    _only(route, "matchers", "receiver", "group_interval", "repeat_interval")
    out: dict[str, Any] = {"receiver": route["receiver"], "matchers": [crd_matcher(m) for m in route["matchers"]]}
    for key, crd_key in (("group_interval", "groupInterval"), ("repeat_interval", "repeatInterval")):
        if key in route:
            out[crd_key] = route[key]
    return out


def alertmanager_config_spec(config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The spec of a prometheus-operator AlertmanagerConfig (monitoring.coreos.com/v1alpha1) with the
    route, receivers and inhibitions of `config` (default: alertmanager_config(), the placeholder URL).

    The operator scopes an AlertmanagerConfig to its namespace (matcher strategy OnNamespace, the
    default): it adds a `namespace="<the object's namespace>"` matcher to the top route and to both sides
    of every inhibition, so these apply only to alerts carrying that namespace label."""
    config = _only(config or alertmanager_config(), "route", "inhibit_rules", "receivers")
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


if __name__ == "__main__":  # compose's alertmanager-config service: SOURCE DESTINATION, URL from the environment
    write_with_webhook(Path(sys.argv[1]), Path(sys.argv[2]), os.environ.get(WEBHOOK_ENV, ""))
