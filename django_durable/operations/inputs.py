"""Checking what callers pass in, before anything is written.

Every value a caller passes in (a run's input, an event's payload, an input's
value) is checked by ``workflows.values.checked_json`` (``TypeError`` for what is
not JSON or has a dict key that is not a str; ``ValueError`` for NUL or a lone
surrogate anywhere in it, for nesting past ``values.MAX_DEPTH``) and bounded by
``DURABLE["MAX_VALUE_BYTES"]``, as step results and the context are
(``ValueError``); names and ``by`` are short strings (``ValueError``). So the
database never refuses what a call accepted, and no page has to show an unbounded
value that came in this way.
"""

from __future__ import annotations

import json
from typing import Any

from django_durable import conf
from django_durable.workflows import input_kinds
from django_durable.workflows.values import check_text, check_text_size, checked_json

# An event's or an input's name: the column's length (Event.name).
MAX_NAME_CHARS = 200
# ``release_key(by=...)``: who released the key, kept in the activity row.
MAX_BY_CHARS = 200


def validate_input(value: Any) -> dict:
    """A run's input: a JSON object (``None`` means ``{}``); ``TypeError`` otherwise."""
    return validated_input(value)[0]


def validated_input(value: Any) -> tuple[dict, str]:
    """``validate_input``'s answer and the JSON text it was checked as: a start
    sends that text, so an input is serialised once."""
    if value is None:
        return {}, "{}"
    if not isinstance(value, dict):
        raise TypeError(f"input must be a dict (a JSON object), got {type(value).__name__}")
    text, plain = _checked(value, "input")
    # The start goes on with what a reader gets back: the input itself when it is
    # plain JSON (it reads back as an equal value), else the text read back (a
    # tuple becomes a list, an int key a str).
    return (value if plain else json.loads(text)), text


def validate_payload(value: Any, what: str) -> Any:
    """A JSON value (an event payload, an input's value), as a reader gets it back."""
    return json.loads(_checked(value, what)[0])


def _checked(value: Any, what: str) -> tuple[str, bool]:
    """A value passed in: its JSON text and whether it is plain (``checked_json``),
    with str keys only and no larger than ``MAX_VALUE_BYTES``."""
    text, plain = checked_json(value, what, str_keys=True)
    check_text_size(text, what, conf.get("MAX_VALUE_BYTES"))
    return text, plain


def validate_name(name: Any, kind: str) -> str:
    """An event's or an input's name: a non-empty string of at most 200 characters."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} names are non-empty strings, got {name!r}")
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"{kind} names are at most {MAX_NAME_CHARS} characters, got {len(name)}")
    return check_text(name, f"the {kind} name")


def validate_by(by: Any) -> str | None:
    """``release_key(by=...)``: ``None`` or a string of at most 200 characters."""
    if by is None:
        return None
    if not isinstance(by, str):
        raise ValueError(f"by must be a string (who released the key), got {by!r}")
    if len(by) > MAX_BY_CHARS:
        raise ValueError(f"by is at most {MAX_BY_CHARS} characters, got {len(by)}")
    return check_text(by, "by")


def check_answer(pending: dict, value: Any) -> None:
    """``provide_input``'s check, under the run's lock: ``ValueError`` when ``value``
    does not fit the kind the run's ``wait_for_input`` declared (``pending``:
    ``state.pending_wait``)."""
    spec = {"kind": pending.get("input_kind"), "choices": pending.get("choices")}
    try:
        input_kinds.check_value(spec, value)
    except ValueError as exc:
        raise ValueError(f"input {pending.get('name')!r}: {exc}") from None
