"""How many runs wait to be claimed, per queue, for the ``durable.queue.depth`` gauge:
a bounded count, read when a metric reader collects (every minute or so), never
per claim.

On PostgreSQL the count walks ``durable_run_claim`` only: the queues by a loose index
scan (one probe per queue), then per queue and priority level the due entries up to
a cap, so a queue of millions costs what a queue of ``cap`` costs, and runs due
later (sleeps, backoffs) are never read.
"""

from __future__ import annotations

from django.db.models import Count

from django_durable.models import CLAIMABLE_STATUSES, Run
from django_durable.store.base import fetchall, is_postgres, now
from django_durable.store.claims import priority_levels

__all__ = ["DEPTH_CAP", "queue_depths"]

# A queue's depth is counted up to this; deeper reads as this.
DEPTH_CAP = 10_000

# Due runs per queue, each count capped at %(cap)s (PostgreSQL). ``queues`` skips
# through durable_run_claim queue by queue, ``levels`` through each queue's priority
# levels the same way; per (queue, priority) the due entries are an index range
# (due_at <= statement_timestamp(), the database's clock, as the claim's).
QUEUE_DEPTH = (
    """
WITH RECURSIVE queues(name) AS (
    (SELECT queue FROM durable_run
     WHERE status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT queue FROM durable_run
            WHERE status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
              AND queue > queues.name
            ORDER BY queue LIMIT 1)
    FROM queues
    WHERE queues.name IS NOT NULL
)
SELECT queues.name, LEAST(%(cap)s, (
"""
    + priority_levels("queues.name")
    + """    SELECT COALESCE(sum((
        SELECT count(*) FROM (
            SELECT 1 FROM durable_run
            WHERE queue = queues.name AND priority = levels.priority
              AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
              AND due_at <= statement_timestamp()
            LIMIT %(cap)s
        ) AS due)), 0)
    FROM levels
    WHERE levels.priority IS NOT NULL
))
FROM queues
WHERE queues.name IS NOT NULL
"""
)


def queue_depths(cap: int = DEPTH_CAP) -> dict[str, int]:
    """Runs due now and not claimed, per queue that has claimable runs (0 when all
    of them are due later), each count at most ``cap``: QUEUE_DEPTH on PostgreSQL,
    one aggregate elsewhere."""
    if is_postgres():
        return {name: int(count) for name, count in fetchall(QUEUE_DEPTH, {"cap": cap})}
    claimable = Run.objects.filter(status__in=CLAIMABLE_STATUSES, due_at__isnull=False)
    depths = dict.fromkeys(claimable.order_by().values_list("queue", flat=True).distinct(), 0)
    due = claimable.filter(due_at__lte=now()).order_by().values("queue").annotate(n=Count("id"))
    depths.update({row["queue"]: min(row["n"], cap) for row in due})
    return depths
