"""Deleting finished runs past retention, and old activity."""

from __future__ import annotations

from datetime import datetime, timedelta

from django_durable import conf, store
from django_durable.operations import retention as retention_rules
from django_durable.operations.finish import sweep_waiting
from django_durable.operations.flow import claim_limits


def prune(older_than: timedelta | None = None, *, dry_run: bool = False) -> int:
    """Delete finished runs past retention (freeing their keys) and old activity.

    Returns how many runs were deleted, children (deleted with their parent) included.
    ``older_than`` overrides ``DURABLE["RUN_RETENTION"]`` and every workflow's
    ``retention`` (without it, each workflow's applies per outcome); a run that is still
    going is never deleted, nor one a ``run_again`` run still waits behind.
    ``dry_run`` counts and deletes nothing. Deletes in batches of
    ``DURABLE["PRUNE_BATCH_SIZE"]``, one short transaction each.

    ``older_than=timedelta(0)`` prunes every finished run. ``TypeError`` for an
    ``older_than`` that is not a ``timedelta``, ``ValueError`` for a negative one (a
    typo, never a wish) or one reaching back before year 1: before anything is deleted.
    """
    at = store.now()
    if older_than is not None:
        _cutoff(at, older_than)  # refused before anything is written
    settings = conf.durable_settings()
    retention = older_than if older_than is not None else settings["RUN_RETENTION"]
    batch = settings["PRUNE_BATCH_SIZE"]
    pruned = 0
    # Workflow.retention, per workflow and outcome (operations.retention), unless
    # older_than applies one age to every run.
    per_workflow = retention_rules.condition(at, retention) if older_than is None else None
    if retention is not None or per_workflow is not None:
        if not dry_run:
            # A finished holder that a run_again run still waits behind hands its
            # key on first (as the worker's sweep would), so pruning it strands no one.
            sweep_waiting()
        before = _cutoff(at, retention) if per_workflow is None else None
        pruned = store.prune_runs(before, batch, dry_run=dry_run, condition=per_workflow)
    if settings["ACTIVITY_RETENTION"] is not None and not dry_run:
        store.prune_activity(at - settings["ACTIVITY_RETENTION"], batch)
    if not dry_run:  # flow control's idle rows: a day, or the longest rate window
        pers = [limit.per for limit in claim_limits().values() if limit.per is not None]
        store.prune_flow_rows(at - max([FLOW_ROWS_KEPT, *pers]))
    return pruned


# How long flow control's rows of an idle key are kept (store.prune_flow_rows).
FLOW_ROWS_KEPT = timedelta(days=1)


def _cutoff(at: datetime, older_than: timedelta) -> datetime:
    """When a run must have finished before to be as old as ``older_than``."""
    if not isinstance(older_than, timedelta):
        raise TypeError(
            f"older_than must be a timedelta (e.g. durable.days(30)), got {older_than!r}"
        )
    if older_than < timedelta(0):
        raise ValueError(f"older_than must not be negative, got {older_than}")
    try:
        return at - older_than
    except OverflowError:
        raise ValueError(f"older_than reaches back before year 1, got {older_than}") from None
