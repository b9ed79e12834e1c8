"""Questions about keys: ``list_keys()`` and the querysets the dashboard pages on
(and ``reruns``, the reruns of a run, for its page).

Every query here is shaped to match an index, so it stays fast on a runs table
of millions of rows (``bench/keys_table.py`` measures it; the tests check the
plans with ``EXPLAIN`` on PostgreSQL):

- the keys of runs are grouped by walking ``durable_run_workflow_key``
  ((workflow, key) WHERE key IS NOT NULL) in order, so a page of keys reads
  only the rows of that page;
- a key's holder comes from the unique index of holders;
- re-adds in the last day come from ``durable_activity_readds``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.db.models import Count, Exists, OuterRef, QuerySet

from django_durable import store
from django_durable.models import PROGRESS_STREAM, Activity, Run

READD_WINDOW = timedelta(days=1)
# Re-adds whose input differed and was not used (the start got the existing run).
DROPPING_OUTCOMES = ("use_existing", "error")


def _holders():
    return Run.objects.filter(
        workflow=OuterRef("workflow"), key=OuterRef("key"), holds_key=True
    ).order_by()


def readds(workflow: str | None = None, key: str | None = None, since=None):
    """``key_duplicate`` activity, optionally of one workflow, key and period."""
    rows = Activity.objects.filter(kind=Activity.Kind.KEY_DUPLICATE)
    if workflow is not None:
        rows = rows.filter(workflow=workflow)
    if key is not None:
        rows = rows.filter(key=key)
    if since is not None:
        rows = rows.filter(created_at__gte=since)
    return rows


def keyed_runs():
    """The runs that were started with a key (what the Keys page filters)."""
    return Run.objects.filter(key__isnull=False)


def with_holder_status(runs, status: str):
    """Keep runs whose key's holder has ``status`` (``"none"``: no run holds it)."""
    if status == "none":
        return runs.filter(~Exists(_holders()))
    return runs.filter(Exists(_holders().filter(status=status)))


def group_keys(runs):
    """One row (``workflow``, ``key``, ``runs``) per key of ``runs``, in (workflow,
    key) order: an index walk, so a page reads only its own rows."""
    return (
        runs.order_by()
        .values("workflow", "key")
        .annotate(runs=Count("*"))
        .order_by("workflow", "key")
    )


def keys_queryset(
    workflow_name: str | None = None,
    *,
    holder_status: str | None = None,
    search: str | None = None,
):
    """One row (``workflow``, ``key``, ``runs``) per key ever used, ordered by
    workflow then key: slice it, then ``describe_keys()`` the slice.

    ``holder_status`` keeps keys whose holder has that status (``"none"``: keys
    no run holds); ``search`` keeps keys that start with it.
    """
    runs = keyed_runs()
    if workflow_name:
        runs = runs.filter(workflow=workflow_name)
    if search:
        runs = runs.filter(key__startswith=search)
    if holder_status:
        runs = with_holder_status(runs, holder_status)
    return group_keys(runs)


def describe_keys(rows: Iterable[dict], workflow_name: str | None = None) -> list[dict]:
    """Add ``holder_id``, ``holder_status`` and ``readds_last_day`` to key rows.

    Two more queries whatever the number of rows; each reads an index. (As
    subqueries of the grouping they would run for every run, not every key.)
    """
    rows = [dict(row) for row in rows]
    if not rows:
        return rows
    workflows = {row["workflow"] for row in rows}
    keys = {row["key"] for row in rows}
    whole = workflow_name is not None and len(rows) > 500
    holders = Run.objects.filter(holds_key=True, workflow__in=workflows).order_by()
    recent = readds(since=store.now() - READD_WINDOW).filter(workflow__in=workflows).order_by()
    if not whole:
        # A page of keys: look those up. (All keys of a workflow: read it whole.)
        holders = holders.filter(key__in=keys)
        recent = recent.filter(key__in=keys)
    holder_of = {
        (w, k): (run_id, status)
        for w, k, run_id, status in holders.values_list("workflow", "key", "id", "status")
    }
    readds_of = {
        (w, k): n
        for w, k, n in recent.values("workflow", "key")
        .annotate(n=Count("*"))
        .values_list("workflow", "key", "n")
    }
    for row in rows:
        holder_id, holder_status = holder_of.get((row["workflow"], row["key"]), (None, None))
        row["holder_id"] = holder_id
        row["holder_status"] = holder_status
        row["readds_last_day"] = readds_of.get((row["workflow"], row["key"]), 0)
    return rows


def list_keys(workflow_name: str | None = None) -> list[dict]:
    """Every key with its ``workflow``, ``holder_id`` and ``holder_status`` (None
    when no run holds it), how many ``runs`` used it, and ``readds_last_day``:
    how many starts found it taken in the last day."""
    if workflow_name is None:
        return [row for name in _workflows_with_keys() for row in list_keys(name)]
    return describe_keys(keys_queryset(workflow_name), workflow_name)


def runs_with_key(workflow: str, key: str):
    """Every run started with ``key`` of ``workflow``, newest first (the holder has
    ``holds_key=True``)."""
    return Run.objects.filter(workflow=workflow, key=key).order_by("-created_at", "-id")


def runs_of(workflow: str):
    return Run.objects.filter(workflow=workflow).order_by("-created_at", "-id")


def recent_activity(limit: int = 20, workflow: str | None = None) -> list[Activity]:
    rows = Activity.objects.order_by("-created_at", "-id")
    if workflow is not None:
        rows = rows.filter(workflow=workflow)
    return list(rows[:limit])


def key_activity(workflow: str, key: str, limit: int = 100) -> list[Activity]:
    """What happened to one key, newest first (re-adds, hand-offs, releases, retakes)."""
    rows = Activity.objects.filter(workflow=workflow, key=key).order_by("-created_at", "-id")
    return list(rows[:limit])


def status_counts(workflow: str | None = None) -> dict[str, int]:
    """How many runs have each status."""
    runs = Run.objects.all()
    if workflow is not None:
        runs = runs.filter(workflow=workflow)
    rows = runs.order_by().values("status").annotate(n=Count("*")).values_list("status", "n")
    return dict(rows)


def reruns(run_id) -> QuerySet[Run]:
    """The reruns of a run, newest first (``durable_run_rerun_of``)."""
    return store.reruns_of([run_id])


def _workflows_with_keys() -> list[str]:
    keyed = Run.objects.filter(key__isnull=False).order_by()
    return sorted(keyed.values_list("workflow", flat=True).distinct())


# Streams (docs/streams.md): what a run's page and the runs list show of them.


def run_streams(run_id) -> list[tuple]:
    """The run's streams: (name, items, closed_at, latest), by name (one query)."""
    return store.run_streams(run_id)


def latest_progress(run_ids: list) -> dict:
    """``Run.progress`` of each of ``run_ids`` that reported any (one query)."""
    return store.latest_values(run_ids, PROGRESS_STREAM)
