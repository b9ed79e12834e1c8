"""Numbers about keys: ``django_durable.stats.keys(workflow=None)``; and
``status_estimates()``, runs per status as PostgreSQL's statistics estimate them.

Re-adds, dropped inputs and hand-offs come from the activity table, so they
cover ``DURABLE["ACTIVITY_RETENTION"]`` (a week by default); ``keys_held``
counts the holders in the runs table through the unique index of holders.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Count
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import TruncHour

from django_durable import store
from django_durable.models import Activity, Run
from django_durable.query import DROPPING_OUTCOMES, readds
from django_durable.store import estimates

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
    return estimates.status_estimates()


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
