"""Queues: pausing and resuming them (rows of ``durable_queue``), and counting what
each holds for ``queue_stats``.

A queue has a ``durable_queue`` row only once an operator paused or resumed it;
the claim (``store.claims``) leaves the runs of a paused queue alone. Counting is
two queries whatever the number of queues: one aggregate over the active runs
(grouped by queue, through ``durable_run_workflow_status``'s statuses), one read
of the queue rows.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, Min, Q

from django_durable.models import ACTIVE_STATUSES, CLAIMABLE_STATUSES, QueueState, Run, Status
from django_durable.store.base import now

__all__ = ["due_now_by_workflow", "paused_queues", "queue_counts", "set_paused"]


def set_paused(name: str, paused: bool) -> None:
    """Pause (or resume) queue ``name``; idempotent, one upsert."""
    QueueState.objects.update_or_create(name=name, defaults={"paused": paused, "changed_at": now()})


def paused_queues() -> set[str]:
    return set(QueueState.objects.filter(paused=True).values_list("name", flat=True))


def queue_counts(name: str | None = None) -> tuple[dict[str, dict[str, Any]], datetime]:
    """Per queue with active runs: ``pending``, ``due``, ``running``, ``waiting`` and
    ``oldest_due_at``; and the time they were counted at."""
    at = now()
    runs = Run.objects.filter(status__in=list(ACTIVE_STATUSES))
    if name is not None:
        runs = runs.filter(queue=name)
    due = Q(status__in=list(CLAIMABLE_STATUSES), due_at__isnull=False, due_at__lte=at)
    rows = (
        runs.order_by()
        .values("queue")
        .annotate(
            pending=Count("id", filter=Q(status=Status.PENDING)),
            due=Count("id", filter=due),
            running=Count("id", filter=Q(status=Status.RUNNING)),
            waiting=Count("id", filter=Q(status=Status.WAITING)),
            oldest_due_at=Min("due_at", filter=due),
        )
    )
    return {row.pop("queue"): row for row in rows}, at


def due_now_by_workflow() -> list[tuple[str, str, int]]:
    """``(queue, workflow, runs)`` of the claimable runs due now, most first: what a
    ``--burst`` worker that found nothing to claim reports it left (one aggregate,
    read once, when it stops)."""
    rows = (
        Run.objects.filter(status__in=list(CLAIMABLE_STATUSES), due_at__lte=now())
        .order_by()
        .values("queue", "workflow")
        .annotate(n=Count("id"))
    )
    found = [(row["queue"], row["workflow"], row["n"]) for row in rows]
    return sorted(found, key=lambda row: (-row[2], row[0], row[1]))
