"""Numbers about keys (``django_durable.stats.keys(workflow=None)``), throughput
and workers; and ``status_estimates()``, runs per status as PostgreSQL's
statistics estimate them.

Re-adds, dropped inputs and hand-offs come from the activity table, so they
cover ``DURABLE["ACTIVITY_RETENTION"]`` (a week by default); ``keys_held``
counts the holders in the runs table through the unique index of holders.

Throughput and the workers' counts read finished runs by ``finished_at``
through ``durable_run_finished`` (finished statuses only), over a bounded
window: the last hour. Their cost grows with the runs finished in an hour, not with
the table: at 1M runs, 6,500 of them finished in the last hour, each is one
index range of 10 ms (a day's 164,000 took 210 ms: hence the hour).
A finished run keeps the id of the worker that finished it (``worker_id``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Q
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import TruncHour, TruncMinute

from django_durable import store
from django_durable.models import FINISHED_STATUSES, Activity, Run, Status
from django_durable.query import DROPPING_OUTCOMES, readds

# Re-adds over time: one bucket per hour of the last day.
BUCKET = timedelta(hours=1)
BUCKETS = 24
TOP_KEYS = 10


def keys(workflow: str | None = None) -> dict:
    """Key statistics, of one workflow or of all of them.

    Returns a dict with ``keys_held`` (int), ``readds_by_outcome`` (outcome ->
    int), ``dropped_inputs`` (re-adds whose input differed from the run that
    answered them and was not used), ``handoffs`` (int), ``readds_over_time``
    (hourly ``{"at", "count"}`` buckets of the last day, oldest first) and
    ``top_readded_keys`` (``{"workflow", "key", "readds"}``, most first).
    """
    held = Run.objects.filter(holds_key=True)
    handoffs = Activity.objects.filter(kind=Activity.Kind.KEY_HANDED_OFF)
    if workflow is not None:
        held = held.filter(workflow=workflow)
        handoffs = handoffs.filter(workflow=workflow)
    duplicates = readds(workflow=workflow).order_by()

    by_outcome: dict[str, int] = {}
    dropped = 0
    # Text extraction (->>) groups about twice as fast as grouping JSON values.
    rows = (
        duplicates.annotate(
            outcome=KeyTextTransform("outcome", "details"),
            changed=KeyTextTransform("input_changed", "details"),
        )
        .values_list("outcome", "changed")
        .annotate(n=Count("*"))
    )
    for outcome, changed, n in rows:
        by_outcome[outcome] = by_outcome.get(outcome, 0) + n
        # PostgreSQL gives the text 'true', SQLite the number 1.
        if outcome in DROPPING_OUTCOMES and changed in ("true", 1, True):
            dropped += n

    top = (
        duplicates.values("workflow", "key")
        .annotate(readds=Count("*"))
        .order_by("-readds", "workflow", "key")[:TOP_KEYS]
    )
    return {
        "keys_held": held.count(),
        "readds_by_outcome": by_outcome,
        "dropped_inputs": dropped,
        "handoffs": handoffs.count(),
        "readds_over_time": _over_time(duplicates),
        "top_readded_keys": [dict(row) for row in top],
    }


def status_estimates() -> dict[str, int] | None:
    """Runs per status, estimated from PostgreSQL's table statistics (as fresh as the
    last ANALYZE; a millisecond where a count reads every row); None where there are
    none (SQLite, a table never analysed): the caller counts instead."""
    return store.status_estimates()


def _over_time(duplicates) -> list[dict]:
    end = store.now().replace(minute=0, second=0, microsecond=0) + BUCKET
    start = end - BUCKET * BUCKETS
    counts: dict[datetime, int] = dict(
        duplicates.filter(created_at__gte=start)
        .annotate(at=TruncHour("created_at"))
        .values("at")
        .annotate(n=Count("*"))
        .values_list("at", "n")
    )
    return [
        {"at": start + BUCKET * i, "count": counts.get(start + BUCKET * i, 0)}
        for i in range(BUCKETS)
    ]


# --- queues, throughput, workers ---------------------------------------------------

MINUTE = timedelta(minutes=1)
THROUGHPUT_MINUTES = 60
WORKER_WINDOW = timedelta(hours=1)
# Runs that ended in failure: failed, and failed then compensated (or not).
FAILED_STATUSES = (Status.FAILED, Status.COMPENSATED, Status.COMPENSATION_FAILED)
_COMPLETED = Count("id", filter=Q(status=Status.COMPLETED))
_FAILED = Count("id", filter=Q(status__in=FAILED_STATUSES))


def throughput(minutes: int = THROUGHPUT_MINUTES) -> list[dict[str, Any]]:
    """Runs finished per minute over the last ``minutes`` minutes, oldest first, the
    current (partial) minute last: ``{"at", "completed", "failed"}``, ``at`` the
    minute's start. ``failed`` counts the runs that ended failed, compensated or
    compensation_failed; cancelled runs are in neither. One query."""
    end = store.now().replace(second=0, microsecond=0) + MINUTE
    start = end - MINUTE * minutes
    rows = (
        Run.objects.filter(status__in=FINISHED_STATUSES, finished_at__gte=start)
        .order_by()
        .annotate(at=TruncMinute("finished_at"))
        .values("at")
        .annotate(completed=_COMPLETED, failed=_FAILED)
    )
    found = {row["at"]: row for row in rows}
    buckets = []
    for i in range(minutes):
        at = start + MINUTE * i
        row = found.get(at, {})
        buckets.append(
            {"at": at, "completed": row.get("completed", 0), "failed": row.get("failed", 0)}
        )
    return buckets


def worker_counts(
    worker_ids: list[str], window: timedelta = WORKER_WINDOW
) -> dict[str, dict[str, int]]:
    """Per worker id, the runs it finished within ``window`` (an hour): ``completed``
    and ``failed`` (as in ``throughput``). One query; workers without any are absent."""
    if not worker_ids:
        return {}
    rows = (
        Run.objects.filter(
            status__in=FINISHED_STATUSES,
            finished_at__gte=store.now() - window,
            worker_id__in=list(worker_ids),
        )
        .order_by()
        .values("worker_id")
        .annotate(completed=_COMPLETED, failed=_FAILED)
    )
    return {row.pop("worker_id"): row for row in rows}
