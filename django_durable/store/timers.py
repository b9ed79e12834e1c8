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
from django_durable.store.base import execute, is_postgres, now

__all__ = ["advance_timers"]

# Move every planned time of the claimable runs (pending, waiting, compensating)
# earlier by the span from the database's clock to %(to)s, so what was due at
# %(to)s is due now: one UPDATE, by the clock CLAIM reads (statement_timestamp());
# a NULL stays NULL, and a %(to)s that is not in the future moves nothing. Running
# runs are left alone (their worker owns them; a lease is not a timer). Tests only:
# it reads every claimable run (no index serves "all of them").
ADVANCE_TIMERS = """
UPDATE durable_run SET
    due_at = due_at - shift.span,
    timeout_at = timeout_at - shift.span,
    debounce_deadline = debounce_deadline - shift.span
FROM (SELECT %(to)s::timestamptz - statement_timestamp() AS span) AS shift
WHERE durable_run.status IN ('pending', 'waiting', 'compensating')
  AND shift.span > interval '0'
"""


def advance_timers(to: datetime) -> int:
    """Move the timers of the claimable runs earlier so that what was due at ``to`` is
    due now (ADVANCE_TIMERS; on SQLite, whose dates are text and whose clock is this
    process's, the same update through the ORM). Returns how many runs moved: 0 when
    ``to`` is not in the future."""
    if is_postgres():
        return execute(ADVANCE_TIMERS, {"to": to})
    span = to - now()
    if span <= timedelta(0):
        return 0
    return Run.objects.filter(status__in=list(CLAIMABLE_STATUSES)).update(
        due_at=F("due_at") - span,
        timeout_at=F("timeout_at") - span,
        debounce_deadline=F("debounce_deadline") - span,
    )
