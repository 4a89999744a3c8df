"""monitoring/README.md: the exporter, the metrics catalogue and the alerts, from a Jinja2 template."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ornith_stack.exporter import catalogue as C
from ornith_stack.exporter.httpd import Limits
from ornith_stack.generate import alertmanager, alerts
from ornith_stack.generate.core import GeneratedFile, environment, with_header
from ornith_stack.profiles.model import Slo

TEMPLATE = "monitoring-readme.md.j2"
SOURCE = (f"src/ornith_stack/templates/{TEMPLATE}, src/ornith_stack/exporter/catalogue.py and "
          "src/ornith_stack/generate/prometheus.py")


def readme() -> str:
    return environment().get_template(TEMPLATE).render(
        metrics=C.CATALOGUE,
        recorded=C.RECORDED,
        error_reasons=C.ERROR_REASONS,
        canary_outcomes=C.CANARY_OUTCOMES,
        max_positions=C.MAX_POSITIONS,
        skip_reasons=C.SKIP_REASONS,
        max_buckets=C.MAX_BUCKETS,
        max_series=C.MAX_SERIES_PER_TARGET,
        max_label_length=C.MAX_LABEL_LENGTH,
        max_targets=C.MAX_TARGETS,
        limits=Limits(),
        alerts=alerts.alert_rules()["groups"][0]["rules"],
        acceptance_5m=C.SPEC_ACCEPTANCE_LENGTH.name,
        expected_acceptance=C.EXPECTED_ACCEPTANCE,
        acceptance_fraction=alerts.ACCEPTANCE_FRACTION,
        min_verify_steps=alerts.MIN_VERIFY_STEPS_PER_S,
        runbook_dir="runbooks",
        receiver=alertmanager.RECEIVER, warning_receiver=alertmanager.WARNING,
        heartbeat_receiver=alertmanager.HEARTBEAT, webhook_env=alertmanager.WEBHOOK_ENV,
        warning_env=alertmanager.WARNING_WEBHOOK_ENV, heartbeat_env=alertmanager.HEARTBEAT_ENV,
        runbook_key=alerts.RUNBOOK_URL_KEY, runbook_base=alerts.runbook_base(), slo=Slo(),
        burn_windows=alerts.BURN_WINDOWS, page_burns=alerts.burns_text(alerts.PAGE_BURNS),
        ticket_burns=alerts.burns_text(alerts.TICKET_BURNS), min_slo_events=alerts.MIN_SLO_EVENTS, planned_restart=alerts.PLANNED_RESTART,
        start_budget=alerts.START_BUDGET, acceptance_own=alerts.ACCEPTANCE_OWN_FRACTION,
        acceptance_window=alerts.ACCEPTANCE_OWN_WINDOW, acceptance_floor=alerts.ACCEPTANCE_FLOOR,
        host=alerts, gpu_states=C.GPU_STATES, max_gpus=C.MAX_GPUS, max_cache_paths=C.MAX_MODEL_CACHE_PATHS,
    )



def files(root: Path) -> Iterator[GeneratedFile]:
    yield GeneratedFile("monitoring/README.md", SOURCE, lambda: with_header(SOURCE, readme(), "markdown"))
