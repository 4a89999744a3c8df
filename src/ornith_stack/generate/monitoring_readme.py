"""monitoring/README.md: the exporter, the metrics catalogue and the alerts, from a Jinja2 template."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ornith_stack.exporter import catalogue as C
from ornith_stack.exporter.httpd import Limits
from ornith_stack.generate import alerts
from ornith_stack.generate.core import GeneratedFile, environment, with_header

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
    )


def files(root: Path) -> Iterator[GeneratedFile]:
    yield GeneratedFile("monitoring/README.md", SOURCE, lambda: with_header(SOURCE, readme(), "markdown"))
