"""Checking what callers pass in, before anything is written."""

from __future__ import annotations

import json
from typing import Any


def validate_input(value: Any) -> dict:
    """A run's input: a JSON object (``None`` means ``{}``); ``TypeError`` otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"input must be a dict (a JSON object), got {type(value).__name__}")
    try:
        # Round-trip so the stored input is exactly what a reader gets back.
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"input must be JSON-serialisable: {exc}") from None


def validate_payload(value: Any, what: str) -> Any:
    """A JSON value (an event payload, an input's value), as a reader gets it back."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} must be JSON-serialisable: {exc}") from None
