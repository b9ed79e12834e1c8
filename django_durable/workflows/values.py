"""What a value must be to be stored: JSON that every supported database accepts.

One checker for every value django-durable keeps (inputs, event payloads, step
results, context values), so a value is refused where it is produced, with a
clear exception, instead of by the database when it is written (PostgreSQL's
``jsonb`` refuses NUL and lone surrogates; Python's ``json`` gives up past its
recursion limit):

- ``TypeError``: not JSON (a set, an object, NaN); and, for what a caller passes
  in (``str_keys=True``: inputs, event payloads, provided inputs), a dict key that
  is not a str, which JSON would silently turn into one (``{1: "a"}`` would come
  back as ``{"1": "a"}``);
- ``ValueError``: a string (or a key) holding NUL (``"\\x00"``) or a lone
  surrogate, nesting deeper than ``MAX_DEPTH``, or a value whose JSON text is
  larger than ``DURABLE["MAX_VALUE_BYTES"]``.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = [
    "MAX_DEPTH",
    "check_json",
    "check_size",
    "check_text_size",
    "check_text",
    "checked_json",
    "json_size",
    "json_text",
]

# Containers nested deeper than this are refused (a JSON document this deep is a
# bug, and deeper ones reach Python's recursion limit).
MAX_DEPTH = 200

# NUL, or a surrogate code point (only ever alone in a Python str: a pair is one
# character), which UTF-8 cannot encode.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def check_text(value: str, what: str) -> str:
    """``ValueError`` for a string holding NUL or a lone surrogate."""
    # Most text is ASCII, which holds no surrogate: one scan in C, no regex.
    found = _UNSTORABLE.search(value) if not value.isascii() or "\x00" in value else None
    if found is not None:
        char = found.group()
        name = "NUL" if char == "\x00" else f"a lone surrogate (U+{ord(char):04X})"
        raise ValueError(f"{what} holds {name}, which cannot be stored")
    return value


_CONTAINERS = (dict, list, tuple)
# The types of a "plain" tree, whose JSON text reads back as an equal value (a tuple,
# an int key or a subclass reads back as something else).
_PLAIN_TYPES = frozenset({dict, list, str, int, float, bool, type(None)})


def _check_tree(value: Any, what: str) -> tuple[bool, bool]:
    """Walk ``value`` without recursion: depth, and every string and key. Only
    containers go on the stack; their strings are checked as they are met.

    Returns whether the tree is plain: exact dicts with exact str keys, lists, and
    exact str, int, float, bool or None (``_PLAIN_TYPES``); and whether every dict
    key is a str (a subclass included)."""
    plain = type(value) in _PLAIN_TYPES
    str_keys = True
    if isinstance(value, str):
        check_text(value, what)
        return plain, str_keys
    stack: list[tuple[Any, int]] = [(value, 1)] if isinstance(value, _CONTAINERS) else []
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"{what} is nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, dict):
            for key in item:
                if type(key) is not str:
                    plain = False
                if isinstance(key, str):
                    check_text(key, what)
                else:
                    str_keys = False
            children = item.values()
        else:
            children = item
        for child in children:
            kind = type(child)
            if kind not in _PLAIN_TYPES:
                plain = False
                kind = _walked_as(child)
            if kind is str:
                check_text(child, what)
            elif kind is dict or kind is list:
                stack.append((child, depth + 1))
    return plain, str_keys


def _first_key_not_str(value: Any, what: str) -> str:
    """Where the first dict key that is not a str is, and what it is: the message of
    ``checked_json(str_keys=True)``'s ``TypeError`` (walked only once one is known)."""
    stack: list[tuple[Any, str]] = [(value, what)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    return (
                        f"{path} has a key that is not a str: {key!r} "
                        f"({type(key).__name__}); JSON would store it as a str"
                    )
            stack.extend((child, f"{path}[{key!r}]") for key, child in reversed(item.items()))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{path}[{n}]") for n, child in reversed(list(enumerate(item))))
    raise AssertionError("no key that is not a str")  # the walk found one: unreachable


def _walked_as(value: Any) -> type | None:
    """How the walk treats a value of no plain type: a str subclass as a string, a
    tuple or a container subclass as a container, anything else not at all."""
    if isinstance(value, str):
        return str
    return list if isinstance(value, _CONTAINERS) else None


def check_json(value: Any, what: str) -> Any:
    """Return ``value`` if it can be stored; ``TypeError`` / ``ValueError`` otherwise."""
    json_text(value, what)
    return value


# The JSON text of a stored value: NaN and the infinities are not JSON.
_ENCODER = json.JSONEncoder(allow_nan=False)


def json_text(value: Any, what: str) -> str:
    """``value``'s JSON text, if it can be stored; ``TypeError`` / ``ValueError`` otherwise."""
    return checked_json(value, what)[0]


def checked_json(value: Any, what: str, *, str_keys: bool = False) -> tuple[str, bool]:
    """``json_text``, and whether ``value`` is plain: its text reads back as an equal
    value, so a caller that wants what a reader gets back may keep ``value``.
    ``str_keys``: a dict key that is not a str is a ``TypeError`` naming where it is."""
    plain, keys_are_str = _check_tree(value, what)
    if str_keys and not keys_are_str:
        raise TypeError(_first_key_not_str(value, what))
    try:
        return _ENCODER.encode(value), plain
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable: {exc}") from None


def json_size(value: Any) -> int:
    """The size in bytes of ``value``'s JSON text (as it is sent to the database)."""
    return len(_ENCODER.encode(value).encode())


def check_size(value: Any, what: str, limit: int) -> None:
    """``ValueError`` when ``value``'s JSON text is larger than ``limit`` bytes."""
    check_text_size(_ENCODER.encode(value), what, limit)


def check_text_size(text: str, what: str, limit: int) -> None:
    """``ValueError`` when ``text`` (a JSON text of this module's encoder: ASCII, so
    one byte a character) is larger than ``limit`` bytes."""
    size = len(text)
    if size > limit:
        raise ValueError(
            f"{what} is {size} bytes of JSON, over the limit of {limit} "
            '(DURABLE["MAX_VALUE_BYTES"])'
        )
