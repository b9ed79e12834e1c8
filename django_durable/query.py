"""Questions about keys: ``list_keys()``."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, OuterRef, Subquery

from . import store
from .models import Activity, Run


def keys_queryset(workflow_name: str | None = None):
    """One row per (workflow, key) ever used, with its holder and counts."""
    runs = Run.objects.filter(key__isnull=False)
    if workflow_name is not None:
        runs = runs.filter(workflow=workflow_name)
    holders = Run.objects.filter(workflow=OuterRef("workflow"), key=OuterRef("key"), holds_key=True)
    since = store.now() - timedelta(days=1)
    readds = (
        Activity.objects.filter(
            kind=Activity.Kind.KEY_DUPLICATE,
            workflow=OuterRef("workflow"),
            key=OuterRef("key"),
            created_at__gte=since,
        )
        .order_by()
        .values("workflow")
        .annotate(n=Count("id"))
        .values("n")
    )
    return (
        runs.order_by()
        .values("workflow", "key")
        .annotate(
            runs=Count("id"),
            holder_id=Subquery(holders.values("id")[:1]),
            holder_status=Subquery(holders.values("status")[:1]),
            readds_last_day=Subquery(readds[:1]),
        )
        .order_by("workflow", "key")
    )


def list_keys(workflow_name: str | None = None) -> list[dict]:
    """Every key with its workflow, holder (id and status, or None), how many runs
    used it, and how many starts re-added it in the last day."""
    return [
        {**row, "readds_last_day": row["readds_last_day"] or 0}
        for row in keys_queryset(workflow_name)
    ]
