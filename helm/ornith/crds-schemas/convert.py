"""Make the JSON schemas in this folder from upstream CustomResourceDefinitions.

    python helm/ornith/crds-schemas/convert.py CRD.yaml [CRD.yaml ...]

Reads each CRD's openAPIV3Schema (the served version) and writes <kind>-<group>-<version>.json: OpenAPI v3
turned into JSON Schema (nullable -> null type, int-or-string -> anyOf, x-kubernetes-* dropped), strict
(additionalProperties: false where the CRD lists the properties and does not preserve unknown fields,
like kubernetes-validate's strict mode), descriptions dropped to keep the files small, and `status`
left out. Where a CRD embeds a core type, the schema refers to it in kubernetes-validate's definitions
(`https://kubernetes.io/api/_definitions.json`, its $id), which the tests load: object metadata, and the pod templates of a
LeaderWorkerSet (core/v1 PodTemplateSpec, which the CRD copies).

Sources used (see README.md here): prometheus-operator v0.93.0, lws v0.10.0 (+11 commits).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

# kubernetes-validate's definitions file carries this $id.
DEFS = "https://kubernetes.io/api/_definitions.json#/$defs/"
# Paths (under spec) whose schema is a core type: refer to the Kubernetes definition instead.
CORE_REFS = {
    ("leaderWorkerTemplate", "leaderTemplate"): "io.k8s.api.core.v1.PodTemplateSpec",
    ("leaderWorkerTemplate", "workerTemplate"): "io.k8s.api.core.v1.PodTemplateSpec",
}
DROPPED = {"description", "x-kubernetes-validations", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
           "x-kubernetes-map-type", "x-kubernetes-embedded-resource", "x-kubernetes-int-or-string",
           "x-kubernetes-preserve-unknown-fields", "nullable", "example"}


class CRDLoader(yaml.SafeLoader):
    """YAML 1.1's `=` (the "value" type, which PyYAML resolves but cannot construct) read as the string
    it is in Kubernetes' YAML 1.2: the matcher enums of the AlertmanagerConfig CRD list `- =` bare."""


CRDLoader.add_constructor("tag:yaml.org,2002:value", yaml.SafeLoader.construct_yaml_str)


def convert(node: dict[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    if path in CORE_REFS:
        return {"$ref": DEFS + CORE_REFS[path]}
    if node.get("x-kubernetes-int-or-string"):
        return {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    out: dict[str, Any] = {k: v for k, v in node.items() if k not in DROPPED}
    if "properties" in node:
        out["properties"] = {name: convert(sub, (*path, name)) for name, sub in node["properties"].items()}
        if "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(node.get("additionalProperties"), dict):
        out["additionalProperties"] = convert(node["additionalProperties"], (*path, "*"))
    if isinstance(node.get("items"), dict):
        out["items"] = convert(node["items"], (*path, "[]"))
    for key in ("allOf", "anyOf", "oneOf"):
        if key in node:
            out[key] = [convert(sub, path) for sub in node[key]]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def crd_schema(crd: dict[str, Any], source: str) -> tuple[str, dict[str, Any]]:
    spec = crd["spec"]
    version = next(v for v in spec["versions"] if v.get("served") and v.get("storage", True))
    root = version["schema"]["openAPIV3Schema"]
    group, kind, name = spec["group"], spec["names"]["kind"], version["name"]
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": f"Made by helm/ornith/crds-schemas/convert.py from {source} ({crd['metadata']['name']}, {name}).",
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": f"{group}/{name}"},
            "kind": {"const": kind},
            "metadata": {"$ref": DEFS + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
            "spec": convert(root["properties"]["spec"]),
        },
    }
    return f"{kind.lower()}-{group.split('.')[0]}-{name}.json", schema


def main(paths: list[str]) -> None:
    here = Path(__file__).parent
    for path in paths:
        filename, schema = crd_schema(yaml.load(Path(path).read_text(), CRDLoader), Path(path).name)
        (here / filename).write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
        print(f"wrote {here / filename}")


if __name__ == "__main__":
    main(sys.argv[1:])
