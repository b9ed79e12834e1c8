"""Deleting finished runs past retention, in batches.

One node prunes at a time: each batch's transaction first takes a transaction-level
advisory lock (PostgreSQL); a prune that finds it taken stops, since another node
is pruning the same runs. Counts are what was deleted, not what was looked at, so
concurrent prunes add up to the exact total.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db.models import Exists, OuterRef, Q

from django_durable.models import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    Activity,
    Event,
    FlowRateSlot,
    FlowTurn,
    Run,
    Status,
    StepAttempt,
    Stream,
    StreamEntry,
)
from django_durable.store.base import atomic, engine, fetchone

__all__ = [
    "prunable",
    "prune_activity",
    "prune_flow_rows",
    "prune_runs",
]

# --- pruning --------------------------------------------------------------------

# The key of pruning's advisory lock (the engine's TRY_PRUNE_LOCK): "durable\0" as a
# bigint, so it does not meet a project's own locks.
PRUNE_LOCK_KEY = int.from_bytes(b"durable\x00", "big")


def prunable(before: datetime | None, condition: Q | None = None):
    """Finished top-level runs that finished before ``before`` (None: any time) and
    match ``condition`` (the per-workflow retention: operations.retention).

    A child goes with its parent, never alone, so a parent's record of its
    children stays whole. A run another run still waits behind (``run_again``)
    stays until the key has moved on to that run.
    """
    waiting_behind = Run.objects.filter(
        runs_after=OuterRef("pk"), status=Status.PENDING, holds_key=False
    )
    active_child = Run.objects.filter(parent=OuterRef("pk"), status__in=ACTIVE_STATUSES)
    runs = Run.objects.filter(status__in=FINISHED_STATUSES, parent__isnull=True)
    if before is not None:
        runs = runs.filter(finished_at__lt=before)
    if condition is not None:
        runs = runs.filter(condition)
    return runs.exclude(Exists(waiting_behind) | Exists(active_child))


def _tree_blocked(root_ids: list[uuid.UUID]) -> tuple[list[uuid.UUID], set[uuid.UUID]]:
    """Every run under ``root_ids`` (the roots included), and the roots whose tree
    holds a run that is still going or that a run waits behind."""
    root_of = {run_id: run_id for run_id in root_ids}
    level = list(root_ids)
    while level:
        rows = list(Run.objects.filter(parent_id__in=level).values_list("id", "parent_id"))
        for child_id, parent_id in rows:
            root_of[child_id] = root_of[parent_id]
        level = [child_id for child_id, _ in rows]
    ids = list(root_of)
    blocked = {
        root_of[run_id]
        for run_id in Run.objects.filter(id__in=ids, status__in=ACTIVE_STATUSES).values_list(
            "id", flat=True
        )
    }
    blocked |= {
        root_of[run_id]
        for run_id in Run.objects.filter(
            runs_after_id__in=ids, status=Status.PENDING, holds_key=False
        ).values_list("runs_after_id", flat=True)
        if run_id in root_of
    }
    return ids, blocked


def prune_runs(
    before: datetime | None, batch_size: int, *, dry_run: bool = False, condition: Q | None = None
) -> int:
    """Delete finished runs that finished before ``before`` (and match ``condition``:
    ``prunable``) with their children,
    ``batch_size`` top-level runs per short transaction, so a large table is never
    locked for long. A deleted holder's key is free again. Returns how many runs
    were (or, with ``dry_run``, would be) deleted, children included."""
    total = 0
    skipped: set[uuid.UUID] = set()
    lock = engine().TRY_PRUNE_LOCK  # None where writers take turns anyway
    while True:
        with atomic():
            if lock is not None and not fetchone(lock, [PRUNE_LOCK_KEY])[0]:
                return total  # another node is pruning
            roots = list(
                prunable(before, condition)
                .exclude(id__in=skipped)
                .order_by("finished_at")
                .values_list("id", flat=True)[:batch_size]
            )
            if not roots:
                return total
            ids, blocked = _tree_blocked(roots)
            skipped |= blocked
            roots = [run_id for run_id in roots if run_id not in blocked]
            if not roots:
                continue
            if blocked:
                ids, _ = _tree_blocked(roots)
            if dry_run:
                skipped |= set(roots)
            else:
                StepAttempt.objects.filter(run_id__in=ids).delete()
                Event.objects.filter(run_id__in=ids).delete()
                StreamEntry.objects.filter(run_id__in=ids).delete()
                Stream.objects.filter(run_id__in=ids).delete()
                # History only: a finished run that once waited behind one of these.
                Run.objects.filter(runs_after_id__in=ids).update(runs_after=None)
                _, deleted = Run.objects.filter(id__in=ids).delete()
                total += deleted.get(Run._meta.label, 0)
                continue
        total += len(ids)


def prune_activity(before: datetime, batch_size: int) -> int:
    """Delete activity older than ``before``, one short statement per batch."""
    total = 0
    while True:
        ids = list(
            Activity.objects.filter(created_at__lt=before).values_list("id", flat=True)[:batch_size]
        )
        if not ids:
            return total
        Activity.objects.filter(id__in=ids).delete()
        total += len(ids)


def prune_flow_rows(before: datetime) -> int:
    """Delete flow control's rows idle since ``before``: the turns of keys last
    claimed before it and the rate slots last begun before it (a rate slot older than
    its ``per`` is free whether its row is there or not). Rows only: nothing a
    limit counts."""
    turns, _ = FlowTurn.objects.filter(claimed_at__lt=before).delete()
    slots, _ = FlowRateSlot.objects.filter(begun_at__lt=before).delete()
    return turns + slots
