"""Moving the clock of the runs forward, for ``testing.drain(run_timers=True)``.

A test that wants a sleep, a backoff, a debounce period, a delayed start or a wait's
timeout to pass now, instead of waiting for it, advances the runs' timers: every
planned time of the unfinished runs (``due_at``, ``timeout_at``,
``debounce_deadline``) moves earlier by the same amount. That is what the wall clock
moving forward would do to them: the order of the timers and the spans between them
stay, so the earliest comes due first and a run whose own timeout falls before its
timer still times out. What already happened (``created_at``, ``started_at``, the
attempts' times) is never touched: the recorded history stays the real one.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import F

from django_durable.models import CLAIMABLE_STATUSES, Run
from django_durable.store.base import engine, execute, now

__all__ = ["advance_timers"]


def advance_timers(to: datetime) -> int:
    """Move the timers of the claimable runs earlier so that what was due at ``to`` is
    due now (the engine's ADVANCE_TIMERS; on SQLite, whose dates are text and whose
    clock is this process's, the same update through the ORM). Returns how many runs
    moved: 0 when ``to`` is not in the future."""
    statement = engine().ADVANCE_TIMERS
    if statement is not None:
        return execute(statement, {"to": to})
    span = to - now()
    if span <= timedelta(0):
        return 0
    return Run.objects.filter(status__in=list(CLAIMABLE_STATUSES)).update(
        due_at=F("due_at") - span,
        timeout_at=F("timeout_at") - span,
        debounce_deadline=F("debounce_deadline") - span,
    )
