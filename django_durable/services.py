"""The public operations: start (in ``starting``), retry, rerun, release_key, cancel,
send_event.

Each one validates its arguments before anything is written, asks ``keys`` what
the rules say, makes its writes through ``store`` in one short transaction (a
savepoint inside the caller's), and announces what happened with activity rows
and signals sent after commit.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

from django.db import transaction

from . import conf, keys, signals, store
from .definition import Workflow, registry
from .exceptions import (
    AlreadyFinished,
    KeyContended,
    KeyTaken,
    NoKey,
    NotCancellable,
    NotFailed,
    NotFinished,
    NotWaiting,
)
from .lifecycle import (
    run_finished,
    send_after_commit,
    sweep_waiting,
    workflow_class,
)
from .models import ACTIVE_STATUSES, FINISHED_STATUSES, Activity, Event, Run, Status
from .starting import (  # noqa: F401 - start() and friends are services too
    MAX_CHANGES_OF_HANDS,
    StartResult,
    _cancel_children,
    _validate_input,
    start,
    start_detailed,
    start_run,
)

# --- acting on runs -------------------------------------------------------------


def get_run(run_id: uuid.UUID | str) -> Run:
    """The run with ``run_id``; ``Run.DoesNotExist`` if there is none."""
    return Run.objects.get(id=run_id)


def list_executions(
    key: str | None = None, workflow: str | type[Workflow] | None = None, status: str | None = None
):
    """Runs, newest first, filtered by key, workflow and status; each has ``holds_key``."""
    runs = Run.objects.all()
    if key is not None:
        runs = runs.filter(key=key)
    if workflow is not None:
        runs = runs.filter(workflow=workflow if isinstance(workflow, str) else workflow.name)
    if status is not None:
        runs = runs.filter(status=status)
    return runs.order_by("-created_at", "-id")


def retry(run_id: uuid.UUID | str) -> uuid.UUID:
    """Resume a failed run at the step that failed, taking its key back if it may."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(id=run_id)
        if run.status != Status.FAILED:
            raise NotFailed(f"run {run.id} is {run.status}; only a failed run can be retried")
        if run.key is not None and not run.holds_key:
            _retake_key(run)
        store.resume_failed(run.id)
        store.notify_due(run.queue)
    return run.id


def _retake_key(run: Run) -> None:
    workflow = registry.get(run.workflow)
    for _ in range(MAX_CHANGES_OF_HANDS):
        holder = store.get_holder(run.workflow, run.key)
        if holder is not None:
            if not keys.retake_allowed(workflow.reuse, holder.status):
                raise KeyTaken(holder.id, f"key {run.key!r} is held by run {holder.id}")
            if not store.release_key(holder.id, statuses=[holder.status]):
                continue
        if store.take_key(run.id):
            store.record_activity(
                Activity.Kind.KEY_RETAKEN,
                run_id=run.id,
                workflow=run.workflow,
                key=run.key,
                details={"from_run_id": str(holder.id) if holder else None},
            )
            return
    raise KeyContended(f"key {run.key!r} of {run.workflow} changed hands during the retry")


def rerun(run_id: uuid.UUID | str) -> uuid.UUID:
    """Start a fresh copy of a finished run: same workflow, input and key."""
    run = Run.objects.get(id=run_id)
    if run.status not in FINISHED_STATUSES:
        raise NotFinished(f"run {run.id} is {run.status}; rerun takes a finished run")
    workflow = registry.get(run.workflow)
    return start_run(workflow, run.input, run.key, "error").run_id


def release_key(run_id: uuid.UUID | str, by: str | None = None) -> None:
    """Let a finished run's key go, so the next start may take it (even under ``never``)."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(id=run_id)
        if run.status in ACTIVE_STATUSES:
            raise NotFinished(f"run {run.id} is {run.status}; cancel it before releasing its key")
        if not run.holds_key:
            raise NoKey(f"run {run.id} holds no key")
        store.release_key(run.id, statuses=[run.status])
        store.record_activity(
            Activity.Kind.KEY_RELEASED,
            run_id=run.id,
            workflow=run.workflow,
            key=run.key,
            details={"by": by},
        )
        send_after_commit(
            signals.key_release,
            workflow_class(run.workflow),
            run_id=run.id,
            workflow=run.workflow,
            key=run.key,
            by=by,
        )


def cancel(run_id: uuid.UUID | str, reason: str | None = None) -> None:
    """Cancel a run that is still going. A running step stops at its next heartbeat;
    no later step runs; compensations don't run. The run keeps its key."""
    run = Run.objects.get(id=run_id)
    if run.status in FINISHED_STATUSES:
        raise AlreadyFinished(f"run {run.id} already finished ({run.status})")
    if run.status == Status.COMPENSATING:
        raise NotCancellable(f"run {run.id} is compensating and cannot be cancelled")
    error = {"type": "Cancelled", "message": reason or "cancelled", "reason": reason}
    with transaction.atomic():
        if not store.cancel_run(run.id, error):
            current = Run.objects.get(id=run.id)
            if current.status == Status.COMPENSATING:
                raise NotCancellable(f"run {run.id} is compensating and cannot be cancelled")
            raise AlreadyFinished(f"run {run.id} already finished ({current.status})")
        _cancel_children(run.id)
    run.refresh_from_db()
    run_finished(run)


def send_event(
    run_id: uuid.UUID | str, name: str, payload: Any = None, buffer: bool = False
) -> None:
    """Send event ``name`` to a run. It must be waiting for it, unless ``buffer=True``
    keeps the event until the run waits for it."""
    _send(run_id, Event.Kind.EVENT, name, payload, keep=buffer)


def provide_input(run_id: uuid.UUID | str, name: str, value: Any) -> None:
    """Give a run waiting in ``ctx.wait_for_input(name)`` its value."""
    _send(run_id, Event.Kind.INPUT, name, value, keep=False)


def _send(run_id, kind: str, name: str, payload: Any, *, keep: bool) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} names are non-empty strings, got {name!r}")
    try:
        payload = json.loads(json.dumps(payload, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the {kind} payload must be JSON-serialisable: {exc}") from None
    outcome = store.deliver(run_id, kind, name, payload, keep=keep)
    if outcome == "refused":
        raise NotWaiting(f"run {run_id} is not waiting for {kind} {name!r}")


def prunable_runs(older_than: timedelta | None = None):
    """The finished top-level runs past retention (``prune`` also skips those with
    a descendant still going; it deletes children with their parent)."""
    retention = older_than if older_than is not None else conf.get("RUN_RETENTION")
    if retention is None:
        return Run.objects.none()
    return store.prunable(store.now() - retention)


def prune(older_than: timedelta | None = None, *, dry_run: bool = False) -> int:
    """Delete finished runs past retention (freeing their keys) and old activity.

    Returns how many runs were deleted, children (deleted with their parent) included.
    ``older_than`` overrides ``DURABLE["RUN_RETENTION"]``; a run that is still
    going is never deleted, nor one a ``run_again`` run still waits behind.
    ``dry_run`` counts and deletes nothing. Deletes in batches of
    ``DURABLE["PRUNE_BATCH_SIZE"]``, one short transaction each.
    """
    settings = conf.durable_settings()
    retention = older_than if older_than is not None else settings["RUN_RETENTION"]
    batch = settings["PRUNE_BATCH_SIZE"]
    at = store.now()
    pruned = 0
    if retention is not None:
        if not dry_run:
            # A finished holder that a run_again run still waits behind hands its
            # key on first (as the worker's sweep would), so pruning it strands no one.
            sweep_waiting()
        pruned = store.prune_runs(at - retention, batch, dry_run=dry_run)
    if settings["ACTIVITY_RETENTION"] is not None and not dry_run:
        store.prune_activity(at - settings["ACTIVITY_RETENTION"], batch)
    return pruned
