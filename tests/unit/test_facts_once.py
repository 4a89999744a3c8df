"""A deployment fact lives once (deployment.py): move a port there and no generated file keeps the old one.

The generated files are rendered from a copy of the checkout whose deployment.py has every port moved; a
generated string that typed a port (round three's `curl -s http://EXPORTER:9400/metrics` in a runbook) still
shows the old number."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from ornith_stack import deployment

REPO = Path(__file__).resolve().parents[2]
PORTS = ("EXPORTER_PORT", "PROMETHEUS_PORT", "GRAFANA_PORT", "ALERTMANAGER_PORT", "GATEWAY_METRICS_PORT")
# What `render` reads besides src/: the profiles' folders, the chart, the roles and the monitoring tree.
TREES = ("compose", "helm", "ansible", "monitoring", "docker")
# Generated from hand-written files that repeat the facts (the chart's values.yaml, the roles' argument specs),
# which test_deployment_facts.py holds to deployment.py; their tables show those files' defaults.
FROM_HAND_WRITTEN = re.compile(r"^(helm/ornith/README\.md|ansible/roles/[^/]+/README\.md)$")
RENDER = "from pathlib import Path; from ornith_stack.generate.generators import render_all; render_all(Path('.'))"


def test_no_generated_file_types_a_port_of_deployment_py(tmp_path: Path) -> None:
    shutil.copytree(REPO / "src", tmp_path / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for tree in TREES:
        shutil.copytree(REPO / tree, tmp_path / tree, symlinks=True)
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    facts = tmp_path / "src" / "ornith_stack" / "deployment.py"
    text = facts.read_text()
    moved = {}
    for name in PORTS:
        old = getattr(deployment, name)
        moved[name] = (old, old + 17)
        text, found = re.subn(rf"^{name} = {old}$", f"{name} = {old + 17}", text, flags=re.M)
        assert found == 1, f"deployment.py no longer writes {name} = {old}: update this test"
    facts.write_text(text)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src")}
    subprocess.run([sys.executable, "-c", RENDER], cwd=tmp_path, env=env, check=True, timeout=300)
    listed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from pathlib import Path; from ornith_stack.generate.generators import "
            "generated_files; print('\\n'.join(g.path for g in generated_files(Path('.'))))",
        ],
        cwd=tmp_path,
        env=env,
        check=True,
        timeout=300,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert len(listed) > 20
    stale = []
    for rel in (rel for rel in listed if not FROM_HAND_WRITTEN.match(rel)):
        rendered = (tmp_path / rel).read_text()
        for name, (old, new) in moved.items():
            stale += [
                f"{rel}: {line.strip()[:120]} ({name} is now {new})"
                for line in rendered.splitlines()
                if re.search(rf"(?<![\d.]){old}(?!\d)", line)
            ]
    assert stale == [], "\n".join(stale)
