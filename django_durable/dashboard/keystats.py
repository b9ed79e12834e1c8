"""The key statistics the overview and workflow pages poll.

``stats.keys()`` (the documented API) counts the keys held exactly, an index
scan of every holder (about 0.2 s at a million holders): too much for a page
that refreshes every 5 s in every open tab. The pages compute the same numbers
(the same queries, on the activity table's indexes) with the holders and the
hand-offs counted up to ``counts.BOUND``.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import TruncHour
from django.utils.timezone import now

from django_durable.dashboard.counts import bounded
from django_durable.models import Activity, Run
from django_durable.query import DROPPING_OUTCOMES, readds
from django_durable.stats import BUCKET, BUCKETS, TOP_KEYS


def summary(workflow: str | None = None) -> dict:
    """``stats.keys(workflow)``'s dict, with ``keys_held`` a bounded ``Count``."""
    held = Run.objects.filter(holds_key=True)
    handoffs = Activity.objects.filter(kind=Activity.Kind.KEY_HANDED_OFF)
    if workflow is not None:
        held = held.filter(workflow=workflow)
        handoffs = handoffs.filter(workflow=workflow)
    duplicates = readds(workflow=workflow).order_by()
    by_outcome: dict[str, int] = {}
    dropped = 0
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
        if outcome in DROPPING_OUTCOMES and changed in ("true", 1, True):
            dropped += n
    top = (
        duplicates.values("workflow", "key")
        .annotate(readds=Count("*"))
        .order_by("-readds", "workflow", "key")[:TOP_KEYS]
    )
    return {
        "keys_held": bounded(held),
        "readds_by_outcome": by_outcome,
        "dropped_inputs": dropped,
        "handoffs": bounded(handoffs),
        "readds_over_time": _over_time(duplicates),
        "top_readded_keys": [dict(row) for row in top],
    }


def _over_time(duplicates) -> list[dict]:
    """Re-adds per hour of the last day, oldest first (as ``stats.keys``)."""
    end = now().replace(minute=0, second=0, microsecond=0) + BUCKET
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
