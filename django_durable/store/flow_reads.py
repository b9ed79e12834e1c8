"""Reading flow control's state (docs/flow-control.md): per flow key of a workflow,
its running runs, its due runs, and its begins in the rate's window; what
``durable.flow_stats``, ``durable.explain_run`` and ``testing.drain(run_timers=True)``
read. Operator reads, through the ORM on both databases: the counts read the
workflow's runs through ``durable_run_workflow_status`` and the begins through
``durable_run_flow_begun``; none is on the claim's path.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db.models import Count, Min

from django_durable.models import CLAIMABLE_STATUSES, HOLDS_WORKER, Run
from django_durable.store.base import now

__all__ = ["begins_in_window", "due_by_key", "running_by_key", "running_of"]


def running_by_key(workflow: str) -> dict[str, int]:
    """The runs of ``workflow`` a worker holds, per flow key (None: without one)."""
    rows = (
        Run.objects.filter(HOLDS_WORKER, workflow=workflow)
        .values_list("flow_key")
        .annotate(n=Count("id"))
        .order_by()
    )
    return dict(rows)


def running_of(*, workflow: str | None = None, queue: str | None = None) -> int:
    """How many runs of ``workflow`` (or ``queue``) a worker holds."""
    runs = Run.objects.filter(HOLDS_WORKER)
    if workflow is not None:
        runs = runs.filter(workflow=workflow)
    if queue is not None:
        runs = runs.filter(queue=queue)
    return runs.count()


def due_by_key(workflow: str, *, at: datetime | None = None) -> dict[str, int]:
    """The claimable runs of ``workflow`` due now, per flow key (with one)."""
    at = at or now()
    rows = (
        Run.objects.filter(
            workflow=workflow,
            status__in=CLAIMABLE_STATUSES,
            due_at__lte=at,
            flow_key__isnull=False,
        )
        .values_list("flow_key")
        .annotate(n=Count("id"))
        .order_by()
    )
    return dict(rows)


def begins_in_window(
    workflow: str, keys: Sequence[str], per: timedelta, *, at: datetime | None = None
) -> dict[str, tuple[int, datetime]]:
    """Per flow key of ``keys``: how many runs of ``workflow`` began in the window of
    length ``per`` ending now, and the oldest of those begins."""
    at = at or now()
    rows = (
        Run.objects.filter(workflow=workflow, flow_key__in=list(keys), started_at__gt=at - per)
        .values_list("flow_key")
        .annotate(n=Count("id"), oldest=Min("started_at"))
        .order_by()
    )
    return {key: (n, oldest) for key, n, oldest in rows}
