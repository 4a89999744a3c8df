"""Alertmanager's configuration: every Ornith alert to one webhook receiver, info alerts to nobody, and
the inhibitions that keep a starting or dead engine from paging once per symptom.

One builder, two files: monitoring/alertmanager/alertmanager.yml (compose: the alertmanager service puts
`ORNITH_ALERT_WEBHOOK_URL` in place of `PLACEHOLDER_URL` when it starts; the Helm chart's
`alertmanager.webhookUrl` likewise) and the Ansible monitoring role's template (its
`monitoring_alertmanager_webhook_url`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ornith_stack import deployment as D
from ornith_stack.generate import alerts as A
from ornith_stack.generate.core import GeneratedFile, with_header
from ornith_stack.generate.prometheus import dump

CONFIG = "monitoring/alertmanager/alertmanager.yml"
ANSIBLE_TEMPLATE = "ansible/roles/monitoring/templates/alertmanager.yml.j2"
SOURCE = "src/ornith_stack/generate/alertmanager.py and the alert rules"
PLACEHOLDER_URL = D.ALERT_WEBHOOK_PLACEHOLDER
WEBHOOK_ENV = "ORNITH_ALERT_WEBHOOK_URL"
RECEIVER, NOBODY = "ornith-webhook", "ornith-nobody"

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
            # Info alerts (OrnithEngineStarting) exist to inhibit, not to notify.
            "routes": [{"matchers": ['severity="info"'], "receiver": NOBODY}],
        },
        "inhibit_rules": [
            {"source_matchers": [_any_of(ENGINE_STATE)], "target_matchers": [_any_of(SYMPTOMS)],
             "equal": ["target"]},
            # An engine down past the start-up grace pages once, as OrnithEngineDownLong.
            {"source_matchers": ['alertname="OrnithEngineDownLong"'], "target_matchers": ['alertname="OrnithEngineDown"'],
             "equal": ["target"]},
        ],
        "receivers": [
            {"name": RECEIVER, "webhook_configs": [{"url": webhook_url, "send_resolved": True}]},
            {"name": NOBODY},
        ],
    }


def ansible_config() -> dict[str, Any]:
    """The role's template: its variables in place of the URL and repeat interval (an empty URL keeps
    the placeholder, so alerts stay in Alertmanager's UI)."""
    url = '{{ monitoring_alertmanager_webhook_url | default("' + PLACEHOLDER_URL + '", true) }}'
    return alertmanager_config(url, "{{ monitoring_alertmanager_repeat_interval }}")


def files(root: Path) -> Iterator[GeneratedFile]:
    yield GeneratedFile(CONFIG, SOURCE, lambda: with_header(SOURCE, dump(alertmanager_config()), "yaml"))
    yield GeneratedFile(ANSIBLE_TEMPLATE, SOURCE, lambda: with_header(SOURCE, dump(ansible_config()), "yaml"))
