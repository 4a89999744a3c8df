"""Generated files of the Helm chart (helm/ornith/), beyond the per-profile values files.

- `values.schema.json`: made from the annotated helm/ornith/values.yaml (see helm_values), with the
  profile names and engine kinds as enums, so a new profile cannot be missing from them.
- `files/prometheus-rules.yaml` and `files/grafana-dashboards.yaml`: the rule groups and dashboards
  compose provisions from monitoring/, built here again by the same builders, because Helm reads only
  files inside the chart (`.Files.Get`).
- `files/alertmanager-config.yaml`: the route, receivers and inhibitions of compose's alertmanager.yml,
  from the same builder (alertmanager.alertmanager_config_spec), as the spec of an AlertmanagerConfig;
  templates/alertmanagerconfig.yaml fills in the chart's webhook URL.
- `files/engine_guard.py`: src/ornith_stack/engine_guard.py with the header, which the engine pod mounts from a
  ConfigMap (the upstream engine image does not carry ornith-stack).
- `README.md`: templates/helm-readme.md.j2 with the values table from the same annotated values.yaml.
- `ci/<scenario>.yaml`: complete values files for test scenarios that change a profile (e.g. the
  122B split over two 4-GPU nodes at tp 8), rendered through the same template as values-<profile>.yaml.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ornith_stack.engines import ADAPTERS
from ornith_stack.errors import UserError
from ornith_stack.generate import alertmanager, alerts, dashboards, helm_values, prometheus
from ornith_stack.generate.core import GeneratedFile, environment, with_header
from ornith_stack.generate.profile_files import render_profile
from ornith_stack.merge import deep_merge
from ornith_stack.profiles import images, load_profile, shipped_profile_names
from ornith_stack.reading import parse_yaml, read_text

CHART = "helm/ornith"
VALUES = f"{CHART}/values.yaml"
SCHEMA_SOURCE = f"{VALUES} (its helm-docs comments and helm-schema @schema blocks)"
README_SOURCE = f"src/ornith_stack/templates/helm-readme.md.j2 and {VALUES}"
# The values-table section (`# @section -- Profile`) of the keys `ornith-stack render` writes into
# values-<profile>.yaml.
PROFILE_SECTION = "Profile"
RULES_SOURCE = "src/ornith_stack/generate/prometheus.py (the rule groups of monitoring/prometheus/rules/)"
LIMITS_SOURCE = "src/ornith_stack/generate/prometheus.py (the scrape limits of monitoring/prometheus/prometheus.yml)"
DASHBOARDS_SOURCE = f"{dashboards.SOURCE} (the dashboards of {dashboards.DASHBOARD_DIR}/)"
ALERTMANAGER_SOURCE = f"src/ornith_stack/generate/alertmanager.py (what {alertmanager.CONFIG} routes and inhibits)"
# The engine pod mounts this module from a ConfigMap: a copy in the chart, not a link, since a link does not survive
# every checkout, `helm package` or a copy of the chart alone.
ENGINE_GUARD_SOURCE = "src/ornith_stack/engine_guard.py"
ENGINE_GUARD = Path(__file__).resolve().parents[1] / "engine_guard.py"  # the installed package's, whatever the root


@dataclass(frozen=True)
class Scenario:
    """A values file for a deployment shape that differs from the profile as shipped."""

    name: str
    profile: str
    description: str
    overrides: dict[str, str] = field(default_factory=dict)  # profile --set overrides
    values: dict[str, Any] = field(default_factory=dict)  # chart values added after the profile's


_MONITORING_RELEASE = {"labels": {"release": "kube-prometheus-stack"}}  # what kube-prometheus-stack selects by
# Where every scenario pulls the images this project builds (projectImages.registry): a stand-in name
# (RFC 2606's example.com) for the registry an operator pushes them to.
SCENARIO_REGISTRY = "registry.example.com"
# The Secret every scenario names for its keys (the users' ORNITH_API_KEY and the operator's ORNITH_OPERATOR_KEY):
# the chart refuses an engine or gateway without one.
SCENARIO_KEY_SECRET = "ornith-api-key"

# Deployment shapes the tests render and operators can start from: each becomes a complete values
# file helm/ornith/ci/<name>.yaml (the profile's values with these on top), usable alone with -f.
SCENARIOS = (
    Scenario(
        name="spark-model-repo",
        profile="spark",
        description="The Spark profile, whose seed does not name the model repository: the operator supplies "
        "it (a stand-in name here) and a token Secret.",
        values={"model": {"repo": "example-org/Ornith-1.0-35B"}, "hfToken": {"secretName": "hf-token"}},
    ),
    Scenario(
        name="gb300x2-two-nodes-lws",
        profile="gb300x2",
        description="Tensor parallelism across nodes with the profile's own flags: tp 2 over two single-GPU "
        "nodes as a LeaderWorkerSet, two such groups behind one Service; kube-prometheus-stack selects the "
        "monitoring objects and its Alertmanager sends the alerts to a webhook (an example URL here).",
        values={
            "engine": {"nodes": 2, "gpusPerNode": 1, "replicas": 2,
                       "resources": {"requests": {"cpu": "16", "memory": "256Gi"}, "limits": {"memory": "480Gi"}}},
            "modelCache": {"accessModes": ["ReadWriteMany"], "storageClassName": "shared-nfs", "size": "600Gi"},
            "hfToken": {"secretName": "hf-token"},
            "monitoring": {"serviceMonitor": _MONITORING_RELEASE, "prometheusRule": _MONITORING_RELEASE,
                           "alertmanagerConfig": {"enabled": True, "webhookUrl": "https://alerts.example.com/ornith",
                                                  "warningWebhookUrl": "https://tickets.example.com/ornith",
                                                  "heartbeatUrl": "https://heartbeat.example.com/ornith",
                                                  **_MONITORING_RELEASE}},
        },
    ),
    Scenario(
        name="gb300x2-two-4gpu-nodes",
        profile="gb300x2",
        description="The 122B split over two 4-GPU GB300 nodes: tp 8 as one LeaderWorkerSet group of 2 pods.",
        overrides={"serve.args.tp-size": "8"},
        values={
            "engine": {"nodes": 2, "gpusPerNode": 4},
            "modelCache": {"accessModes": ["ReadWriteMany"], "storageClassName": "shared-nfs"},
        },
    ),
    Scenario(
        name="gpu96-data-parallel",
        profile="gpu96",
        description="More throughput from three single-GPU copies of the 35B (data parallel) behind one "
        "Service, spread over nodes, each with its own exporter sidecar.",
        values={
            "engine": {
                "replicas": 3,
                "extraArgs": ["--log-level", "info"],
                "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                    "weight": 100,
                    "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
                        "matchLabels": {"app.kubernetes.io/component": "engine"}}}}]}},
            },
            "modelCache": {"accessModes": ["ReadWriteMany"]},
            "hfToken": {"secretName": "hf-token"},
        },
    ),
    Scenario(
        name="gpu96-gateway",
        profile="gpu96",
        description="Two single-GPU copies of the 35B (the profile with serve.replicas 2) behind SGLang's Model "
        "Gateway, which discovers the engine pods by label and routes cache-aware.",
        overrides={"serve.replicas": "2", "hardware.gpu.count": "2"},
        values={"modelCache": {"accessModes": ["ReadWriteMany"]}},
    ),
    Scenario(
        name="a100x2-existing-claim",
        profile="a100x2",
        description="A cluster without the Prometheus Operator, weights on an existing claim, the engine image "
        "from a private registry at a digest (a placeholder digest here).",
        values={
            "imagePullSecrets": ["registry-credentials"],
            "engine": {"image": {"digest": "sha256:" + "0" * 64}},
            "modelCache": {"existingClaim": "ornith-weights"},
            "monitoring": {"serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False},
                           "grafanaDashboards": {"enabled": False}},
        },
    ),
)


def files(root: Path) -> Iterator[GeneratedFile]:
    yield GeneratedFile(f"{CHART}/values.schema.json", SCHEMA_SOURCE, lambda: _schema(root))
    yield GeneratedFile(f"{CHART}/README.md", README_SOURCE, lambda: _readme(root))
    yield GeneratedFile(f"{CHART}/files/prometheus-rules.yaml", RULES_SOURCE, _rules)
    yield GeneratedFile(f"{CHART}/files/scrape-limits.yaml", LIMITS_SOURCE,
                        lambda: with_header(LIMITS_SOURCE, prometheus.dump(prometheus.service_monitor_limits()), "yaml"))
    yield GeneratedFile(f"{CHART}/files/grafana-dashboards.yaml", DASHBOARDS_SOURCE, _dashboards)
    yield GeneratedFile(f"{CHART}/files/alertmanager-config.yaml", ALERTMANAGER_SOURCE, _alertmanager_config)
    yield GeneratedFile(f"{CHART}/files/engine_guard.py", ENGINE_GUARD_SOURCE,
                        lambda: with_header(ENGINE_GUARD_SOURCE, read_text(ENGINE_GUARD), "yaml"))
    for scenario in SCENARIOS:
        yield GeneratedFile(f"{CHART}/ci/{scenario.name}.yaml", _scenario_source(scenario),
                            _scenario_builder(scenario))


def _schema(root: Path) -> str:
    schema = helm_values.schema(helm_values.parse(read_text(root / VALUES), VALUES), "ornith chart values")
    _at(schema, "properties", "profile")["enum"] = shipped_profile_names()
    _at(schema, "properties", "engine", "properties", "kind")["enum"] = sorted(ADAPTERS)
    return with_header(SCHEMA_SOURCE, schema, "json")


def _at(tree: Any, *keys: str) -> Any:
    """tree[k1][k2]..., or an error naming the key of the chart's values.yaml that is missing."""
    for depth, key in enumerate(keys):
        if not isinstance(tree, dict) or key not in tree:
            path = ".".join(k for k in keys[: depth + 1] if k != "properties")
            raise UserError(f"{VALUES}: no {path!r} (the chart's hand-written values must keep the key)")
        tree = tree[key]
    return tree


def _rules() -> str:
    """Every rule group Prometheus loads in compose, as one PrometheusRule body."""
    groups = prometheus.recording_rules()["groups"] + alerts.alert_rules(helm=True)["groups"]
    return with_header(RULES_SOURCE, yaml.safe_dump({"groups": groups}, sort_keys=False, width=10_000,
                                                    allow_unicode=True), "yaml")


def _dashboards() -> str:
    files = {f"{uid}.json": dashboards.text(uid) for uid in dashboards.DASHBOARDS}
    body = yaml.safe_dump({"dashboards": files}, sort_keys=True, width=10_000, allow_unicode=True)
    return with_header(DASHBOARDS_SOURCE, body, "yaml")


def _alertmanager_config() -> str:
    """An AlertmanagerConfig's spec, the webhook URL a placeholder the chart's template replaces."""
    return with_header(ALERTMANAGER_SOURCE, prometheus.dump(alertmanager.alertmanager_config_spec()), "yaml")


def _scenario_source(scenario: Scenario) -> str:
    return (f"src/ornith_stack/profiles/{scenario.profile}.yaml, src/ornith_stack/templates/helm-values.yaml.j2 "
            f"and the scenario {scenario.name!r} in src/ornith_stack/generate/helm_chart.py")


def _scenario_builder(scenario: Scenario) -> Callable[[], str]:
    def build() -> str:
        profile = load_profile(scenario.profile, scenario.overrides, shipped=True)
        values = deep_merge(yaml.safe_load(render_profile(profile, "helm-values.yaml.j2", "helm")),
                            {"projectImages": {"registry": SCENARIO_REGISTRY},
                             "apiKey": {"secretName": SCENARIO_KEY_SECRET}})
        values = deep_merge(values, scenario.values)
        sets = "".join(f" --set {k}={v}" for k, v in scenario.overrides.items())
        return with_header(_scenario_source(scenario), f"# Scenario: {scenario.description}\n"
                + f"# engine.args equal `ornith-stack launch-args {profile.name}{sets} --json` after the program.\n"
                + f"# The images this project builds come from {SCENARIO_REGISTRY}, a stand-in for your registry;\n"
                + f"# the keys from the Secret {SCENARIO_KEY_SECRET} (ORNITH_API_KEY, ORNITH_OPERATOR_KEY), made beforehand.\n"
                + f"# helm install ornith helm/ornith -f helm/ornith/ci/{scenario.name}.yaml\n"
                + yaml.safe_dump(values, sort_keys=False, width=10_000), "yaml")

    return build


def _seconds(startup: Any, key: str) -> int:
    value = _at(startup, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UserError(f"{VALUES}: engine.probes.startup.{key} is {value!r}, expected a whole number above 0")
    return value


def _readme(root: Path) -> str:
    text = read_text(root / VALUES)
    startup = _at(parse_yaml(text, VALUES), "engine", "probes", "startup")
    body = environment().get_template("helm-readme.md.j2").render(
        values_table=helm_values.table(helm_values.parse(text, VALUES).rows), profiles=shipped_profile_names(),
        scenarios=SCENARIOS, profile_section=PROFILE_SECTION, scenario_registry=SCENARIO_REGISTRY,
        exporter_image=images()["services"]["exporter"],
        startup_minutes=_seconds(startup, "periodSeconds") * _seconds(startup, "failureThreshold") // 60)
    return with_header(README_SOURCE, body, "markdown")
