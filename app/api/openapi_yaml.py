"""Render the OpenAPI document as deterministic block-style YAML (no YAML library needed).

Strings and keys are written as JSON double-quoted scalars, which YAML 1.2 reads verbatim, so
the output parses with any YAML loader and round-trips to the same document.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["to_yaml"]


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return json.dumps(str(value), ensure_ascii=False)


def _emit(value: Any, indent: int, out: list[str]) -> None:
    pad = "  " * indent
    if isinstance(value, dict):
        for key, sub in value.items():
            k = json.dumps(str(key), ensure_ascii=False)
            if isinstance(sub, (dict, list)) and sub:
                out.append(f"{pad}{k}:")
                _emit(sub, indent + 1, out)
            else:
                out.append(f"{pad}{k}: {_inline(sub)}")
    elif isinstance(value, list):
        for sub in value:
            if isinstance(sub, (dict, list)) and sub:
                nested: list[str] = []
                _emit(sub, indent + 1, nested)
                first = nested[0].lstrip()
                out.append(f"{pad}- {first}")
                out.extend(nested[1:])
            else:
                out.append(f"{pad}- {_inline(sub)}")
    else:
        out.append(f"{pad}{_scalar(value)}")


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return _scalar(value)


def to_yaml(document: dict[str, Any]) -> str:
    """Serialise a JSON-like document (dicts, lists, scalars) to YAML text ending in a newline."""
    out: list[str] = []
    _emit(document, 0, out)
    return "\n".join(out) + "\n"
