"""Layering of nested mappings, as Helm layers `-f` files and profiles layer their bases."""

from __future__ import annotations

import copy
from typing import Any


def deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """`overlay` over `base`: mappings merge key by key, anything else is replaced; inputs stay untouched."""
    merged = copy.deepcopy(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
