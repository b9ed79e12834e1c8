"""Duration helpers: every duration in django-durable is a ``timedelta``."""

import math
from datetime import timedelta


def seconds(n: float) -> timedelta:
    return timedelta(seconds=n)


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


def hours(n: float) -> timedelta:
    return timedelta(hours=n)


def days(n: float) -> timedelta:
    return timedelta(days=n)


def as_timedelta(value, what: str) -> timedelta:
    """Accept a timedelta or a number of seconds; refuse anything else."""
    if isinstance(value, timedelta):
        duration = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        duration = timedelta(seconds=value)
    else:
        raise TypeError(f"{what} must be a timedelta or a number of seconds, got {value!r}")
    if duration < timedelta(0):
        raise ValueError(f"{what} must not be negative, got {duration}")
    return duration


# The units a duration written as text may end with (``parse_duration``).
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def parse_duration(text: str) -> timedelta:
    """A duration written on a command line: ``30d``, ``12h``, ``15m``, ``90s`` or a
    number of seconds, never negative; ``ValueError`` (one line) for anything else."""
    text = text.strip()
    number, unit = (
        (text[:-1], _UNITS[text[-1]]) if text and text[-1] in _UNITS else (text, "seconds")
    )
    try:
        amount = float(number)
        if not math.isfinite(amount):
            raise ValueError
        duration = timedelta(**{unit: amount})
    except (ValueError, OverflowError):
        raise ValueError(f"not a duration: {text!r} (use 30d, 12h, 15m, 90s)") from None
    if duration < timedelta(0):
        raise ValueError(f"a duration is never negative, got {text!r}")
    return duration
