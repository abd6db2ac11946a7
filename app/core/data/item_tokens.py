"""Public metadata tokens of an item, DP-CMF's metadata source (Curmei et al. 2023, arXiv:2309.11516).

Tokens come from an item's public ``categories`` and ``features``:

* each category ``c`` -> ``"category:c"``;
* a string feature ``k: v`` -> ``"k:v"``; a list of strings ``k: [a, b]`` -> ``"k:a"``, ``"k:b"``;
* a boolean feature ``k: true`` -> ``"k"`` (false gives nothing);
* numbers are ignored (bucket them into a string feature, e.g. ``"decade": "1990s"``).

Values are stripped of surrounding white space and otherwise kept as given (case-sensitive);
empty strings give nothing. Tokens carried by fewer than :data:`MIN_TOKEN_ITEMS` items are dropped
(a token on one item ties that item to nothing).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["MIN_TOKEN_ITEMS", "item_tokens"]

MIN_TOKEN_ITEMS = 2


def item_tokens(categories: Iterable[Any] | None, features: dict[str, Any] | None) -> list[str]:
    """The public metadata tokens of one item (tokenisation in the module docstring), sorted."""
    tokens: set[str] = set()

    def add(key: str, value: Any) -> None:
        if isinstance(value, str) and value.strip():
            tokens.add(f"{key}:{value.strip()}")

    for c in categories or ():
        add("category", c)
    for key, value in (features or {}).items():
        key = str(key).strip()
        if not key:
            continue
        if isinstance(value, bool):
            if value:
                tokens.add(key)
        elif isinstance(value, list):
            for v in value:
                add(key, v)
        else:
            add(key, value)  # numbers (and anything else) are ignored
    return sorted(tokens)
