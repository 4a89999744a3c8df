"""Every flag in engines/*/flags.py is a flag of the engine, of the type the engine's own parser gives it.

Read with `ast` in the released wheels' Python files (scripts/test.sh unpacks them): SGLang 0.5.17
($ORNITH_SGLANG0517_SRC: the `ServerArgs` fields of sglang/srt/server_args.py, `A[type, Arg(aliases=...)]`,
and its hand-written `add_argument` calls) and 0.5.21 ($ORNITH_SGLANG0521_SRC: the same fields moved to
arg_groups/fields/); vLLM 0.24.0 ($ORNITH_VLLM024_SRC: the `add_argument("--...")` calls of
engine/arg_utils.py typed by the `EngineArgs` fields, and the `FrontendArgs` fields of the OpenAI server).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from ornith_stack.engines import ADAPTERS
from ornith_stack.engines.flag_types import FlagType

CACHE = Path(os.environ.get("ORNITH_CACHE_DIR", Path(__file__).resolve().parents[2] / ".cache"))
VLLM = Path(os.environ.get("ORNITH_VLLM024_SRC", CACHE / "vllm-0.24.0-src")) / "vllm"
SGLANG = {
    "0.5.17": Path(os.environ.get("ORNITH_SGLANG0517_SRC", CACHE / "sglang-0.5.17-src")) / "sglang" / "srt",
    "0.5.21": Path(os.environ.get("ORNITH_SGLANG0521_SRC", CACHE / "sglang-0.5.21-src")) / "sglang" / "srt",
}
# Spellings the project types although no release read defines them, and why.
NOT_IN_PARSER = {
    # argparse takes an unambiguous prefix of a long flag; "tp" is typed so that a seed's shorthand
    # fails at load time like the full spelling would, and the planner reads it (settings()).
    ("sglang", "tp"),
    ("vllm", "tp"),  # vLLM's short option is -tp; typed for the same reason
}
# Flags of one SGLang release only: where each first or last appears.
SGLANG_ONLY = {"mamba-scheduler-strategy": "0.5.17", "language-model-only": "0.5.21"}
PY_TYPES = {
    "int": int,
    "float": float,
    "bool": bool,
    "str": str,
    "dict": dict,
    "Dict": dict,
    "list": list,
    "List": list,
}


def _tree(path: Path) -> ast.Module:
    if not path.is_file():
        pytest.skip(f"{path} is missing (scripts/test.sh unpacks the engine wheels' Python files)")
    return ast.parse(path.read_text())


def _base_type(node: ast.expr | None) -> type | None:
    """int for `int`, `Optional[int]`, `int | None`; dict for `dict[str, Any]`; None when unknown."""
    if isinstance(node, ast.Name):
        return PY_TYPES.get(node.id)
    if isinstance(node, ast.Subscript):
        if isinstance(node.value, ast.Name) and node.value.id == "Optional":
            return _base_type(node.slice)
        return _base_type(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return next((t for t in (_base_type(node.left), _base_type(node.right)) if t), None)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _base_type(ast.parse(node.value, mode="eval").body)
    return None


def _class_fields(tree: ast.Module, names: set[str] | None = None) -> dict[str, ast.AnnAssign]:
    """Annotated fields of the classes `names` (every class when None), by field name."""
    found: dict[str, ast.AnnAssign] = {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and (names is None or n.name in names)):
        for item in cls.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                found[item.target.id] = item
    return found


def _added_flags(tree: ast.Module) -> dict[str, list[ast.Call]]:
    """Every long flag of an `add_argument(...)` call, by spelling (without the dashes)."""
    found: dict[str, list[ast.Call]] = {}
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        if isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
            for arg in call.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                    found.setdefault(arg.value[2:], []).append(call)
    return found


def sglang_parser(root: Path) -> dict[str, type | None]:
    """Flag -> parsed type of one SGLang release: A[T, Arg(aliases=[...])] fields and add_argument calls."""
    files = [root / "server_args.py", *sorted((root / "arg_groups" / "fields").glob("*.py"))]
    flags: dict[str, type | None] = {}
    for path in (f for f in files if f.is_file() or f.name == "server_args.py"):
        tree = _tree(path)
        for name, field in _class_fields(tree).items():
            ann = field.annotation
            if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id == "A"):
                continue
            parts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            kind = _base_type(parts[0])
            flags[name.replace("_", "-")] = kind
            for call in (p for p in parts[1:] if isinstance(p, ast.Call)):
                for kw in (k for k in call.keywords if k.arg == "aliases" and isinstance(k.value, ast.List)):
                    flags.update(
                        {
                            a.value[2:]: kind
                            for a in kw.value.elts
                            if isinstance(a, ast.Constant) and str(a.value).startswith("--")
                        }
                    )
        for flag in _added_flags(tree):
            flags.setdefault(flag, None)  # hand-written: deprecated aliases, --config, dynamic choices
    return flags


def sglang_choices(root: Path) -> dict[str, set[str]]:
    """Flag -> the values SGLang accepts, for fields with `Arg(choices=...)`: a list, or a module-level list
    named there (server_args.py, arg_groups/choices.py)."""
    files = [
        root / "server_args.py",
        root / "arg_groups" / "choices.py",
        *sorted((root / "arg_groups" / "fields").glob("*.py")),
    ]
    trees = [_tree(f) for f in files if f.is_file() or f.name == "server_args.py"]
    lists = {
        t.id: node.value
        for tree in trees
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    found: dict[str, set[str]] = {}
    for tree in trees:
        for name, field in _class_fields(tree).items():
            for call in (n for n in ast.walk(field.annotation) if isinstance(n, ast.Call)):
                for kw in (k for k in call.keywords if k.arg == "choices"):
                    value = lists.get(kw.value.id) if isinstance(kw.value, ast.Name) else kw.value
                    if isinstance(value, ast.List):
                        found[name.replace("_", "-")] = {e.value for e in value.elts if isinstance(e, ast.Constant)}
    return found


def vllm_parser() -> dict[str, type | None]:
    """Flag -> parsed type of vLLM 0.24.0: arg_utils' add_argument calls typed by EngineArgs' fields,
    bools with their --no- form (BooleanOptionalAction), and the OpenAI server's FrontendArgs fields."""
    engine = _tree(VLLM / "engine" / "arg_utils.py")
    fields = _class_fields(engine, {"EngineArgs"})
    flags: dict[str, type | None] = {}
    for flag in _added_flags(engine):
        field = fields.get(flag.replace("-", "_"))
        flags[flag] = _base_type(field.annotation) if field else None
        if flags[flag] is bool:
            flags[f"no-{flag}"] = bool
    frontend = _tree(VLLM / "entrypoints" / "openai" / "cli_args.py")
    for name, field in _class_fields(frontend, {"FrontendArgs", "BaseFrontendArgs"}).items():
        flags[name.replace("_", "-")] = _base_type(field.annotation)
    flags.update({flag: None for flag in _added_flags(frontend)})
    return flags


def _check(kind: str, ours: dict[str, FlagType], theirs: dict[str, type | None], release: str) -> list[str]:
    wrong = []
    for flag, declared in ours.items():
        if (kind, flag) in NOT_IN_PARSER or SGLANG_ONLY.get(flag, release) != release:
            continue
        if flag not in theirs:
            wrong.append(f"--{flag}: not a flag of {kind} {release}")
        elif theirs[flag] is not None and theirs[flag] is not declared.parsed:
            wrong.append(f"--{flag}: {kind} {release} parses {theirs[flag]}, flags.py says {declared.parsed}")
    return wrong


@pytest.mark.parametrize("release", sorted(SGLANG))
def test_sglang_flags_are_its_parsers(release: str) -> None:
    assert _check("sglang", ADAPTERS["sglang"].flags, sglang_parser(SGLANG[release]), release) == []


@pytest.mark.parametrize("release", sorted(SGLANG))
def test_sglang_choices_are_its_choices(release: str) -> None:
    """A value flags.py accepts among fixed choices is one SGLang accepts (a profile passing the load-time
    check does not fail at the engine's start)."""
    theirs = sglang_choices(SGLANG[release])
    checked = {flag: t.choices for flag, t in ADAPTERS["sglang"].flags.items() if t.choices and flag in theirs}
    assert checked, "no choice flag found in SGLang's sources: look again"
    assert {flag: set(ours) - theirs[flag] for flag, ours in checked.items() if set(ours) - theirs[flag]} == {}


def test_vllm_flags_are_its_parsers() -> None:
    assert _check("vllm", ADAPTERS["vllm"].flags, vllm_parser(), "0.24.0") == []


def test_the_exceptions_are_still_needed() -> None:
    """An exception whose flag the engine came to define is dropped from the list."""
    for kind, flag in NOT_IN_PARSER:
        assert flag in ADAPTERS[kind].flags
    assert set(SGLANG_ONLY) <= set(ADAPTERS["sglang"].flags)


def test_every_flag_an_adapter_writes_is_listed() -> None:
    """The adapters' own spellings (model, listen, multi-node flags) are in their flags.py."""
    for adapter in ADAPTERS.values():
        argv = adapter.multinode_args(2, "0", "leader", 5000) + adapter.listen_args("0.0.0.0", 8000)
        written = {word[2:] for word in argv if word.startswith("--")} | {adapter.model_flag, adapter.tp_flag}
        assert written <= set(adapter.flags), written - set(adapter.flags)
