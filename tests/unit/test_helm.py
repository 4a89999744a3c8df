"""The Helm chart (helm/ornith): rendered for every profile and scenario with the pinned Helm SDK
(helm-python-sdk 0.2.2, Helm 4 as a library, offline), linted strictly, every object validated against
the Kubernetes schemas (kubernetes-validate) or, for custom resources, the schemas in
helm/ornith/crds-schemas/, and checked for what a reviewer would look at."""

from __future__ import annotations

import ast
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

from ornith_stack import deployment
from ornith_stack.engines import adapter_for
from ornith_stack.generate import alertmanager, alerts
from ornith_stack.merge import deep_merge
from ornith_stack.profiles import images, load_profile, profile_names

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "ornith"
KUBE_VERSION = "1.33"
RELEASE, NAMESPACE = "ornith", "llm"
# Custom resources are checked against the schemas made from their upstream CRDs.
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-monitoring-v1.json",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset-leaderworkerset-v1.json",
    ("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig"): "alertmanagerconfig-monitoring-v1alpha1.json",
}
# Every profile, and every scenario in ci/ (complete generated values files).
PROFILE_CASES = [f"values-{name}.yaml" for name in profile_names()]
SCENARIO_CASES = sorted(f"ci/{p.name}" for p in (CHART / "ci").glob("*.yaml"))
# spark's seed names no model repository: alone it must fail (tested below); rendered with its scenario.
RENDERABLE = [c for c in PROFILE_CASES if c != "values-spark.yaml"] + SCENARIO_CASES
# Where an operator pushed the images this project builds: installed with --set projectImages.registry=...
# (the ci/ scenarios set it themselves).
REGISTRY = "registry.example.com"


# ----------------------------------------------------------------------------------------------- helpers
class KubeYAML(yaml.SafeLoader):
    """YAML as Kubernetes reads it: a bare `=` (Helm's toYaml writes an AlertmanagerConfig's
    `matchType: =` so) is the string "=", not YAML 1.1's "value" type that PyYAML cannot construct."""


KubeYAML.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_yaml_str)


def read_yaml(rel: str) -> dict[str, Any]:
    return yaml.safe_load((CHART / rel).read_text()) or {}


def case_values(case: str) -> dict[str, Any]:
    """The values a case installs with: one generated values file (on values.yaml's defaults), and for a
    profile's file the registry of the project's images, as `--set projectImages.registry=` gives it."""
    values = read_yaml(case)
    # A profile's file alone names no key Secret, which the chart refuses unless told to serve without one.
    return values if case.startswith("ci/") else deep_merge(values, {"projectImages": {"registry": REGISTRY},
                                                                     "apiKey": {"allowUnauthenticated": True}})


@cache
def chart() -> helm.Chart:
    return helm.Chart.load(CHART)


# The APIs a cluster with the Prometheus Operator and the LeaderWorkerSet controller serves, as
# `helm install` sees them (group/version and group/version/kind); `helm template --api-versions X` adds X.
FULL_CLUSTER = ("monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor",
                "monitoring.coreos.com/v1/PrometheusRule", "monitoring.coreos.com/v1alpha1",
                "monitoring.coreos.com/v1alpha1/AlertmanagerConfig", "leaderworkerset.x-k8s.io/v1",
                "leaderworkerset.x-k8s.io/v1/LeaderWorkerSet")
# A cluster without the Prometheus Operator's CRDs: only the built-in APIs (and the LeaderWorkerSet).
NO_MONITORING = ("leaderworkerset.x-k8s.io/v1", "leaderworkerset.x-k8s.io/v1/LeaderWorkerSet")


def render_manifests(values: dict[str, Any], api_versions: tuple[str, ...] = FULL_CLUSTER,
                     source: helm.Chart | None = None) -> dict[str, str]:
    """`helm template --api-versions ...` through the SDK's native render (its Python wrapper does not
    expose the option Helm's render takes as `api_versions`)."""
    from helm_python import _native

    opts = {"name": RELEASE, "namespace": NAMESPACE, "api_versions": list(api_versions)}
    raw = _native.call_string("helm_render", (source or chart())._raw(), json.dumps(values), json.dumps(opts))
    return json.loads(raw)


def render(values: dict[str, Any], api_versions: tuple[str, ...] = FULL_CLUSTER) -> list[dict[str, Any]]:
    objects = []
    for name, text in sorted(render_manifests(values, api_versions).items()):
        if name.endswith(".txt"):
            continue
        objects += [doc for doc in yaml.load_all(text, KubeYAML) if doc]
    return objects


@cache
def rendered(case: str) -> tuple[dict[str, Any], ...]:
    return tuple(render(case_values(case)))


def find(objects: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def engine_pod_specs(objects: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    """role -> pod spec of the engine: "single" (Deployment) or "leader"/"worker" (LeaderWorkerSet)."""
    specs = {}
    for d in find(objects, "Deployment"):
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine":
            specs["single"] = d["spec"]["template"]["spec"]
    for lws in find(objects, "LeaderWorkerSet"):
        template = lws["spec"]["leaderWorkerTemplate"]
        specs["leader"] = template["leaderTemplate"]["spec"]
        specs["worker"] = template["workerTemplate"]["spec"]
    return specs


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in spec["containers"] if c["name"] == name)


def expand(words: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of command and args from the container's environment."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), w) for w in words]


def literal_env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}


def cli_launch_args(profile: str, *sets: str) -> list[str]:
    """`ornith-stack launch-args PROFILE --json` exactly as a user runs it."""
    argv = [sys.executable, "-m", "ornith_stack", "launch-args", profile, "--json"]
    for s in sets:
        argv += ["--set", s]
    done = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout)


@cache
def crd_registry() -> Registry:
    """kubernetes-validate's strict core definitions, which the CRD schemas refer to."""
    defs = kubernetes_validate.utils.schema_contents(
        f"kubernetes-json-schema/v{KUBE_VERSION}.0-local-strict/_definitions.json", KUBE_VERSION)
    return Resource.from_contents(defs) @ Registry()


def validate_object(obj: dict[str, Any]) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key in CRD_SCHEMAS:
        schema = json.loads((CHART / "crds-schemas" / CRD_SCHEMAS[key]).read_text())
        jsonschema.Draft202012Validator(schema, registry=crd_registry()).validate(obj)
    else:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def render_error(values: dict[str, Any]) -> str:
    with pytest.raises(helm.HelmError) as caught:
        render(values)
    return str(caught.value)


# ------------------------------------------------------------------------------- every profile/scenario
def test_cases_cover_the_five_profiles_and_a_two_node_leaderworkerset() -> None:
    assert len(PROFILE_CASES) == 5
    two_node = [c for c in RENDERABLE if int(case_values(c)["engine"].get("nodes", 1)) == 2]
    assert two_node and all(find(rendered(c), "LeaderWorkerSet") for c in two_node)


@pytest.mark.parametrize("case", RENDERABLE)
def test_helm_lint_strict_passes(case: str) -> None:
    report = helm.lint(CHART, case_values(case), strict=True, namespace=NAMESPACE, kube_version="v1.33.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("case", RENDERABLE)
def test_every_object_is_valid_kubernetes(case: str) -> None:
    objects = rendered(case)
    assert objects
    for obj in objects:
        try:
            validate_object(obj)
        except jsonschema.ValidationError as exc:
            where = ".".join(str(p) for p in exc.absolute_path)
            pytest.fail(f"{case}: {obj['kind']}/{obj['metadata']['name']} at {where}: {exc.message}")


@pytest.mark.parametrize("case", RENDERABLE)
def test_gpus_per_pod_follow_tensor_parallelism(case: str) -> None:
    values = case_values(case)
    engine = values["engine"]
    tp = int(re.search(r"--(?:tp-size|tp|tensor-parallel-size) (\d+)", " ".join(engine["args"]))[1]) if any(
        a in ("--tp-size", "--tp", "--tensor-parallel-size") for a in engine["args"]) else 1
    nodes = int(engine.get("nodes", 1))
    for role, spec in engine_pod_specs(rendered(case)).items():
        limits = container(spec, "engine")["resources"].get("limits", {})
        gpus = int(limits.get("nvidia.com/gpu", 0))
        if engine["gpusPerNode"] == 0:
            assert gpus == 0, f"{case}: a CPU profile asks for GPUs"
        else:
            # One pod per node: the group of `nodes` pods holds exactly the tensor-parallel ranks.
            assert gpus * nodes == tp, f"{case} {role}: {gpus} GPUs x {nodes} nodes != tp {tp}"


@pytest.mark.parametrize("case", RENDERABLE)
def test_images_are_pinned(case: str) -> None:
    for obj in rendered(case):
        for spec in _pod_specs(obj):
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                name, _, tag = c["image"].split("@")[0].rpartition(":")
                assert name and tag and "/" not in tag, f"{case}: {c['image']} has no tag"
                assert tag != "latest", f"{case}: {c['image']} uses latest"


@pytest.mark.parametrize("case", RENDERABLE)
def test_engine_probes_allow_a_cold_load(case: str) -> None:
    values = case_values(case)
    for role, spec in engine_pod_specs(rendered(case)).items():
        engine = container(spec, "engine")
        if role == "worker":  # non-leader nodes serve no HTTP
            assert "startupProbe" not in engine
            continue
        startup, ready, live = engine["startupProbe"], engine["readinessProbe"], engine["livenessProbe"]
        # With a key /v1/models asks for it: the startup probe then asks the unauthenticated health route.
        probe = values["engine"]["healthPath"] if values["apiKey"].get("secretName") else values["engine"]["modelsPath"]
        assert startup["httpGet"]["path"] == probe
        # Readiness: the engine's health and a first generation (tests/unit/test_helm_rollout.py runs it).
        assert ready["exec"]["command"][3] == "ready"
        assert live["httpGet"]["path"] == values["engine"]["healthPath"]
        # The issue asks for at least 15 minutes before a slow first load counts as a failure.
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60


@pytest.mark.parametrize("case", RENDERABLE)
def test_no_secret_values_in_the_output(case: str) -> None:
    objects = rendered(case)
    assert not find(objects, "Secret"), "the chart must never create a Secret"
    for obj in objects:
        for spec in _pod_specs(obj):
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                for env in c.get("env", []):
                    if re.search(r"TOKEN|PASSWORD|SECRET|KEY$", env["name"]):
                        assert "value" not in env, f"{case}: {env['name']} has a literal value"
                        assert set(env["valueFrom"]) == {"secretKeyRef"}
    text = yaml.safe_dump_all(objects)
    assert not re.search(r"\bhf_[A-Za-z0-9]{20,}", text), "something like a Hugging Face token"


@pytest.mark.parametrize("case", RENDERABLE)
def test_engine_args_equal_launch_args(case: str) -> None:
    values = case_values(case)
    sets = re.findall(r"--set (\S+)", (CHART / case).read_text().split("\nprofile:")[0])
    specs = engine_pod_specs(rendered(case))
    leader = container(specs.get("single") or specs["leader"], "engine")
    env = literal_env(leader)
    if "$(ORNITH_MODEL_REPO)" in leader["args"]:
        sets.append(f"model.repo={env['ORNITH_MODEL_REPO']}")
    expected = cli_launch_args(values["profile"], *sets)
    nodes = int(values["engine"].get("nodes", 1))
    extra = values["engine"].get("extraArgs", [])
    multi = values["engine"]["multiNode"]["args"] if nodes > 1 else []
    argv = expand(leader["command"] + leader["args"], env)
    # With a key, an engine that reads it from a file gets that file last (the chart's init container writes it).
    key_file = ([values["engine"]["keyConfig"][0], "/run/ornith-key/api-key.yaml"]
                if values["apiKey"].get("secretName") and values["engine"].get("keyConfig") else [])
    guard = values["engine"].get("keyArgs", []) if values["apiKey"].get("secretName") else []
    assert argv == expected + expand(multi, env) + extra + key_file + guard
    if nodes > 1:
        # What the LeaderWorkerSet controller puts in every pod of group 0.
        lws = {"LWS_GROUP_SIZE": str(nodes), "LWS_LEADER_ADDRESS": "ornith-engine-0.ornith-engine.llm",
               **env}
        worker = container(specs["worker"], "engine")
        worker_env = {**lws, "LWS_WORKER_INDEX": "1", **literal_env(worker)}
        worker_argv = expand(worker["command"] + worker["args"], worker_env)
        leader_of_worker = expected + expand(multi, worker_env) + extra
        assert worker_argv == adapter_for(values["engine"]["kind"]).worker_launch_args(leader_of_worker)


@pytest.mark.parametrize("case", RENDERABLE)
def test_service_spreads_requests_over_engine_copies(case: str) -> None:
    objects = rendered(case)
    values = case_values(case)
    service = next(s for s in find(objects, "Service") if s["metadata"]["name"] == RELEASE)
    assert service["spec"]["ports"][0]["port"] == values["engine"]["port"]
    assert service["spec"]["selector"]["ornith.ai/role"] == "leader"
    replicas = int(values["engine"].get("replicas", 1))
    workload = (find(objects, "LeaderWorkerSet") or [d for d in find(objects, "Deployment")
                                                      if d["metadata"]["name"] == "ornith-engine"])[0]
    assert workload["spec"]["replicas"] == replicas
    # The selector matches the serving pods (the Deployment's, or each group's leader).
    for role in engine_pod_specs(objects):
        labels = (workload["spec"].get("template") or workload["spec"]["leaderWorkerTemplate"][
            "workerTemplate" if role == "worker" else "leaderTemplate"])["metadata"]["labels"]
        matches = all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
        assert matches == (role != "worker"), role


@pytest.mark.parametrize("case", RENDERABLE)
def test_exporter_measures_every_engine_copy(case: str) -> None:
    objects = rendered(case)
    values = case_values(case)
    if not values.get("exporter", {}).get("enabled", True):
        return
    replicas = int(values["engine"].get("replicas", 1))
    exporters = [d for d in find(objects, "Deployment") if d["metadata"]["name"] == "ornith-exporter"]
    # A hung engine still answers /metrics: every exporter sends the canary by default, checking the known
    # answer only where the profile's model can know it.
    check = load_profile(values["profile"]).canary_check
    if exporters:
        args = container(exporters[0]["spec"]["template"]["spec"], "exporter")["args"]
        assert args.count("--target") == replicas
        assert args[args.index("--profile") + 1] == values["profile"]
        assert args[args.index("--canary") + 1:args.index("--canary") + 3] == ["--canary-check", check]
    else:  # sidecar: one exporter in each serving pod, scraping it on localhost
        spec = engine_pod_specs(objects)["single"]
        exporter = container(spec, "exporter")
        canary = exporter["args"].index("--canary")
        assert exporter["args"][canary + 1:canary + 3] == ["--canary-check", check]
        assert exporter["args"][:2] == ["--target", f"http://127.0.0.1:{values['engine']['port']}"]
        # Replicas told apart: each labels its engine with its pod's name, not the shared loopback URL.
        assert exporter["args"][exporter["args"].index("--target-name") + 1] == "$(ORNITH_POD_NAME)"
        assert {"name": "ORNITH_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in exporter["env"]
        for monitor in find(objects, "ServiceMonitor"):  # the engine's own series carry the same target
            for endpoint in monitor["spec"]["endpoints"]:
                relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
                # Both jobs, the exporter's and the engine's own, say which replica (pod) a series is from.
                if relabel["job"]["replacement"] in ("engine", "ornith-exporter"):
                    assert relabel["replica"]["sourceLabels"] == ["__meta_kubernetes_pod_name"]
                if relabel["job"]["replacement"] == "engine":
                    assert relabel["target"]["sourceLabels"] == ["__meta_kubernetes_pod_name"]
                    assert relabel["profile"]["replacement"] == values["profile"]


@pytest.mark.parametrize("case", RENDERABLE)
def test_model_cache_is_filled_once_at_the_pinned_revision(case: str) -> None:
    objects = rendered(case)
    values = case_values(case)
    jobs = find(objects, "Job")
    if values.get("modelCache", {}).get("enabled", True) is False:
        assert not jobs
        return
    (job,) = jobs
    download = container(job["spec"]["template"]["spec"], "download")
    env = literal_env(download)
    assert "hf download \"$MODEL_REPO\" --revision \"$MODEL_REVISION\"" in download["command"][-1]
    assert (env["MODEL_REPO"], env["MODEL_REVISION"]) == (values["model"]["repo"], values["model"]["revision"])
    assert env["DRAFT_REPO"] == values.get("draft", {}).get("repo", "")
    token = [e for e in download["env"] if e["name"] == "HF_TOKEN"]
    secret = values.get("hfToken", {}).get("secretName")
    assert bool(token) == bool(secret)
    if token:
        assert token[0]["valueFrom"]["secretKeyRef"]["name"] == secret
    # Engine pods wait for the Job's marker and then load offline.
    for spec in engine_pod_specs(objects).values():
        (wait,) = [c for c in spec["initContainers"] if c["name"] == "wait-for-model"]
        assert literal_env(wait)["MARKER"] == env["MARKER"]
        assert literal_env(container(spec, "engine"))["HF_HUB_OFFLINE"] == "1"
    # A ReadWriteOnce claim attaches to one node: a lone engine pod and the Job must share it.
    pods = int(values["engine"].get("nodes", 1)) * int(values["engine"].get("replicas", 1))
    affinity = job["spec"]["template"]["spec"].get("affinity", {}).get("podAffinity")
    assert bool(affinity) == (pods == 1)
    claims = find(objects, "PersistentVolumeClaim")
    claim = values.get("modelCache", {}).get("existingClaim") or claims[0]["metadata"]["name"]
    assert job["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim


@pytest.mark.parametrize("case", RENDERABLE)
def test_engine_runs_unprivileged_with_shared_memory(case: str) -> None:
    for spec in engine_pod_specs(rendered(case)).values():
        assert spec["securityContext"]["runAsNonRoot"] is True
        engine = container(spec, "engine")
        assert engine["securityContext"]["allowPrivilegeEscalation"] is False
        shm = next(v for v in spec["volumes"] if v["name"] == "shm")
        assert shm["emptyDir"]["medium"] == "Memory"
        assert {"name": "shm", "mountPath": "/dev/shm"} in engine["volumeMounts"]


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    if obj["kind"] == "LeaderWorkerSet":
        t = spec["leaderWorkerTemplate"]
        return [t["leaderTemplate"]["spec"], t["workerTemplate"]["spec"]]
    template = spec.get("template", {})
    return [template["spec"]] if "spec" in template else []


# ------------------------------------------------------------------------------------- monitoring: one source
def test_prometheus_rule_carries_the_rules_of_monitoring() -> None:
    groups = []
    for path in sorted((ROOT / "monitoring" / "prometheus").rglob("*.y*ml")):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("groups"), list):
            groups += data["groups"]
    assert groups, "monitoring/prometheus/ has no rule files: the chart would ship no alerts"
    # The chart's additions: the release's namespace on the alerts whose series carry none, and the
    # exporter's discovery check (the gateway's only with the gateway, which cpu-demo runs without).
    namespaceless = {a.name for a in alerts.ALERTS if a.namespaceless}
    for group in groups:
        for r in group["rules"]:
            if r.get("alert") in namespaceless:
                r["labels"]["namespace"] = NAMESPACE
    discovery = json.loads(json.dumps(alerts.alert_rules(helm=True)["groups"]).replace(
        alerts.NAMESPACE_PLACEHOLDER, NAMESPACE))
    groups += [g for g in discovery if g["name"] == "ornith-exporter-discovery"]
    (rule,) = find(rendered("values-cpu-demo.yaml"), "PrometheusRule")
    by_name = {g["name"]: g for g in rule["spec"]["groups"]}
    assert len(by_name) == len(rule["spec"]["groups"]) and by_name == {g["name"]: g for g in groups}


def test_grafana_dashboards_are_the_files_of_monitoring() -> None:
    files = {p.name: p.read_text() for p in (ROOT / "monitoring" / "grafana" / "dashboards").glob("*.json")}
    assert files, "monitoring/grafana/dashboards/ has no dashboards: the chart would ship none"
    maps = [m for m in find(rendered("values-cpu-demo.yaml"), "ConfigMap")
            if m["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert {k: v for m in maps for k, v in m["data"].items()} == files


AMC_CASE = "ci/gb300x2-two-nodes-lws.yaml"  # the scenario that routes alerts to a webhook


def compose_matcher(matcher: str) -> dict[str, str]:
    """`alertname=~"A|B"` of compose's alertmanager.yml in the CRD's shape."""
    name, op, value = re.fullmatch(r'(\w+)(=~|!~|!=|=)"(.*)"', matcher).groups()  # type: ignore[union-attr]
    return {"name": name, "value": value, "matchType": op}


def test_alertmanager_config_routes_and_inhibits_like_compose() -> None:
    """The AlertmanagerConfig carries compose's route, receivers and inhibitions, the chart's webhook URL
    in place of the placeholder, and passes the CRD's schema (its child routes too, which the CRD leaves
    untyped)."""
    values = case_values(AMC_CASE)
    amc_values = values["monitoring"]["alertmanagerConfig"]
    assert amc_values["enabled"] and amc_values["webhookUrl"]
    (amc,) = find(rendered(AMC_CASE), "AlertmanagerConfig")
    validate_object(amc)
    bad = copy.deepcopy(amc)
    bad["spec"]["receivers"][0]["webhookConfigs"][0]["sendResolve"] = True
    with pytest.raises(jsonschema.ValidationError, match="sendResolve"):
        validate_object(bad)
    assert amc["metadata"]["labels"]["release"] == amc_values["labels"]["release"]
    schema = json.loads((CHART / "crds-schemas" / CRD_SCHEMAS[("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig")])
                        .read_text())["properties"]["spec"]["properties"]["route"]
    for child in amc["spec"]["route"]["routes"]:
        jsonschema.Draft202012Validator(schema).validate(child)

    compose = yaml.safe_load((ROOT / "monitoring" / "alertmanager" / "alertmanager.yml").read_text())
    route, spec = compose["route"], amc["spec"]
    assert spec["route"] == {
        "receiver": route["receiver"], "groupBy": route["group_by"], "groupWait": route["group_wait"],
        "groupInterval": route["group_interval"], "repeatInterval": route["repeat_interval"],
        "routes": [{"receiver": r["receiver"], "matchers": [compose_matcher(m) for m in r["matchers"]],
                    **({"groupBy": r["group_by"]} if "group_by" in r else {}),
                    **({"continue": True} if r.get("continue") else {}),
                    **({"groupInterval": r["group_interval"]} if "group_interval" in r else {}),
                    **({"repeatInterval": r["repeat_interval"]} if "repeat_interval" in r else {})}
                   for r in route["routes"]]}
    assert spec["inhibitRules"] == [
        {"sourceMatch": [compose_matcher(m) for m in rule["source_matchers"]],
         "targetMatch": [compose_matcher(m) for m in rule["target_matchers"]], "equal": rule["equal"]}
        for rule in compose["inhibit_rules"]]
    # Pages, warnings and the heartbeat each to the URL of its own value.
    urls = {alertmanager.RECEIVER: amc_values["webhookUrl"], alertmanager.WARNING: amc_values["warningWebhookUrl"],
            alertmanager.HEARTBEAT: amc_values["heartbeatUrl"]}
    assert len(set(urls.values())) == 3
    webhook = [{"url": urls[r["name"]], "sendResolved": c["send_resolved"]}
               for r in compose["receivers"] for c in r.get("webhook_configs", [])]
    assert [c for r in spec["receivers"] for c in r.get("webhookConfigs", [])] == webhook
    assert [r["name"] for r in spec["receivers"]] == [r["name"] for r in compose["receivers"]]
    # Without a heartbeat or warning URL that receiver has no webhook (never the pager's).
    plain = deep_merge(values, {"monitoring": {"alertmanagerConfig": {"heartbeatUrl": "", "warningWebhookUrl": ""}}})
    (amc,) = find(tuple(render(plain)), "AlertmanagerConfig")
    hooks = {r["name"]: [c["url"] for c in r.get("webhookConfigs", [])] for r in amc["spec"]["receivers"]}
    assert hooks[alertmanager.HEARTBEAT] == []
    assert hooks[alertmanager.WARNING] == [] and hooks[alertmanager.RECEIVER] == [amc_values["webhookUrl"]]
    # The chart's defaults are compose's; the values override them.
    defaults = read_yaml("values.yaml")["monitoring"]["alertmanagerConfig"]
    assert (defaults["repeatInterval"], defaults["sendResolved"]) == (
        route["repeat_interval"], compose["receivers"][0]["webhook_configs"][0]["send_resolved"])
    changed = deep_merge(values, {"monitoring": {"alertmanagerConfig": {"repeatInterval": "12h", "sendResolved": False}}})
    (amc,) = find(tuple(render(changed)), "AlertmanagerConfig")
    assert amc["spec"]["route"]["repeatInterval"] == "12h"
    assert amc["spec"]["receivers"][0]["webhookConfigs"][0]["sendResolved"] is False


@pytest.mark.parametrize("apis", [FULL_CLUSTER, NO_MONITORING], ids=["cluster", "no-monitoring"])
def test_alertmanager_config_without_a_webhook_url_fails_with_the_fix(apis: tuple[str, ...]) -> None:
    values = deep_merge(case_values("values-gpu96.yaml"), {"monitoring": {"alertmanagerConfig": {"enabled": True}}})
    with pytest.raises(helm.HelmError) as caught:
        render(values, apis)
    message = str(caught.value)
    assert "monitoring.alertmanagerConfig.webhookUrl is empty" in message
    assert "--set monitoring.alertmanagerConfig.webhookUrl=" in message
    assert "monitoring.alertmanagerConfig.enabled=false" in message


def test_alertmanager_config_is_off_by_default_and_needs_its_api() -> None:
    assert read_yaml("values.yaml")["monitoring"]["alertmanagerConfig"]["enabled"] is False
    assert not find(rendered("values-gpu96.yaml"), "AlertmanagerConfig")
    # A cluster (or `helm template --api-versions`) with monitoring.coreos.com/v1 but not v1alpha1.
    v1_only = tuple(a for a in FULL_CLUSTER if "v1alpha1" not in a)
    objects = render(case_values(AMC_CASE), v1_only)
    assert not find(tuple(objects), "AlertmanagerConfig") and find(tuple(objects), "PrometheusRule")
    notes = render_manifests(case_values(AMC_CASE), v1_only)["ornith/templates/NOTES.txt"]
    assert "serves no AlertmanagerConfig (monitoring.coreos.com/v1alpha1)" in notes
    # `helm template --api-versions monitoring.coreos.com/v1alpha1` turns it on.
    assert find(tuple(render(case_values(AMC_CASE), (*v1_only, "monitoring.coreos.com/v1alpha1"))), "AlertmanagerConfig")


def test_bad_alertmanager_values_fail_the_schema() -> None:
    values = deep_merge(read_yaml("values-gpu96.yaml"), {"monitoring": {"alertmanagerConfig": {
        "enabled": True, "webhookUrl": "alerts.example.com", "repeatInterval": "4 hours"}}})
    errors = schema_errors(values)
    assert any(e.startswith("monitoring.alertmanagerConfig.webhookUrl") for e in errors), errors
    assert any(e.startswith("monitoring.alertmanagerConfig.repeatInterval") for e in errors), errors


# ------------------------------------------------------------------------------------- values and mistakes
@cache
def values_schema() -> dict[str, Any]:
    return json.loads((CHART / "values.schema.json").read_text())


def schema_errors(values: dict[str, Any]) -> list[str]:
    merged = deep_merge(read_yaml("values.yaml"), values)
    validator = jsonschema.Draft7Validator(values_schema())
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
            for e in validator.iter_errors(merged)]


@pytest.mark.parametrize("case", PROFILE_CASES + SCENARIO_CASES)
def test_values_files_match_the_schema(case: str) -> None:
    assert schema_errors(case_values(case)) == []


def test_schema_lists_exactly_the_profiles() -> None:
    assert values_schema()["properties"]["profile"]["enum"] == profile_names()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"profile": "h100x9"}, "profile: 'h100x9' is not one of ['a100x2', 'cpu-demo'"),
        ({"engine": {"replicas": "two"}}, "engine.replicas: 'two' is not of type 'integer'"),
        ({"engine": {"replica": 2}}, "engine: Additional properties are not allowed ('replica' was unexpected)"),
        ({"engine": {"image": {"tag": "latest"}}}, "engine.image.tag: 'latest' should not be valid under {'const': 'latest'}"),
        ({"modelCache": {"accessModes": ["ReadWriteSometimes"]}}, "modelCache.accessModes.0: 'ReadWriteSometimes' is not one of"),
    ],
)
def test_bad_values_fail_the_schema_readably(change: dict[str, Any], expected: str) -> None:
    values = deep_merge(read_yaml("values-gpu96.yaml"), change)
    errors = schema_errors(values)
    assert any(e.startswith(expected) for e in errors), errors
    # Helm checks the same schema before rendering, and names the key.
    with pytest.raises(helm.HelmError) as caught:
        chart().validate_schema(deep_merge(chart().values, values))
    assert expected.split(":")[0].split(".")[-1] in str(caught.value)


def test_missing_model_repo_is_a_readable_error() -> None:
    message = render_error(case_values("values-spark.yaml"))
    assert 'model.repo is required for profile "spark"' in message
    assert "--set model.repo=OWNER/NAME" in message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"engine": {"nodes": 2}}, "engine.nodes (2) x engine.gpusPerNode (2) must equal the profile's tensor parallelism (2)"),
        ({"engine": {"probes": {"startup": {"failureThreshold": 30}}}}, "allows 300 s"),
        ({"engine": {"replicas": 2}}, "2 engine pods share the model cache"),
        ({"engine": {"image": {"tag": ""}}}, "engine.image.tag is required"),
    ],
)
def test_impossible_deployments_fail_with_the_fix(change: dict[str, Any], expected: str) -> None:
    assert expected in render_error(deep_merge(case_values("values-a100x2.yaml"), change))


def test_no_profile_is_refused() -> None:
    """The chart alone (no values-<profile>.yaml) is refused by the schema, which lists the profiles."""
    message = render_error({})
    assert "at '/profile': value must be one of 'a100x2', 'cpu-demo', 'gb300x2', 'gpu96', 'spark'" in message


def test_crd_schemas_reject_unknown_fields() -> None:
    """The CRD schemas can fail: a misspelt field in a LeaderWorkerSet and in its pod template."""
    (lws,) = find(rendered("ci/gb300x2-two-nodes-lws.yaml"), "LeaderWorkerSet")
    for path in (("spec", "leaderWorkerTemplate"), ("spec", "leaderWorkerTemplate", "leaderTemplate", "spec")):
        bad = copy.deepcopy(lws)
        node = bad
        for key in path:
            node = node[key]
        node["sizee"] = 2
        with pytest.raises(jsonschema.ValidationError, match="sizee"):
            validate_object(bad)


def test_every_value_is_documented_where_declared() -> None:
    """Every row of the values table (helm-docs' rows: each leaf, or a described mapping) has a description."""
    from ornith_stack.generate import helm_values

    rows = helm_values.parse((CHART / "values.yaml").read_text()).rows
    assert len(rows) > 50
    assert [r.key for r in rows if not r.description] == []


def test_service_monitor_jobs_are_those_the_rules_select() -> None:
    """The alert rules select on job names (e.g. up{job="ornith-exporter"}); a ServiceMonitor would
    name jobs after the Services (release-dependent) unless it relabels them to the compose names."""
    from ornith_stack.generate import prometheus

    config = yaml.safe_load((ROOT / "monitoring" / "prometheus" / "prometheus.yml").read_text())
    # Prometheus and Alertmanager themselves: the operator's stack scrapes them in Kubernetes, and the
    # rules that read them (failed notifications) select on no job.
    jobs = {job["job_name"] for job in config["scrape_configs"]} - {prometheus.PROMETHEUS_JOB,
                                                                     prometheus.ALERTMANAGER_JOB}
    (monitor,) = find(rendered("values-gb300x2.yaml"), "ServiceMonitor")
    relabelled = {r["replacement"] for e in monitor["spec"]["endpoints"] for r in e["relabelings"]
                  if r["targetLabel"] == "job"}
    assert relabelled == jobs - {"gateway"}  # the Model Gateway's job exists where replicas run behind one
    monitors = find(rendered("ci/gpu96-gateway.yaml"), "ServiceMonitor")
    assert {r["replacement"] for m in monitors for e in m["spec"]["endpoints"] for r in e["relabelings"]
            if r["targetLabel"] == "job"} == jobs


def test_a_bad_values_file_is_refused_before_anything_renders(tmp_path: Path) -> None:
    """What `helm install -f bad.yaml` says: every wrong key, by its path, and nothing rendered."""
    bad = tmp_path / "bad.yaml"  # helm install -f values-gpu96.yaml -f bad.yaml
    bad.write_text("profile: h100x9\nexporter:\n  port: nine-thousand\n")
    values = deep_merge(read_yaml("values-gpu96.yaml"), helm.values_from_yaml(bad.read_text()))
    message = render_error(values)
    assert "- at '/profile': value must be one of 'a100x2', 'cpu-demo', 'gb300x2', 'gpu96', 'spark'" in message
    assert "- at '/exporter/port': got string, want integer" in message


def test_packaged_chart_carries_its_files_and_renders(tmp_path: Path) -> None:
    """`helm package` keeps files/ (rules, dashboards) and ci/, leaves out the development schemas."""
    import tarfile

    archive = helm.package(CHART, destination=tmp_path)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "ornith/files/prometheus-rules.yaml" in names and "ornith/values.schema.json" in names
    assert not [n for n in names if "crds-schemas" in n]
    with helm.Chart.load(archive) as packaged:
        manifests = render_manifests(case_values("values-gpu96.yaml"), source=packaged)
    assert "kind: PrometheusRule" in manifests["ornith/templates/prometheusrule.yaml"]


# ------------------------------------------------------------------------------------- a real cluster
MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("case", RENDERABLE)
def test_without_the_monitoring_crds_the_chart_renders_valid_objects_and_leaves_monitoring_out(case: str) -> None:
    # `helm install` on a cluster without the Prometheus Operator failed on the ServiceMonitor before.
    objects = render(case_values(case), NO_MONITORING)
    assert {o["kind"] for o in objects} & (MONITORING_KINDS | {"AlertmanagerConfig"}) == set()
    assert find(objects, "Service") and engine_pod_specs(tuple(objects))
    for obj in objects:
        validate_object(obj)
    monitoring = deep_merge(read_yaml("values.yaml"), case_values(case))["monitoring"]
    wanted = monitoring["serviceMonitor"]["enabled"] or monitoring["prometheusRule"]["enabled"]
    notes = render_manifests(case_values(case), NO_MONITORING)["ornith/templates/NOTES.txt"]
    assert ("no monitoring.coreos.com/v1 API" in notes) == wanted


@pytest.mark.parametrize("apis", [("monitoring.coreos.com/v1",), FULL_CLUSTER], ids=["api-versions-flag", "cluster"])
def test_with_the_monitoring_api_the_monitoring_objects_appear(apis: tuple[str, ...]) -> None:
    # `helm template --api-versions monitoring.coreos.com/v1`, and a cluster that serves the kinds.
    objects = render(case_values("values-gpu96.yaml"), apis)
    assert {o["kind"] for o in objects} >= MONITORING_KINDS
    for obj in objects:
        validate_object(obj)
    disabled = deep_merge(case_values("values-gpu96.yaml"), {"monitoring": {
        "serviceMonitor": {"enabled": False}, "prometheusRule": {"enabled": False}}})
    assert {o["kind"] for o in render(disabled, apis)} & MONITORING_KINDS == set()


CLUSTER_SETTINGS = {"engine": {
    "runtimeClassName": "nvidia",
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
    "extraEnv": [{"name": "NCCL_DEBUG", "value": "WARN"}],
    "extraVolumes": [{"name": "weights", "hostPath": {"path": "/srv/weights", "type": "Directory"}}],
    "extraVolumeMounts": [{"name": "weights", "mountPath": "/srv/weights", "readOnly": True}],
    "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "200Gi"}},
}}


@pytest.mark.parametrize("case", ["values-gpu96.yaml", "ci/gb300x2-two-nodes-lws.yaml"])
def test_cluster_settings_are_accepted_and_reach_every_engine_pod(case: str) -> None:
    values = deep_merge(case_values(case), CLUSTER_SETTINGS)
    assert schema_errors(values) == []
    objects = render(values)
    for obj in objects:
        validate_object(obj)
    for role, spec in engine_pod_specs(tuple(objects)).items():
        engine = container(spec, "engine")
        assert spec["runtimeClassName"] == "nvidia", role
        assert spec["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
        assert CLUSTER_SETTINGS["engine"]["tolerations"][0] in spec["tolerations"]
        assert {"name": "NCCL_DEBUG", "value": "WARN"} in engine["env"]
        assert CLUSTER_SETTINGS["engine"]["extraVolumes"][0] in spec["volumes"]
        assert CLUSTER_SETTINGS["engine"]["extraVolumeMounts"][0] in engine["volumeMounts"]
        assert engine["resources"]["requests"]["cpu"] == "8" and engine["resources"]["requests"]["memory"] == "64Gi"
        assert engine["resources"]["limits"]["nvidia.com/gpu"] == int(case_values(case)["engine"]["gpusPerNode"])
    # Without them, the pods say nothing about a runtime class.
    assert all("runtimeClassName" not in s for s in engine_pod_specs(rendered(case)).values())


@pytest.mark.parametrize("bad", [{"runtimeClassName": "Nvidia Runtime"}, {"extraVolumeMounts": [{"name": "x"}]}])
def test_bad_cluster_settings_fail_the_schema(bad: dict[str, Any]) -> None:
    key = next(iter(bad))
    errors = schema_errors(deep_merge(read_yaml("values-gpu96.yaml"), {"engine": bad}))
    assert any(e.startswith(f"engine.{key}") for e in errors), errors


@pytest.mark.parametrize("case", RENDERABLE)
def test_engine_runs_as_non_root_with_a_writable_home_and_cache(case: str) -> None:
    # Decision: the upstream images run as root and cache under /root/.cache; the chart runs them as a
    # non-root uid instead, so every path they write (HOME and the caches below it, HF_HOME, /tmp) must be
    # a writable volume, and nothing may point under /root.
    for role, spec in engine_pod_specs(rendered(case)).items():
        assert spec["securityContext"]["runAsUser"] != 0 and spec["securityContext"]["runAsNonRoot"]
        engine = container(spec, "engine")
        env = literal_env(engine)
        writable = {m["mountPath"] for m in engine["volumeMounts"] if not m.get("readOnly")}
        paths = [env["HOME"], env["XDG_CACHE_HOME"], env["HF_HOME"], "/tmp"]
        for path in paths:
            assert any(path == m or path.startswith(m + "/") for m in writable), (role, path, writable)
        assert not [v for v in env.values() if v.startswith("/root")], env
        assert env["USER"]


def _upstream_images() -> set[str]:
    """The upstream images images.yaml pins: engines without a Dockerfile of ours, and the services'."""
    pins = images()
    engines = {p["image"] for versions in pins["engines"].values() for p in versions.values() if "dockerfile" not in p}
    return engines | {ref for name, ref in pins["services"].items() if name != "exporter"}


def _project_images() -> dict[str, str]:
    """The images this project builds (images.yaml reference -> Dockerfile)."""
    pins = images()
    built = {p["image"]: p["dockerfile"] for versions in pins["engines"].values() for p in versions.values()
             if "dockerfile" in p}
    return {**built, pins["gateway"]["image"]: pins["gateway"]["dockerfile"],
            pins["services"]["exporter"]: deployment.EXPORTER_DOCKERFILE}


@pytest.mark.parametrize("case", RENDERABLE)
def test_every_image_is_a_pinned_upstream_one_or_the_projects_from_its_registry(case: str) -> None:
    """Nothing nobody can pull: an upstream image images.yaml pins, or an image this project builds, under
    projectImages.registry."""
    registry = case_values(case)["projectImages"]["registry"]
    assert registry
    allowed = _upstream_images() | {f"{registry}/{ref}" for ref in _project_images()}
    named = set()
    for obj in rendered(case):
        for spec in _pod_specs(obj):
            named |= {c["image"].split("@")[0] for c in spec.get("containers", []) + spec.get("initContainers", [])}
    assert named and named <= allowed, named - allowed
    for dockerfile in _project_images().values():
        assert (ROOT / dockerfile).is_file(), dockerfile


@pytest.mark.parametrize(("case", "leave_out"), [("values-gpu96.yaml", ["exporter.enabled"]),
                                                  ("ci/gpu96-gateway.yaml", ["exporter.enabled", "gateway.enabled"]),
                                                  ("values-cpu-demo.yaml", ["exporter.enabled"])])
def test_without_the_registry_the_chart_names_the_commands_that_build_and_push_the_projects_images(
        case: str, leave_out: list[str]) -> None:
    values = deep_merge(read_yaml(case), {"apiKey": {"allowUnauthenticated": True}})
    values.pop("projectImages", None)
    message = render_error(values)
    assert message.count("projectImages.registry is empty") == 1
    wanted = [f"{c['repository']}:{c['tag']}" for c in (values["engine"]["image"], values["exporter"]["image"],
                                                         values.get("gateway", {}).get("image", {}))
              if c.get("dockerfile")]
    assert wanted
    for ref in wanted:
        dockerfile = _project_images()[ref]
        assert f"`docker build -f {dockerfile} -t REGISTRY/{ref} . && docker push REGISTRY/{ref}`" in message
    assert "then install with --set projectImages.registry=REGISTRY" in message
    assert all(f"--set {key}=false" in message for key in leave_out)
    # The upstream engine image needs no registry: without the exporter (and gateway) gpu96 renders.
    if case == "values-gpu96.yaml":
        objects = render(deep_merge(values, {"exporter": {"enabled": False}}))
        assert {c["image"] for o in objects for spec in _pod_specs(o) for c in spec["containers"]} <= _upstream_images()


def test_the_registry_is_checked_by_the_schema() -> None:
    errors = schema_errors(deep_merge(read_yaml("values-gpu96.yaml"), {"projectImages": {"registry": "https://r.example/"}}))
    assert any(e.startswith("projectImages.registry") for e in errors), errors
    assert schema_errors(deep_merge(read_yaml("values-gpu96.yaml"), {"projectImages": {"registry": "r.example:5000/team"}})) == []


@pytest.mark.parametrize("case", ["values-gpu96.yaml", "ci/gb300x2-two-nodes-lws.yaml"])
def test_engine_loads_the_revision_the_download_job_fetched(case: str) -> None:
    # Offline (HF_HUB_OFFLINE=1), a commit or tag has no refs/main in the cache: the engine must be told the
    # revision the Job downloaded, or it fails to start (and with the Hub reachable it would load `main`).
    commit = "0123456789abcdef0123456789abcdef01234567"
    objects = tuple(render(deep_merge(case_values(case), {"model": {"revision": commit}})))
    (job,) = find(objects, "Job")
    assert literal_env(container(job["spec"]["template"]["spec"], "download"))["MODEL_REVISION"] == commit
    for role, spec in engine_pod_specs(objects).items():
        engine = container(spec, "engine")
        assert literal_env(engine)["HF_HUB_OFFLINE"] == "1"
        args = engine["args"]
        assert args[args.index("--revision") + 1] == commit, role
    # At `main` the profile's own flags are unchanged (test_engine_args_equal_launch_args).
    assert "--revision" not in container(engine_pod_specs(rendered(case))["single" if "lws" not in case else "leader"], "engine")["args"]


def test_a_revision_that_contradicts_the_profiles_flags_is_refused() -> None:
    values = case_values("values-gpu96.yaml")
    values = deep_merge(values, {"engine": {"args": [*values["engine"]["args"], "--revision", "v1.0"]},
                            "model": {"revision": "v2.0"}})
    assert "model.revision (v2.0) differs from the profile's --revision v1.0" in render_error(values)


@pytest.mark.parametrize("case", ["values-gpu96.yaml", "ci/gb300x2-two-4gpu-nodes.yaml"])
def test_every_engine_pod_carries_the_labels_role_and_annotations(case: str) -> None:
    """engine.podLabels and engine.podAnnotations reach the Deployment's pods and both LeaderWorkerSet
    templates, each pod labelled with its role."""
    values = deep_merge(case_values(case), {"engine": {"podLabels": {"team": "llm"},
                                                       "podAnnotations": {"example.com/owner": "ops"}}})
    objects = render(values)
    templates = [(o["spec"]["template"]["metadata"], "leader") for o in objects if o["kind"] == "Deployment"
                 and o["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"]
    for lws in (o for o in objects if o["kind"] == "LeaderWorkerSet"):
        spec = lws["spec"]["leaderWorkerTemplate"]
        templates += [(spec["leaderTemplate"]["metadata"], "leader"), (spec["workerTemplate"]["metadata"], "worker")]
    assert templates
    for metadata, role in templates:
        assert metadata["labels"]["team"] == "llm" and metadata["labels"]["ornith.ai/role"] == role
        assert metadata["labels"]["app.kubernetes.io/component"] == "engine"
        assert metadata["annotations"] == {"example.com/owner": "ops"}


def test_replicas_run_behind_the_model_gateway_which_discovers_the_engine_pods() -> None:
    objects = rendered("ci/gpu96-gateway.yaml")
    engine = next(o for o in find(objects, "Deployment") if o["metadata"]["name"] == f"{RELEASE}-engine")
    assert engine["spec"]["replicas"] == 2
    assert engine["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    gateway = next(o for o in find(objects, "Deployment") if o["metadata"]["name"] == f"{RELEASE}-gateway")
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert container["image"] == f"{REGISTRY}/{images()['gateway']['image']}"
    assert args[args.index("--policy") + 1] == "cache_aware" and "--service-discovery" in args
    selector = args[args.index("--selector") + 1: args.index("--service-discovery-port")]
    assert {"app.kubernetes.io/component=engine", "ornith.ai/role=leader", f"app.kubernetes.io/instance={RELEASE}"} \
        <= set(selector)
    assert args[args.index("--service-discovery-namespace") + 1] == NAMESPACE
    assert container["readinessProbe"]["httpGet"]["path"] == "/readiness"
    role = next(o for o in find(objects, "Role") if o["metadata"]["name"] == f"{RELEASE}-gateway")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    service = next(o for o in find(objects, "Service") if o["metadata"]["name"] == f"{RELEASE}-gateway")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"http": 30000}
    metrics = next(o for o in find(objects, "Service") if o["metadata"]["name"] == f"{RELEASE}-gateway-metrics")
    assert {p["name"]: p["port"] for p in metrics["spec"]["ports"]} == {"metrics": 29000}
    monitor = next(o for o in find(objects, "ServiceMonitor") if o["metadata"]["name"] == f"{RELEASE}-gateway")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics["metadata"]["labels"].items()
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["relabelings"][0]["replacement"] == "gateway"
    assert not [o for o in rendered("values-gpu96.yaml") if "gateway" in o["metadata"]["name"]]
# ------------------------------------------------------------------------------- probes and optional APIs
@pytest.mark.parametrize("case", RENDERABLE)
def test_every_probe_asks_a_health_route_never_the_metrics(case: str) -> None:
    """Engine probes: its health or models route; exporter probes: its own page (/), which scrapes nothing;
    the gateway's: its own readiness and liveness routes."""
    adapter = adapter_for(case_values(case)["engine"]["kind"])
    # The engine's routes as its adapter knows them (the values file's healthPath/modelsPath come from there).
    # The gateway's: /readiness (a worker is healthy), /liveness (the process runs); neither proxies a request.
    routes = {"engine": {adapter.health_path, adapter.models_path}, "exporter": {"/"},
              "gateway": {"/readiness", "/liveness"}}
    probed = []
    for obj in rendered(case):
        spec = obj.get("spec", {})
        pods = [spec.get("template", {}).get("spec", {})]
        template = spec.get("leaderWorkerTemplate", {})
        pods += [template.get(role, {}).get("spec", {}) for role in ("leaderTemplate", "workerTemplate")]
        for pod in pods:
            for c in pod.get("containers", []):
                for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                    if "httpGet" in c.get(kind, {}):
                        probed.append((c["name"], kind, c[kind]["httpGet"]["path"]))
    assert {name for name, _, _ in probed} >= {"engine", "exporter"}, probed
    assert [p for p in probed if p[2] not in routes.get(p[0], set())] == []


def test_a_leaderworkerset_without_its_api_is_refused_naming_what_to_install() -> None:
    case = "ci/gb300x2-two-nodes-lws.yaml"
    assert int(case_values(case)["engine"]["nodes"]) == 2
    with pytest.raises(helm.HelmError) as caught:
        render(case_values(case), api_versions=("monitoring.coreos.com/v1",))
    assert "engine.nodes=2 runs each engine copy as a LeaderWorkerSet" in str(caught.value)
    assert "install the LeaderWorkerSet controller" in str(caught.value)
    assert "--api-versions leaderworkerset.x-k8s.io/v1" in str(caught.value)
    # One node needs no LeaderWorkerSet: the same cluster renders it.
    single = render(case_values("values-gpu96.yaml"), api_versions=("monitoring.coreos.com/v1",))
    assert find(tuple(single), "Deployment") and not find(tuple(single), "LeaderWorkerSet")


def test_a_cu129_tag_offers_the_plain_tag_as_in_compose() -> None:
    for name in ("gpu96", "a100x2"):
        values = (CHART / f"values-{name}.yaml").read_text()
        tag = case_values(f"values-{name}.yaml")["engine"]["image"]["tag"]
        assert tag.endswith("-cu129")
        assert f"install with --set engine.image.tag={tag.removesuffix('-cu129')}." in values
def test_api_key_comes_from_an_existing_secret_and_the_probes_keep_working() -> None:
    values = {**case_values("values-gpu96.yaml"), "apiKey": {"secretName": "ornith-api-key"}}
    objects = tuple(render(values))
    assert not find(objects, "Secret")
    ref = {"secretKeyRef": {"name": "ornith-api-key", "key": "ORNITH_API_KEY"}}
    engine = container(engine_pod_specs(objects)["single"], "engine")
    # SGLang takes the key from a file (the tests below); the variable would only widen who sees it.
    assert all(e["name"] != "ORNITH_API_KEY" for e in engine["env"])
    # /v1/models asks for the key once the engine has one; the health route never does.
    health = read_yaml("values.yaml")["engine"]["healthPath"]
    for probe in ("startupProbe", "livenessProbe"):
        assert engine[probe]["httpGet"]["path"] == health, probe
    # The readiness probe's first generation asks /v1 with the key, from the file the engine reads it from.
    ready = engine["readinessProbe"]["exec"]["command"]
    assert ready[ready.index("--health-path") + 1] == health
    assert ready[ready.index("--key-file") + 1] == "/run/ornith-key/api-key.yaml"
    exporters = [c for obj in objects for spec in _pod_specs(obj) for c in spec["containers"] if c["name"] == "exporter"]
    assert exporters and all({"name": "ORNITH_API_KEY", "valueFrom": ref} in c["env"] for c in exporters)
    # Without a key nothing changes: no variable, the readiness probes on the models route.
    plain = container(engine_pod_specs(rendered("values-gpu96.yaml"))["single"], "engine")
    assert all(e["name"] != "ORNITH_API_KEY" for e in plain["env"])
    assert plain["startupProbe"]["httpGet"]["path"] == "/v1/models"
    assert "--key-file" not in plain["readinessProbe"]["exec"]["command"]


# ------------------------------------------------------------------------------------ the key, enforced
# The chart runs the upstream engine images, so no entrypoint hands the key over: the chart does it the way
# each engine reads it, and the engine's own code, fed the rendered pod, must end up with the key.
VLLM_SRC = Path(os.environ.get("ORNITH_VLLM024_SRC", Path(os.environ.get("ORNITH_CACHE_DIR", ROOT / ".cache"))
                               / "vllm-0.24.0-src")) / "vllm"
SGLANG_SRC = Path(os.environ.get("ORNITH_SGLANG0517_SRC", Path(os.environ.get("ORNITH_CACHE_DIR", ROOT / ".cache"))
                                 / "sglang-0.5.17-src")) / "sglang" / "srt"
SECRET = {"secretName": "ornith-api-key"}
THE_KEY = "k3y-from-the-secret"
OPERATOR = "0perator-from-the-secret"


def _engine_file(root: Path, rel: str) -> str:
    if not (root / rel).is_file():
        pytest.skip(f"{root / rel} is missing (scripts/test.sh unpacks the engine wheels' Python files)")
    return (root / rel).read_text()


def _pod_env(c: dict[str, Any], secret: dict[str, str]) -> dict[str, str]:
    """The container's environment as the kubelet builds it, secrets resolved from `secret`."""
    env = literal_env(c)
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref and ref["name"] == SECRET["secretName"] and (ref["key"] in secret or not ref.get("optional")):
            env[e["name"]] = secret[ref["key"]]
    return env


@pytest.mark.parametrize("case", ["values-cpu-demo.yaml", "ci/spark-model-repo.yaml"])
def test_a_vllm_engine_enforces_the_key_from_the_secret(case: str) -> None:
    values = {**case_values(case), "apiKey": SECRET}
    engine = container(engine_pod_specs(tuple(render(values)))["single"], "engine")
    env = _pod_env(engine, {"ORNITH_API_KEY": THE_KEY})
    argv = engine.get("command", []) + engine["args"]
    assert "--api-key" not in argv and THE_KEY not in json.dumps(engine)
    # vLLM 0.24's own code: envs.py's reader of VLLM_API_KEY, then api_server.py's choice of tokens
    # (`--api-key` first, else the variable); a non-empty list installs the AuthenticationMiddleware.
    envs = ast.parse(_engine_file(VLLM_SRC, "envs.py"))
    table = next(n.value for n in ast.walk(envs) if isinstance(n, ast.AnnAssign | ast.Assign)
                 and isinstance(n.value, ast.Dict) and any(isinstance(t, ast.Name) and t.id == "environment_variables"
                                                           for t in ([n.target] if isinstance(n, ast.AnnAssign)
                                                                     else n.targets)))
    reader = next(v for k, v in zip(table.keys, table.values, strict=True)
                  if isinstance(k, ast.Constant) and k.value == "VLLM_API_KEY")
    fake_os = NS(environ=env)
    vllm_api_key = eval(compile(ast.Expression(reader), "envs.py", "eval"), {"os": fake_os})()
    server = _engine_file(VLLM_SRC, "entrypoints/openai/api_server.py")
    choice = re.search(r"if tokens := (\[key for key in \(args\.api_key or \[envs\.VLLM_API_KEY\]\) if key\]):",
                       server)
    assert choice, "vLLM's api_server no longer chooses its tokens this way: look again"
    tokens = eval(choice[1], {"args": NS(api_key=None), "envs": NS(VLLM_API_KEY=vllm_api_key)})
    assert tokens == [THE_KEY]
    _the_guard_refuses_non_v1_routes_without_the_key(tuple(render(values)), engine, env)


# An ASGI request through the middleware vLLM's --middleware names, imported as the engine process would.
GUARD_PROBE = """
import asyncio, importlib, os, sys
module, name = sys.argv[1].rsplit(".", 1)
async def app(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})
guard = getattr(importlib.import_module(module), name)(app)
async def status(path, auth):
    sent = []
    async def send(message):
        sent.append(message)
    headers = [(b"authorization", auth.encode())] if auth else []
    await guard({"type": "http", "method": "POST", "path": path, "headers": headers}, None, send)
    return sent[0]["status"]
key = "Bearer " + os.environ["VLLM_API_KEY"]
print(*[asyncio.run(status(p, a)) for p, a in (("/invocations", ""), ("/invocations", key), ("/health", ""))])
"""


def _the_guard_refuses_non_v1_routes_without_the_key(objects: tuple[dict[str, Any], ...], engine: dict[str, Any],
                                                    env: dict[str, str]) -> None:
    """The chart's ConfigMap mounted where the pod mounts it, the module vLLM's --middleware names imported
    with the pod's PYTHONPATH: /invocations 401 without the key, 200 with it; /health open."""
    middleware = engine["args"][engine["args"].index("--middleware") + 1]
    (config_map,) = [c for c in find(objects, "ConfigMap") if c["metadata"]["name"].endswith("-engine-guard")]
    (mount,) = [m for m in engine["volumeMounts"] if m["name"] == "engine-guard"]
    with tempfile.TemporaryDirectory() as root:
        folder = Path(root + mount["mountPath"])
        folder.mkdir(parents=True)
        for name, text in config_map["data"].items():
            (folder / name).write_text(text)
        pythonpath = root + env["PYTHONPATH"]
        done = subprocess.run([sys.executable, "-c", GUARD_PROBE, middleware], capture_output=True, text=True,
                              env={"PATH": os.environ["PATH"], "PYTHONPATH": pythonpath, "VLLM_API_KEY": THE_KEY})
    assert done.stdout.split() == ["401", "200", "200"], done.stderr


@pytest.mark.parametrize("case", ["values-gpu96.yaml", "ci/gpu96-gateway.yaml", "ci/gb300x2-two-nodes-lws.yaml"])
def test_an_sglang_engine_enforces_the_key_from_a_0600_file(case: str, tmp_path: Path) -> None:
    values = {**case_values(case), "apiKey": SECRET}
    specs = engine_pod_specs(tuple(render(values)))
    pod = specs.get("single") or specs["leader"]
    engine = container(pod, "engine")
    writer = next(c for c in pod["initContainers"] if c["name"] == "write-api-key")
    (mount,) = [m for m in writer["volumeMounts"] if m["name"] == "api-key"]
    assert {"name": "api-key", "mountPath": mount["mountPath"], "readOnly": True} in engine["volumeMounts"]
    volume = next(v for v in pod["volumes"] if v["name"] == "api-key")
    assert volume["emptyDir"]["medium"] == "Memory"
    # Run the init container's own program here, its volume a temporary folder.
    local = [w.replace(mount["mountPath"], str(tmp_path)) for w in writer["args"]]
    subprocess.run([sys.executable, *writer["command"][1:], *local], check=True,
                   env={**os.environ, **_pod_env(writer, {"ORNITH_API_KEY": THE_KEY, "ORNITH_OPERATOR_KEY": OPERATOR})})
    (written,) = tmp_path.iterdir()
    assert written.stat().st_mode & 0o777 == 0o600
    argv = [w.replace(mount["mountPath"], str(tmp_path)) for w in engine["args"]]
    assert "--api-key" not in argv and THE_KEY not in json.dumps(pod)
    # SGLang 0.5.17's own --config handling (server_args_config_parser.py, which prepare_server_args runs
    # before parsing) turns the file into `--api-key KEY`; ServerArgs has the field it lands in.
    source = _engine_file(SGLANG_SRC, "server_args_config_parser.py")
    namespace: dict[str, Any] = {"__name__": "sglang_config_parser"}
    exec(compile(source, str(SGLANG_SRC / "server_args_config_parser.py"), "exec"), namespace)
    merged = namespace["ConfigArgumentMerger"](boolean_actions=[]).merge_config_with_args(argv)
    assert merged[merged.index("--api-key") + 1] == THE_KEY and "--config" not in merged
    # The operator's credential as SGLang's admin key: the users' key no longer opens the admin routes.
    assert merged[merged.index("--admin-api-key") + 1] == OPERATOR
    assert re.search(r"^    api_key: ", _engine_file(SGLANG_SRC, "server_args.py"), flags=re.MULTILINE)
    # Worker nodes serve no HTTP: no key for them.
    if "worker" in specs:
        assert "write-api-key" not in [c["name"] for c in specs["worker"].get("initContainers", [])]


def test_without_a_key_no_engine_gets_a_key_file_or_variable() -> None:
    for case in ("values-gpu96.yaml", "values-cpu-demo.yaml"):
        pod = engine_pod_specs(rendered(case))["single"]
        assert "write-api-key" not in [c["name"] for c in pod.get("initContainers", [])]
        engine = container(pod, "engine")
        assert "--config" not in engine["args"] and "VLLM_API_KEY" not in literal_env(engine)


def test_the_gateway_is_keyed_hardened_and_only_its_api_is_public() -> None:
    values = deep_merge(case_values("ci/gpu96-gateway.yaml"),
                        {"apiKey": SECRET, "engine": {"service": {"type": "LoadBalancer"}}})
    objects = tuple(render(values))
    gateway = next(o for o in find(objects, "Deployment") if o["metadata"]["name"] == f"{RELEASE}-gateway")
    pod = gateway["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = _pod_env(c, {"ORNITH_API_KEY": THE_KEY, "ORNITH_OPERATOR_KEY": OPERATOR})
    assert (env["ORNITH_API_KEY"], env["ORNITH_OPERATOR_KEY"]) == (THE_KEY, OPERATOR)
    # The Secret may hold no operator's credential (the launcher then closes the worker routes to everyone).
    assert _pod_env(c, {"ORNITH_API_KEY": THE_KEY}).keys() == {"ORNITH_API_KEY"}
    assert "--api-key" not in c["args"] and "command" not in c  # the image's launcher reads the variable
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    public = [o for o in find(objects, "Service") if o["spec"].get("type") == "LoadBalancer"]
    assert public and all(p["port"] != 29000 for s in public for p in s["spec"]["ports"])


# ------------------------------------------------------------------------------------- python pins
SGLANG_0517_WHEELS = Path(os.environ.get("ORNITH_CACHE_DIR", ROOT / ".cache")) / "wheels" / "sglang-0.5.17"


def test_sglang_0517s_wheel_pins_the_transformers_that_images_yaml_pins() -> None:
    """The upstream image carries the pin because SGLang's own wheel requires it (Requires-Dist)."""
    import zipfile

    wheels = sorted(SGLANG_0517_WHEELS.glob("sglang-0.5.17-*.whl"))
    if not wheels:
        pytest.skip(f"no sglang 0.5.17 wheel in {SGLANG_0517_WHEELS} (scripts/test.sh downloads it)")
    with zipfile.ZipFile(wheels[0]) as archive:
        metadata = archive.read("sglang-0.5.17.dist-info/METADATA").decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    transformers = [r for r in requires if re.match(r"transformers\b", r)]
    pinned = images()["engines"]["sglang"]["0.5.17"]["python_pins"]["transformers"]
    assert transformers == [f"transformers=={pinned}"], transformers


def _pins_check(case: str) -> list[dict[str, Any]]:
    return [c for spec in engine_pod_specs(rendered(case)).values() for c in spec.get("initContainers", [])
            if c["name"] == "check-python-pins"]


@pytest.mark.parametrize("case", RENDERABLE)
def test_the_profiles_python_pins_are_checked_in_every_engine_pod(case: str) -> None:
    values = case_values(case)
    pins = values["engine"].get("pythonPins", {})
    checks = _pins_check(case)
    if not pins:
        assert checks == [], f"{case}: a check without pins"
        return
    assert len(checks) == len(engine_pod_specs(rendered(case)))
    engine = container(next(iter(engine_pod_specs(rendered(case)).values())), "engine")
    for check in checks:
        assert check["image"] == engine["image"]  # the engine's image: nothing more to pull
        assert check["args"] == [engine["image"], *(f"{k}=={v}" for k, v in sorted(pins.items()))]
    for spec in engine_pod_specs(rendered(case)).values():
        assert spec["initContainers"][0]["name"] == "check-python-pins"  # before the wait for the download


def test_gpu96_checks_the_transformers_pin_and_profiles_without_pins_have_no_check() -> None:
    profile_pins = images()["engines"]["sglang"]["0.5.17"]["python_pins"]
    assert case_values("values-gpu96.yaml")["engine"]["pythonPins"] == profile_pins
    (check,) = _pins_check("values-gpu96.yaml")
    assert f"transformers=={profile_pins['transformers']}" in check["args"]
    without = [c for c in RENDERABLE if not case_values(c)["engine"].get("pythonPins")]
    assert "values-gb300x2.yaml" in without and all(_pins_check(c) == [] for c in without)


def test_the_pins_check_passes_a_matching_image_and_stops_another_naming_pin_version_and_fix() -> None:
    """The init container's own program, run with this Python as the image's: a matching pin passes, a
    different version or a missing package stops it with one error line each."""
    from importlib.metadata import version

    (check,) = _pins_check("values-gpu96.yaml")
    assert check["command"][:2] == ["python3", "-c"]
    program = check["command"][2]
    ours = version("PyYAML")

    def run(*pins: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", program, "example/engine:1", *pins], capture_output=True, text=True)

    good = run(f"PyYAML=={ours}")
    assert good.returncode == 0 and good.stderr == "", good
    bad = run(f"PyYAML=={ours}", "PyYAML==0.0.1", "no-such-package-ornith==1.0")
    assert bad.returncode == 1
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("error: engine.pythonPins pins ") for line in lines)
    assert f"PyYAML==0.0.1 (src/ornith_stack/images.yaml), but the engine image example/engine:1 has PyYAML {ours}" in lines[0]
    assert "has no-such-package-ornith not installed" in lines[1]
    assert all("docker/engine.Dockerfile builds one" in line and "engine.image.repository" in line for line in lines)


def operator_config(spec: dict[str, Any], namespace: str) -> dict[str, Any]:
    """An AlertmanagerConfig's spec as the Prometheus Operator merges it into the Alertmanager's
    configuration (matcher strategy OnNamespace): its route below the top one, matching namespace first."""
    def matchers(found: list[dict[str, str]]) -> list[str]:
        return [f'{m["name"]}{m.get("matchType", "=")}"{m["value"]}"' for m in found]

    def route(r: dict[str, Any]) -> dict[str, Any]:
        return {"receiver": r["receiver"], "matchers": matchers(r.get("matchers", [])),
                "routes": [route(child) for child in r.get("routes", [])]}

    ours = route(spec["route"])
    ours["matchers"] = [f'namespace="{namespace}"', *ours["matchers"]]
    receivers = [{"name": r["name"], "webhook_configs": [{"url": c["url"]} for c in r.get("webhookConfigs", [])]}
                 for r in spec["receivers"]]
    return {"route": {"receiver": "elsewhere", "routes": [ours]}, "receivers": [{"name": "elsewhere"}, *receivers]}


AMTOOL = shutil.which("amtool")


@pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (Debian: apt-get install prometheus-alertmanager)")
def test_the_rendered_alertmanagerconfig_routes_the_watchdog_pages_and_warnings(tmp_path: Path) -> None:
    """The chart's rules give the alerts whose series carry no namespace (the watchdog, failed
    notifications) the release's, so the namespaced AlertmanagerConfig routes them: amtool, on the
    configuration the operator would build, sends the watchdog to the heartbeat, a page to the paging
    receiver and a warning to its own; without the namespace the watchdog would go elsewhere."""
    objects = rendered(AMC_CASE)
    (rule,) = find(objects, "PrometheusRule")
    assert "ORNITH_RELEASE_NAMESPACE" not in json.dumps(rule)
    labels = {r["alert"]: r["labels"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert labels["OrnithWatchdog"]["namespace"] == labels["OrnithNotificationsFailing"]["namespace"] == NAMESPACE
    (amc,) = find(objects, "AlertmanagerConfig")
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(operator_config(amc["spec"], NAMESPACE)))
    for alert, receiver in ((labels["OrnithWatchdog"] | {"alertname": "OrnithWatchdog"}, alertmanager.HEARTBEAT),
                            ({"alertname": "OrnithNoReadyReplicas", "severity": "critical", "namespace": NAMESPACE},
                             alertmanager.RECEIVER),
                            ({"alertname": "OrnithSpecAcceptanceLow", "severity": "warning", "namespace": NAMESPACE},
                             alertmanager.WARNING),
                            ({"alertname": "OrnithWatchdog", "severity": "none"}, "elsewhere")):
        routed = subprocess.run([AMTOOL, "config", "routes", "test", f"--config.file={path}",  # type: ignore[list-item]
                                 f"--verify.receivers={receiver}", *(f"{k}={v}" for k, v in alert.items())],
                                capture_output=True, text=True, timeout=60, check=False)
        assert routed.returncode == 0, (alert, routed.stdout, routed.stderr)


def test_the_gateway_is_scraped_with_the_profile_and_checked_for_absence_only_where_it_runs() -> None:
    with_gateway, without = rendered("ci/gpu96-gateway.yaml"), rendered("values-a100x2.yaml")
    (monitor,) = [m for m in find(with_gateway, "ServiceMonitor") if m["metadata"]["name"].endswith("-gateway")]
    relabels = monitor["spec"]["endpoints"][0]["relabelings"]
    assert {"action": "replace", "targetLabel": "profile", "replacement": "gpu96"} in relabels

    def groups(objects: tuple[dict[str, Any], ...]) -> set[str]:
        (rule,) = find(objects, "PrometheusRule")
        return {g["name"] for g in rule["spec"]["groups"]}

    assert "ornith-gateway-discovery" in groups(with_gateway)
    assert "ornith-gateway-discovery" not in groups(without) and "ornith-exporter-discovery" in groups(without)


@pytest.mark.parametrize(("case", "what"), [("values-gpu96.yaml", "engine"), ("values-cpu-demo.yaml", "engine"),
                                            ("ci/gpu96-gateway.yaml", "gateway and its engines")])
def test_the_chart_refuses_a_keyless_engine_or_gateway_unless_told(case: str, what: str) -> None:
    values = deep_merge(read_yaml(case), {"projectImages": {"registry": REGISTRY}})
    values["apiKey"] = {}
    message = render_error(values)
    assert f"apiKey.secretName is empty: the {what} would answer anyone who reaches its Service" in message
    assert "set apiKey.secretName=ornith-api-key, or apiKey.allowUnauthenticated=true" in message
    assert render(deep_merge(values, {"apiKey": {"allowUnauthenticated": True}}))


def test_every_shipped_scenario_names_its_key_secret() -> None:
    for path in sorted((CHART / "ci").glob("*.yaml")):
        assert read_yaml(f"ci/{path.name}")["apiKey"]["secretName"] == "ornith-api-key", path.name


# ------------------------------------------------------------------------------------- network policies


def _pod_templates(objects: tuple[dict[str, Any], ...]) -> list[tuple[str, dict[str, str]]]:
    """(kind/name, pod labels) of every pod the release makes."""
    found = []
    for obj in objects:
        spec = obj.get("spec", {})
        if obj["kind"] == "LeaderWorkerSet":
            t = spec["leaderWorkerTemplate"]
            templates = [t["leaderTemplate"], t["workerTemplate"]]
        else:
            templates = [spec["template"]] if "spec" in spec.get("template", {}) else []
        found += [(f"{obj['kind']}/{obj['metadata']['name']}", t["metadata"]["labels"]) for t in templates]
    return found


def _policies(objects: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"].removeprefix(f"{RELEASE}-"): p["spec"] for p in find(objects, "NetworkPolicy")}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _rule_peers(rule: dict[str, Any]) -> list[str]:
    """Each peer of a rule in words: "anyone", "prometheus@<namespace>", or the release component."""
    if "from" not in rule:
        return ["anyone"]
    words = []
    for peer in rule["from"]:
        if "namespaceSelector" in peer:
            namespace = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
            words.append(f"prometheus@{namespace}")
        else:
            labels = peer["podSelector"]["matchLabels"]
            assert labels["app.kubernetes.io/instance"] == RELEASE  # the release's own pods only
            words.append(labels["app.kubernetes.io/component"])
    return words


def _ingress(spec: dict[str, Any]) -> set[tuple[str, int | None]]:
    """(peer, port) pairs a policy opens (port None: every port)."""
    return {(peer, port["port"] if port else None) for rule in spec["ingress"] for peer in _rule_peers(rule)
            for port in rule.get("ports", [None])}


@pytest.mark.parametrize("case", RENDERABLE)
def test_every_pod_of_the_release_is_denied_by_default_and_each_policy_is_valid(case: str) -> None:
    objects = rendered(case)
    policies = _policies(objects)
    for policy in find(objects, "NetworkPolicy"):
        validate_object(policy)
    deny = policies["default-deny"]
    assert deny["ingress"] == [] and deny["policyTypes"] == ["Ingress"]
    pods = _pod_templates(objects)
    assert pods and all(_selects(deny["podSelector"], labels) for _, labels in pods), pods
    for name, spec in policies.items():
        for rule in spec["ingress"]:
            # Ports listed everywhere but between the pods of one multi-node engine group.
            assert "ports" in rule or _rule_peers(rule) == ["engine"], (case, name, rule)
            assert all(p.get("namespaceSelector", {}).get("matchLabels") for p in rule.get("from", [])
                       if "namespaceSelector" in p), (case, name)


def test_behind_the_gateway_only_the_gateway_reaches_the_engines_api() -> None:
    # Replicas behind the gateway: the exporter is each engine pod's sidecar, scraped there by Prometheus.
    api = case_values("ci/gpu96-gateway.yaml")["engine"]["port"]
    policies = _policies(rendered("ci/gpu96-gateway.yaml"))
    assert set(policies) == {"default-deny", "engine", "gateway"}
    assert _ingress(policies["engine"]) == {("gateway", api), ("prometheus@monitoring", api),
                                            ("prometheus@monitoring", 9400)}
    assert _ingress(policies["gateway"]) == {("anyone", api), ("prometheus@monitoring", 29000)}


def test_without_a_gateway_the_engines_api_is_its_services_and_metrics_stay_with_monitoring() -> None:
    values = deep_merge(case_values("values-gpu96.yaml"), {"networkPolicy": {"monitoringNamespace": "obs"},
                                                           "monitoring": {"serviceMonitor": {"scrapeEngine": False}}})
    api = values["engine"]["port"]
    policies = _policies(tuple(render(values)))
    assert set(policies) == {"default-deny", "engine", "exporter"}
    assert _ingress(policies["engine"]) == {("anyone", api), ("exporter", api)}
    assert _ingress(policies["exporter"]) == {("prometheus@obs", 9400)}


def test_a_multi_node_group_talks_on_every_port_among_its_own_pods() -> None:
    assert ("engine", None) in _ingress(_policies(rendered("ci/gb300x2-two-nodes-lws.yaml"))["engine"])
    assert ("engine", None) not in _ingress(_policies(rendered("values-gpu96.yaml"))["engine"])


def test_no_network_policy_when_turned_off() -> None:
    values = deep_merge(case_values("values-gpu96.yaml"), {"networkPolicy": {"enabled": False}})
    assert not find(tuple(render(values)), "NetworkPolicy")
