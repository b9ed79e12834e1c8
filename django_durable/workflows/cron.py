"""Cron expressions and timezones, parsed with croniter.

Five fields (minute hour day month weekday), or six with seconds last, as
croniter reads them. Fire times are computed in the schedule's timezone, so
``0 9 * * *`` in ``Europe/Paris`` fires at 09:00 Paris time across DST changes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter


def check_cron(expression: object) -> str:
    if not isinstance(expression, str) or not croniter.is_valid(expression):
        raise ValueError(f"not a valid cron expression: {expression!r}")
    return expression


def check_timezone(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a timezone is an IANA name such as 'Europe/Paris', got {name!r}")
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown timezone {name!r}") from None
    return name


def next_fire(expression: str, timezone: str, after: datetime) -> datetime:
    """The first tick of ``expression`` strictly after ``after``, in UTC."""
    local = after.astimezone(ZoneInfo(timezone))
    return croniter(expression, local).get_next(datetime).astimezone(UTC)
