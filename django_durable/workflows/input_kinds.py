"""What ``ctx.wait_for_input(kind=...)`` asks for, and whether a value fits it.

A step declares the kind of value it waits for; ``check_spec`` refuses a bad
declaration at the call (in the step, where the traceback points at it), and
``check_value`` is what ``provide_input`` asks before it writes anything.

Kinds: ``any`` (any JSON value, the default), ``free_text`` (a ``str``),
``approval`` (a ``bool``), ``single_choice`` (one of ``choices``),
``multi_choice`` (a list of distinct ``choices``), ``form`` (a ``dict``).
"""

from __future__ import annotations

import json
from typing import Any

from django_durable.workflows.values import check_json, check_text

__all__ = ["CHOICE_KINDS", "KINDS", "ON_TIMEOUT", "check_spec", "check_value"]

KINDS = ("any", "free_text", "approval", "single_choice", "multi_choice", "form")
CHOICE_KINDS = ("single_choice", "multi_choice")
ON_TIMEOUT = ("resume", "fail")


def check_spec(kind: Any, prompt: Any, choices: Any, on_timeout: Any) -> dict[str, Any]:
    """The declaration as recorded with the wait; ``ValueError`` / ``TypeError`` for a
    bad one (an unknown kind or ``on_timeout``, choices missing for a choice kind or
    given for another, a prompt that is not a string)."""
    if kind not in KINDS:
        raise ValueError(f"input kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if on_timeout not in ON_TIMEOUT:
        raise ValueError(f"on_timeout must be 'resume' or 'fail', got {on_timeout!r}")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        check_text(prompt, "the prompt")
    if kind in CHOICE_KINDS:
        if choices is None:
            raise ValueError(f"a {kind} input needs choices")
        if isinstance(choices, str | bytes | dict) or not isinstance(choices, list | tuple):
            raise TypeError(f"choices must be a list, got {type(choices).__name__}")
        choices = list(choices)
        if not choices:
            raise ValueError(f"a {kind} input needs at least one choice")
        check_json(choices, "choices")
        choices = json.loads(json.dumps(choices, allow_nan=False))  # as a reader gets them
        if len({_canonical(c) for c in choices}) != len(choices):
            raise ValueError("choices must be distinct")
    elif choices is not None:
        raise ValueError(f"choices are for single_choice and multi_choice inputs, not {kind}")
    return {"kind": kind, "prompt": prompt, "choices": choices, "on_timeout": on_timeout}


def check_value(spec: dict[str, Any], value: Any) -> None:
    """``ValueError`` when ``value`` does not fit the input declared by ``spec``."""
    kind = spec.get("kind") or "any"
    choices = spec.get("choices") or []
    if kind == "free_text" and not isinstance(value, str):
        raise ValueError(f"a free_text input takes a str, got {_type(value)}")
    if kind == "approval" and not isinstance(value, bool):
        raise ValueError(f"an approval input takes true or false, got {_type(value)}")
    if kind == "form" and not isinstance(value, dict):
        raise ValueError(f"a form input takes a dict (a JSON object), got {_type(value)}")
    allowed = {_canonical(c) for c in choices}
    if kind == "single_choice" and _canonical(value) not in allowed:
        raise ValueError(f"{_short(value)} is not one of the choices {_short(choices)}")
    if kind == "multi_choice":
        if not isinstance(value, list):
            raise ValueError(f"a multi_choice input takes a list of choices, got {_type(value)}")
        picked = [_canonical(v) for v in value]
        if len(set(picked)) != len(picked):
            raise ValueError("a multi_choice input takes each choice at most once")
        if strange := [v for v, c in zip(value, picked, strict=True) if c not in allowed]:
            raise ValueError(f"{_short(strange)} are not among the choices {_short(choices)}")


def _canonical(value: Any) -> str:
    # JSON text, so that 1, 1.0 and True are different choices, as they are in JSON.
    return json.dumps(value, sort_keys=True, allow_nan=False)


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 120 else text[:119] + "…"
