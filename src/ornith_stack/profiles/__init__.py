"""Load, list and validate the hardware profiles: those shipped in this folder and the operator's own.

The operator's profiles (`ornith-stack profiles new` writes them) live in ORNITH_PROFILE_DIR, by
default $XDG_CONFIG_HOME/ornith-stack/profiles (~/.config/ornith-stack/profiles); a name found there
wins over a shipped profile of the same name. `render` generates the checkout's files from the
shipped profiles only.

A profile file may start with `extends: <base>`; bases live in `bases/` and are merged key by key
(mappings recursively, everything else replaced), so per-hardware files are overlays, not copies.
"""

from __future__ import annotations

import os
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ornith_stack.errors import UserError, shown
from ornith_stack.merge import deep_merge
from ornith_stack.profiles.model import PROFILE_NAME, Profile
from ornith_stack.reading import parse_yaml, read_yaml_mapping

DEFAULT_PROFILE = "cpu-demo"
_PROFILE_DIR = Path(str(resources.files(__package__)))
# The profiles `render` generates the checkout's files from (tests point it elsewhere).
SHIPPED_DIR = _PROFILE_DIR
_IMAGES = _PROFILE_DIR.parent / "images.yaml"
# A profile name is a file name in the profile folder: no path separators, no leading dot.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A --set key: dotted names, each a YAML key a profile uses.
SET_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,15}")


def user_profile_dir(to_write: bool = False) -> Path:
    """The operator's profile folder: ORNITH_PROFILE_DIR, else $XDG_CONFIG_HOME/ornith-stack/profiles.

    A folder named by ORNITH_PROFILE_DIR must exist when profiles are read (a typo would otherwise list
    nothing and say so with exit 0); `to_write` (`profiles new`) accepts one that does not exist yet, which
    the writer then makes, as it makes the default one."""
    configured = os.environ.get("ORNITH_PROFILE_DIR")
    if configured is not None:
        path = Path(configured).expanduser() if configured else None
        if to_write and path is not None and not path.exists():
            return path
        if path is None or not path.is_dir():
            raise UserError(f"ORNITH_PROFILE_DIR={shown(configured)} is not a folder; point it at a folder of "
                            "profile files or unset it")
        return Path(configured).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(config) / "ornith-stack" / "profiles"


def _names_in(folder: Path) -> set[str]:
    return {p.stem for p in folder.glob("*.yaml") if NAME.fullmatch(p.stem)}


def shipped_profile_names() -> list[str]:
    return sorted(_names_in(SHIPPED_DIR))


def profile_names() -> list[str]:
    """Shipped and operator profiles, by name."""
    return sorted(_names_in(SHIPPED_DIR) | _names_in(user_profile_dir()))


def check_name(name: str, known: bool = True) -> str:
    """`name` if it can name a profile file (what `profiles new` may write, `profiles show` can read);
    `known`: the refusal lists the profiles (`profiles new`'s folder may not exist yet)."""
    if not NAME.fullmatch(name):
        listed = f"; known profiles: {', '.join(profile_names())}" if known else ""
        raise UserError(f"profile {shown(name)}: a profile name is letters, digits, '.', '_' and '-' "
                        f"(at most 64, no path){listed}")
    return name


def check_new_name(name: str, option: str) -> str:
    """`name` if a new operator profile can take it (the schema's name: lowercase letters, digits and dashes, no
    path) and no shipped profile has it; checked before anything is written, never after the work."""
    if not re.fullmatch(PROFILE_NAME, name):
        raise UserError(f"{option} {shown(name)}: a new profile's name is lowercase letters, digits and '-', "
                        "starting with a letter or digit, at most 63 (no path)")
    if name in shipped_profile_names():
        raise UserError(f"{option} {name!r} is a shipped profile; choose another name")
    return name


def profile_path(name: str, shipped: bool = False) -> Path:
    """The file of profile `name`: the operator's, else the shipped one; `shipped`: the shipped one only."""
    check_name(name)
    for folder in ((SHIPPED_DIR,) if shipped else (user_profile_dir(), SHIPPED_DIR)):
        path = folder / f"{name}.yaml"
        # Anything there is the reader's to refuse (a FIFO, a device, a folder), never skipped silently.
        if path.exists() or path.is_symlink():
            return path
    known = ", ".join(profile_names())
    raise UserError(f"unknown profile {name!r}; known profiles: {known} (operator profiles: {user_profile_dir()})")


def load_profile(name: str, overrides: dict[str, str] | None = None, shipped: bool = False) -> Profile:
    """Read, merge and validate profile `name`; `overrides` maps dotted keys to values (--set);
    `shipped`: the shipped profile even where the operator has one of that name (what `render` reads)."""
    path = profile_path(name, shipped)
    data = _resolve_extends(_read_yaml(path), path)
    data.setdefault("name", name)
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, _set_value(key, value) if isinstance(value, str) else value)
    return from_data(data, path)


def from_data(data: dict[str, Any], path: Path) -> Profile:
    """A profile from its (merged) mapping: the engine's image pin filled in from images.yaml, validated.
    Called after --set, so that --set engine.version=X takes X's image."""
    _inject_engine_image(data, path)
    return validate(data, path)


def load_all() -> list[Profile]:
    return [load_profile(name) for name in profile_names()]


def load_shipped() -> list[Profile]:
    """The shipped profiles only: `render` writes tracked files, which no operator profile may change."""
    return [load_profile(name, shipped=True) for name in shipped_profile_names()]


def validate(data: dict[str, Any], path: Path) -> Profile:
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise UserError(_describe(exc, path)) from None


def images() -> dict[str, Any]:
    return _cached_yaml(_IMAGES)


@cache
def _cached_yaml(path: Path) -> dict[str, Any]:
    return _read_yaml(path)


def _read_yaml(path: Path) -> dict[str, Any]:
    return read_yaml_mapping(path)


def _resolve_extends(data: dict[str, Any], path: Path) -> dict[str, Any]:
    base_name = data.pop("extends", None)
    if base_name is None:
        return data
    base_path = _PROFILE_DIR / "bases" / f"{base_name}.yaml"
    if not base_path.is_file():
        raise UserError(f"{path}: extends {base_name!r}, but {base_path} does not exist")
    return deep_merge(_resolve_extends(_read_yaml(base_path), base_path), data)


def _inject_engine_image(data: dict[str, Any], path: Path) -> None:
    """Fill engine.image and engine.python_pins from images.yaml, the one place pins live."""
    engine = data.get("engine")
    if not isinstance(engine, dict) or "image" in engine:
        return
    pins = images()["engines"].get(engine.get("kind"), {}).get(str(engine.get("version")))
    if pins is None:
        raise UserError(f"{path}: engine {engine.get('kind')} {engine.get('version')} has no image pin in {_IMAGES}")
    engine["image"] = pins["image"]
    engine.setdefault("python_pins", pins.get("python_pins", {}))
    engine.setdefault("nvidia_require_cuda", pins.get("nvidia_require_cuda"))


def _set_value(key: str, text: str) -> Any:
    """A --set value read as YAML (numbers, true/false, lists), the way the profile file would say it."""
    if not text.strip():
        raise UserError(f"--set {key}=: empty value; give a value, or null to clear the key")
    return parse_yaml(text, f"--set {key}={shown(text)}", value=True)


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    if not SET_KEY.fullmatch(key):
        raise UserError(f"--set {shown(key)}: expected a dotted key such as model.repo")
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise UserError(f"--set {key}: {part!r} is not a mapping")
        node = child
    node[leaf] = value


def _describe(exc: ValidationError, path: Path) -> str:
    lines = [f"{path}: invalid profile"]
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            lines.append(f"  {field}: unknown key (check the spelling; see 'ornith-stack profiles show')")
        elif err["type"] == "value_error" and not err["loc"]:
            lines.append(f"  {err['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"  {field}: {err['msg']} (got {shown(err.get('input'))})")
    return f"{lines[0]}: " + "; ".join(line.strip() for line in lines[1:])
