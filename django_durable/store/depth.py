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
from django_durable.store.base import engine, fetchall, now

__all__ = ["DEPTH_CAP", "queue_depths"]

# A queue's depth is counted up to this; deeper reads as this.
DEPTH_CAP = 10_000


def queue_depths(cap: int = DEPTH_CAP) -> dict[str, int]:
    """Runs due now and not claimed, per queue that has claimable runs (0 when all
    of them are due later), each count at most ``cap``: the engine's QUEUE_DEPTH, or
    one aggregate where it has none."""
    statement = engine().QUEUE_DEPTH
    if statement is not None:
        return {name: int(count) for name, count in fetchall(statement, {"cap": cap})}
    claimable = Run.objects.filter(status__in=CLAIMABLE_STATUSES, due_at__isnull=False)
    depths = dict.fromkeys(claimable.order_by().values_list("queue", flat=True).distinct(), 0)
    due = claimable.filter(due_at__lte=now()).order_by().values("queue").annotate(n=Count("id"))
    depths.update({row["queue"]: min(row["n"], cap) for row in due})
    return depths
