"""helm/ornith/values.yaml read the way helm-docs and helm-schema read it (generate/helm_values.py): the
values table follows helm-docs' rules row for row, the schema takes helm-schema's `@schema`
blocks, mistakes are one error naming the line, and the chart's Profile section is what render writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ornith_stack.errors import UserError
from ornith_stack.generate import helm_values
from ornith_stack.generate.helm_chart import PROFILE_SECTION, SCENARIOS
from ornith_stack.generate.profile_files import render_profile
from ornith_stack.profiles import load_profile, profile_names

ROOT = Path(__file__).resolve().parents[2]
HELM_DOCS = ROOT / "tests" / "fixtures" / "helm-docs"  # README.md there lists the rules the sample exercises
CHART = ROOT / "helm" / "ornith"


@pytest.mark.parametrize("chart", ["sample"])
def test_the_table_is_what_helm_docs_writes_for_the_sample(chart: str) -> None:
    """Leaves without a description, a described mapping or list as one row (and its described keys), list
    items, `(int)` on a null, `@default`, continuation lines, a quoted key with dots: row for row."""
    values = (HELM_DOCS / chart / "values.yaml").read_text()
    expected = [line for line in (HELM_DOCS / chart / "README-values.md").read_text().splitlines()
                if line.startswith("|")]
    assert len(expected) > 10
    assert helm_values.table(helm_values.parse(values).rows).splitlines() == expected


SECTIONED = """\
# -- Written by a generator.
# @section -- Profile
b: 1
a:
  # -- An operator's.
  x: [1, 2]
  # -- A flag.
  # @section -- Profile
  flag: true
"""


def test_sections_are_tables_of_their_own_and_other_values_come_last() -> None:
    """helm-docs' default template: `### name` per section in order of first appearance, rows sorted."""
    assert helm_values.table(helm_values.parse(SECTIONED).rows) == (
        "### Profile\n\n" + helm_values.TABLE_HEADER
        + "\n| a.flag | bool | `true` | A flag. |\n| b | int | `1` | Written by a generator. |\n\n"
        "### Other Values\n\n" + helm_values.TABLE_HEADER + "\n| a.x | list | `[1,2]` | An operator's. |")


ANNOTATED = """\
# @schema
# enum: [a, b]
# required: true
# @schema
# -- A choice.
choice: a
limits:
  # @schema
  # minimum: 1
  # maximum: 9
  # @schema
  # -- A count,
  # on two lines.
  count: 3
  # @schema
  # type: [string, "null"]
  # @schema
  # -- Typed by its keywords, not by its default.
  name:
# -- A mapping whose keys carry no comments: one value of any keys.
context:
  runAsUser: 1000
"""


def test_the_schema_takes_helm_schema_blocks_and_types_from_defaults() -> None:
    schema = helm_values.schema(helm_values.parse(ANNOTATED), "t")
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False and schema["required"] == ["choice"]
    props = schema["properties"]
    assert props["choice"] == {"type": "string", "description": "A choice.", "enum": ["a", "b"]}
    assert props["limits"]["additionalProperties"] is False
    assert props["limits"]["properties"]["count"] == {
        "type": "integer", "description": "A count, on two lines.", "minimum": 1, "maximum": 9}
    assert props["limits"]["properties"]["name"] == {
        "description": "Typed by its keywords, not by its default.", "type": ["string", "null"]}
    assert props["context"] == {"type": "object", "description": "A mapping whose keys carry no comments: one value of any keys."}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: 1\n# @schema\n# minimum: 1\nb: 2\n", "values.yaml:2: a # @schema block opens and closes"),
        ("# @schema\n# [1, 2]\n# @schema\nb: 2\n", "values.yaml:1: a # @schema block holds a mapping"),
        ("# @schema\n# minimum: [1\n# @schema\nb: 2\n", "values.yaml:1: the # @schema block is not YAML"),
        ("# -- B.\n# @schema\n# minimum: 1\n# @schema\nb: 2\n", "values.yaml:1: the # @schema block comes after"),
        ("x: 1\n\n# -- Set it with --set b=3.\nb: 2\n", "values.yaml:3: helm-docs reads"),
    ],
    ids=["unclosed", "not-a-mapping", "not-yaml", "after-the-description", "dashes-in-the-first-line"],
)
def test_a_malformed_annotation_is_one_error_naming_the_line(text: str, expected: str) -> None:
    with pytest.raises(UserError) as caught:
        helm_values.parse(text)
    assert str(caught.value).startswith(expected), caught.value
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("value", "text"), [
    (1.0, "1"), (0.95, "0.95"), (1e-05, "0.00001"), (1e21, "1e+21"), ({"b": [1, None], "a": "<&>"}, '{"a":"<&>","b":[1,null]}'),
])
def test_defaults_are_written_as_go_writes_json(value: Any, text: str) -> None:
    assert helm_values.go_json(value) == text


# ------------------------------------------------------------------------------------- the chart's values
def test_each_comment_block_of_the_chart_has_one_description() -> None:
    """A second `# --` line in one block makes helm-docs drop everything above it (its issue 96): a
    wrapped line that starts with `--` (a flag) would cut a description short."""
    block: list[str] = []
    for number, line in enumerate((CHART / "values.yaml").read_text().splitlines(), 1):
        if line.lstrip().startswith("#"):
            block.append(line.strip())
            continue
        starts = [b for b in block if b.startswith("# --")]
        assert len(starts) <= 1, f"values.yaml:{number}: {starts}"
        block = []


def _leaf_paths(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [p for k, v in node.items() for p in _leaf_paths(v, f"{prefix}.{k}" if prefix else str(k))]
    return [prefix]


def test_the_profile_section_is_what_render_writes_into_the_profiles_values_files() -> None:
    """Each key `ornith-stack render` writes into a values-<profile>.yaml is documented in the section
    Profile (or lies in a mapping documented there), and each key of that section is written for some profile."""
    parsed = helm_values.parse((CHART / "values.yaml").read_text())
    section = set(helm_values.keys_in_section(parsed, PROFILE_SECTION))
    operator = {r.key for r in parsed.rows} - section
    # The shipped profiles, and those the scenarios derive from them (e.g. replicas behind the gateway).
    generated = {f"values-{name}.yaml": yaml.safe_load((CHART / f"values-{name}.yaml").read_text())
                 for name in profile_names()}
    for scenario in SCENARIOS:
        profile = load_profile(scenario.profile, scenario.overrides)
        generated[f"{scenario.name} (its profile)"] = yaml.safe_load(render_profile(profile, "helm-values.yaml.j2", "helm"))
    written: set[str] = set()
    for name, values in generated.items():
        for path in _leaf_paths(values):
            row = next((k for k in section | operator if path == k or path.startswith(k + ".")), None)
            assert row in section, f"{name} writes {path}, documented as {row or 'nothing'}"
            written.add(row)
    assert section - written == set(), "documented as the profile's, but no profile writes them"
