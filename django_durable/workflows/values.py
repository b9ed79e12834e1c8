"""What a value must be to be stored: JSON that every supported database accepts.

One checker for every value django-durable keeps (inputs, event payloads, step
results, context values), so a value is refused where it is produced, with a
clear exception, instead of by the database when it is written (PostgreSQL's
``jsonb`` refuses NUL and lone surrogates; Python's ``json`` gives up past its
recursion limit):

- ``TypeError``: not JSON (a set, an object, NaN);
- ``ValueError``: a string (or a key) holding NUL (``"\\x00"``) or a lone
  surrogate, nesting deeper than ``MAX_DEPTH``, or a value whose JSON text is
  larger than ``DURABLE["MAX_VALUE_BYTES"]``.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["MAX_DEPTH", "check_json", "check_size", "check_text", "json_size"]

# Containers nested deeper than this are refused (a JSON document this deep is a
# bug, and deeper ones reach Python's recursion limit).
MAX_DEPTH = 200

# NUL, or a surrogate code point (only ever alone in a Python str: a pair is one
# character), which UTF-8 cannot encode.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def check_text(value: str, what: str) -> str:
    """``ValueError`` for a string holding NUL or a lone surrogate."""
    found = _UNSTORABLE.search(value)
    if found is not None:
        char = found.group()
        name = "NUL" if char == "\x00" else f"a lone surrogate (U+{ord(char):04X})"
        raise ValueError(f"{what} holds {name}, which cannot be stored")
    return value


def _check_tree(value: Any, what: str) -> None:
    """Walk ``value`` without recursion: depth, and every string and key."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            check_text(item, what)
        elif isinstance(item, dict | list | tuple):
            if depth > MAX_DEPTH:
                raise ValueError(f"{what} is nested deeper than {MAX_DEPTH} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str):
                        check_text(key, what)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)


def check_json(value: Any, what: str) -> Any:
    """Return ``value`` if it can be stored; ``TypeError`` / ``ValueError`` otherwise."""
    json_text(value, what)
    return value


def json_text(value: Any, what: str) -> str:
    """``value``'s JSON text, if it can be stored; ``TypeError`` / ``ValueError`` otherwise."""
    _check_tree(value, what)
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable: {exc}") from None


def json_size(value: Any) -> int:
    """The size in bytes of ``value``'s JSON text (as it is sent to the database)."""
    return len(json.dumps(value, allow_nan=False).encode())


def check_size(value: Any, what: str, limit: int) -> None:
    """``ValueError`` when ``value``'s JSON text is larger than ``limit`` bytes."""
    size = json_size(value)
    if size > limit:
        raise ValueError(
            f"{what} is {size} bytes of JSON, over the limit of {limit} "
            '(DURABLE["MAX_VALUE_BYTES"])'
        )
