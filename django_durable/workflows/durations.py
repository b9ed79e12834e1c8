"""Duration helpers: every duration in django-durable is a ``timedelta``."""

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
