"""Static checks of ansible/: ansible-lint (production profile, offline) and --syntax-check of every playbook.

Both tools come with the dev extras (ansible, ansible-lint); the collections the roles use
(community.docker, ansible.posix) ship with the `ansible` package, so nothing is fetched.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ornith_stack.errors import UserError
from ornith_stack.generate import ansible_roles

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = ROOT / "ansible"
BIN = Path(sys.executable).parent
PLAYBOOKS = sorted(p.name for p in ANSIBLE_DIR.glob("provision-*.yml"))
ROLES = sorted(p.name for p in (ANSIBLE_DIR / "roles").iterdir() if p.is_dir())


def _env() -> dict[str, str]:
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        NO_COLOR="1",
        PATH=f"{BIN}:{os.environ['PATH']}",
    )


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed (pip install -e '.[dev]')")
    return str(path)


def test_the_issue_s_playbooks_and_roles_exist() -> None:
    assert PLAYBOOKS == ["provision-gpu-host.yml", "provision-spark.yml"]
    assert ROLES == ["container_toolkit", "model_weights", "monitoring", "nvidia_driver", "ornith_service"]


def _in_ansible_dir(*argv: str, timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ANSIBLE_DIR, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def test_ansible_lint_passes_the_production_profile_offline() -> None:
    result = _in_ansible_dir(_tool("ansible-lint"), "-c", ".ansible-lint", "--nocolor", timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "Profile 'production' was required, and it passed" in result.stderr + result.stdout


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_playbook_passes_syntax_check(playbook: str) -> None:
    result = _in_ansible_dir(
        _tool("ansible-playbook"), "--syntax-check", "-i", "inventory/gpu-hosts.example.yml", playbook,
        "-e", "ornith_profile=gpu96", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _templated(value: object) -> bool:
    """Whether a default is a Jinja2 template (a string holding one, or a list or mapping of such strings)."""
    text = json.dumps(value)
    return "{{" in text or "{%" in text


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_prefixed_typed_and_documented(role: str) -> None:
    """meta/argument_specs.yml describes every variable of defaults/main.yml once, and no other.

    The rule for `default` in argument_specs: a literal value of defaults/main.yml is given as that very value
    (Ansible's own validator accepts it for the type, elements and choices); a templated one is described in
    words, never as a template (the template lives in defaults/main.yml only).
    """
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    role_dir = ANSIBLE_DIR / "roles" / role
    defaults = yaml.safe_load((role_dir / "defaults/main.yml").read_text())
    specs = yaml.safe_load((role_dir / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert all(name.startswith(f"{role}_") for name in defaults), sorted(defaults)
    assert list(specs) == list(defaults), "same variables, in the same order"
    for name, spec in specs.items():
        assert spec.get("type") and spec.get("description") and "default" in spec, name
        if _templated(defaults[name]):
            assert isinstance(spec["default"], str) and not _templated(spec["default"]), (name, spec["default"])
        else:
            assert spec["default"] == defaults[name], name
            assert "choices" not in spec or defaults[name] in spec["choices"], name
    literal = {name: value for name, value in defaults.items() if not _templated(value)}
    result = ArgumentSpecValidator({name: specs[name] for name in literal}).validate(literal)
    assert not result.error_messages, result.error_messages


@pytest.mark.parametrize("role", ROLES)
def test_defaults_hold_values_and_the_readme_table_comes_from_argument_specs(role: str) -> None:
    """defaults/main.yml says where the descriptions are; the README's generated table lists each variable with
    its type and its default: the value itself as code where argument_specs gives it, else its words."""
    role_dir = ANSIBLE_DIR / "roles" / role
    text = (role_dir / "defaults/main.yml").read_text()
    assert text.splitlines()[1] == "# Values only: each variable is described and typed in meta/argument_specs.yml."
    defaults = yaml.safe_load(text)
    specs = yaml.safe_load((role_dir / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    readme = (role_dir / "README.md").read_text()
    assert readme.startswith(f"{ansible_roles.NOTICE}# {role}\n")
    rows = {m[0]: m[1:] for m in re.findall(r"^\| `(\w+)` \| (.*?) \| (.*?) \| (.*) \|$", readme, re.MULTILINE)}
    assert list(rows) == list(specs)
    for name, spec in specs.items():
        kind, default, meaning = rows[name]
        assert kind.startswith(spec["type"]) and meaning.startswith(" ".join(str(spec["description"]).split()[:3]))
        if _templated(defaults[name]):
            assert default.replace("\\<", "<") == " ".join(spec["default"].split()), name
        else:
            assert default == f"`{ansible_roles.literal(defaults[name])}`", name


def test_a_readme_without_the_table_markers_is_refused_with_the_fix(tmp_path: Path) -> None:
    role = tmp_path / "ansible/roles/demo"
    (role / "meta").mkdir(parents=True)
    (role / "defaults").mkdir()
    (role / "meta/argument_specs.yml").write_text(
        "argument_specs: {main: {options: {demo_port: {type: int, default: 8000, description: Port.}}}}\n")
    (role / "defaults/main.yml").write_text("demo_port: 8000\n")
    (role / "README.md").write_text("# demo\n\n## Variables\n\n| hand-made table |\n")
    with pytest.raises(UserError, match=r"README.md: the Variables table needs one line <!-- BEGIN variables"):
        ansible_roles.readme(tmp_path, "demo")
    (role / "README.md").write_text(f"# demo\n\nProse.\n\n## Variables\n\n{ansible_roles.BEGIN}\nstale\n"
                                    f"{ansible_roles.END}\n\nMore prose.\n")
    built = ansible_roles.readme(tmp_path, "demo")
    assert built.startswith(ansible_roles.NOTICE + "# demo\n\nProse.\n")
    assert "| `demo_port` | int | `8000` | Port. |" in built and "stale" not in built
    assert built.endswith(f"{ansible_roles.END}\n\nMore prose.\n")
    (role / "README.md").write_text(built)
    assert ansible_roles.readme(tmp_path, "demo") == built  # the notice is not added twice


def _tasks() -> list[tuple[Path, dict]]:
    """Every task of every role and of tasks/, with the file it is in (blocks flattened)."""
    found: list[tuple[Path, dict]] = []

    def walk(path: Path, items: list) -> None:
        for item in items or []:
            if isinstance(item, dict):
                found.append((path, item))
                for key in ("block", "rescue", "always"):
                    walk(path, item.get(key, []))

    for path in [
        *ANSIBLE_DIR.glob("roles/*/tasks/*.yml"),
        *ANSIBLE_DIR.glob("roles/*/handlers/*.yml"),
        *ANSIBLE_DIR.glob("tasks/*.yml"),
    ]:
        walk(path, yaml.safe_load(path.read_text()))
    return found


def test_no_task_installs_ornith_stack_from_a_package_index() -> None:
    """Nobody publishes ornith-stack: a pip install by name would run whoever registers the name as root."""
    pips = [(path.name, task) for path, task in _tasks() if "ansible.builtin.pip" in task]
    assert pips, "the hf CLI is installed with pip"
    assert not [name for name, task in pips if "ornith" in json.dumps(task["ansible.builtin.pip"])]


def test_the_hub_token_never_travels_in_a_task_environment() -> None:
    """Ansible writes `environment:` into the `sh -c` command line that -vvv prints and ps shows."""
    defaults = (ANSIBLE_DIR / "roles/model_weights/vars/main.yml").read_text()
    assert "'HF_TOKEN':" not in defaults and "HF_TOKEN_PATH" in defaults
    for path, task in _tasks():
        assert "hf_token " not in str(task.get("environment", "")), path
        assert "HF_TOKEN" not in str(task.get("environment", "")), path


def test_the_playbooks_hard_code_no_profile_list() -> None:
    texts = [(ANSIBLE_DIR / name).read_text() for name in [*PLAYBOOKS, "provision.yml"]]
    assert not [t for t in texts if re.search(r"\[\s*'a100x2'", t) or "a100x2|gpu96" in t]
    for name in PLAYBOOKS:
        play = yaml.safe_load((ANSIBLE_DIR / name).read_text())
        assert [step.get("ansible.builtin.import_playbook") for step in play] == ["provision.yml"], name


@pytest.mark.parametrize(("variable", "setting"), [("ornith_service_api_key", "ORNITH_API_KEY"),
                                                   ("ornith_service_operator_key", "ORNITH_OPERATOR_KEY")])
def test_the_keys_are_used_only_by_tasks_that_hide_their_arguments(variable: str, setting: str) -> None:
    """-vvv prints a task's module arguments unless no_log is on: every task that names a key has it. The
    operator's credential is kept like the users' key: compose/.env (0600, no_log), no_log in the specs."""
    users = [(path.name, task) for path, task in _tasks()
             if variable in json.dumps({k: v for k, v in task.items() if k != "no_log"})]
    assert users, f"no task uses {variable}"
    assert all(task.get("no_log") for _, task in users), [task.get("name") for _, task in users]
    writers = [task for _, task in _tasks()
               if "env.j2" in json.dumps(task.get("ansible.builtin.template", {}))]
    assert writers and all(task.get("no_log") is True and task["ansible.builtin.template"]["mode"] == "0600"
                           for task in writers)
    env = (ANSIBLE_DIR / "roles/ornith_service/templates/env.j2").read_text()
    assert f"{setting}={{{{ {variable} }}}}" in env
    spec = yaml.safe_load((ANSIBLE_DIR / "roles/ornith_service/meta/argument_specs.yml").read_text())
    assert spec["argument_specs"]["main"]["options"][variable]["no_log"] is True
