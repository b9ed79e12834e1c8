"""The public operations: start (in ``starting``), retry, release_key, cancel,
send_event (rerun: ``operations.rerun``).

Each one validates its arguments before anything is written, asks ``keys`` what
the rules say, makes its writes through ``store`` in one short transaction (a
savepoint inside the caller's), and announces what happened with activity rows
and signals sent after commit.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db.models import QuerySet

from django_durable import signals, store, telemetry
from django_durable.exceptions import (
    AlreadyFinished,
    KeyContended,
    KeyTaken,
    NoKey,
    NotCancellable,
    NotFailed,
    NotFinished,
    NotWaiting,
)
from django_durable.models import (
    ACTIVE_STATUSES,
    FINISHED_STATUSES,
    Activity,
    Event,
    Run,
    Status,
)
from django_durable.operations import deliveries, inputs, keys
from django_durable.operations import state as run_state
from django_durable.operations.calls import public_call
from django_durable.operations.finish import (
    run_finished,
    workflow_class,
)
from django_durable.operations.start import MAX_CHANGES_OF_HANDS
from django_durable.workflows.definition import Workflow, registry

logger = logging.getLogger("django_durable.operations.runs")

# --- acting on runs -------------------------------------------------------------


@public_call("aget_run")
def get_run(run_id: uuid.UUID | str) -> Run:
    """The run with ``run_id``; ``Run.DoesNotExist`` if there is none."""
    return Run.objects.get(id=run_id)


def list_executions(
    key: str | None = None, workflow: str | type[Workflow] | None = None, status: str | None = None
) -> QuerySet[Run]:
    """Runs, newest first, filtered by key, workflow and status; each has ``holds_key``."""
    runs = Run.objects.all()
    if key is not None:
        runs = runs.filter(key=key)
    if workflow is not None:
        runs = runs.filter(workflow=workflow if isinstance(workflow, str) else workflow.name)
    if status is not None:
        runs = runs.filter(status=status)
    return runs.order_by("-created_at", "-id")


@public_call("aretry")
@store.retry_deadlocks
def retry(run_id: uuid.UUID | str) -> uuid.UUID:
    """Resume a failed run at the step that failed, taking its key back if it may.

    The run gets a fresh deadline when its workflow has a ``timeout`` (a run that
    failed by its timeout would fail again at once otherwise), a fresh attempt
    count, a fresh count of lost workers (``MAX_RECOVERIES``) and no error. A wait
    that timed out is waited for again, its own timeout counted afresh
    (``state.retried``): a retried run never completes with a timed-out wait's value.
    """
    with store.atomic():
        run = store.lock_run(run_id)
        if run.status != Status.FAILED:
            raise NotFailed(f"run {run.id} is {run.status}; only a failed run can be retried")
        if run.key is not None and not run.holds_key:
            _retake_key(run)
        workflow = workflow_class(run.workflow)
        store.resume_failed(
            run.id,
            timeout=workflow.timeout if workflow else None,
            state=run_state.retried(run.state, store.now()),
        )
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


@public_call("arelease_key")
@store.retry_deadlocks
def release_key(run_id: uuid.UUID | str, by: str | None = None) -> None:
    """Let a finished run's key go, so the next start may take it (even under ``never``).

    ``by`` (who released it, kept in the activity): ``None`` or a string of at most
    200 characters; ``ValueError`` otherwise, before anything is written."""
    by = inputs.validate_by(by)
    with store.atomic():
        run = store.lock_run(run_id)
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
        store.send_after_commit(
            signals.key_release,
            workflow_class(run.workflow),
            run_id=run.id,
            workflow=run.workflow,
            key=run.key,
            by=by,
        )


@public_call("acancel")
@store.retry_deadlocks
def cancel(run_id: uuid.UUID | str, reason: str | None = None) -> None:
    """Cancel a run that is still going. A running step stops at its next heartbeat;
    no later step runs; compensations don't run. The run keeps its key."""
    run = Run.objects.get(id=run_id)
    if run.status in FINISHED_STATUSES:
        raise AlreadyFinished(f"run {run.id} already finished ({run.status})")
    if run.status == Status.COMPENSATING:
        raise NotCancellable(f"run {run.id} is compensating and cannot be cancelled")
    error = {"type": "Cancelled", "message": reason or "cancelled", "reason": reason}
    with store.atomic():
        if run.key is not None and not run.holds_key:
            # The store's lock order: the key's holder before the run waiting behind it
            # (the finish below locks both; a finish of the holder locks them so too).
            store.get_holder(run.workflow, run.key, lock=True)
        if not store.cancel_run(run.id, error):
            current = Run.objects.get(id=run.id)
            if current.status == Status.COMPENSATING:
                raise NotCancellable(f"run {run.id} is compensating and cannot be cancelled")
            raise AlreadyFinished(f"run {run.id} already finished ({current.status})")
        run.refresh_from_db()
        # Inside the cancel's transaction: it commits with everything it sets off
        # (descendants cancelled, the waiting run promoted), or not at all.
        run_finished(run)
    logger.info(
        "run %s (%s) cancelled: %s",
        run.id,
        run.workflow,
        reason or "no reason given",
        extra=telemetry.log_fields(run),
    )


@public_call("asend_event")
def send_event(
    run_id: uuid.UUID | str, name: str, payload: Any = None, buffer: bool = False
) -> None:
    """Send event ``name`` to a run. It must be waiting for it (``wait_for_event``, or
    ``wait_for_any`` / ``wait_for_all`` naming it), unless ``buffer=True`` keeps the
    event until the run waits for it."""
    _send(run_id, Event.Kind.EVENT, name, payload, keep=buffer)


@public_call("aprovide_input")
def provide_input(run_id: uuid.UUID | str, name: str, value: Any) -> None:
    """Give a run waiting in ``ctx.wait_for_input(name)`` its value.

    ``NotWaiting`` unless the run waits for that input now; ``ValueError`` for a
    value that does not fit the input's ``kind`` (``workflows.input_kinds``), and
    then nothing is written: the run still waits."""
    _send(run_id, Event.Kind.INPUT, name, value, keep=False, check=inputs.check_answer)


def _send(run_id, kind: str, name: str, payload: Any, *, keep: bool, check=None) -> None:
    name = inputs.validate_name(name, kind)
    payload = inputs.validate_payload(payload, f"the {kind} payload")
    outcome = store.retry_deadlocks(deliveries.deliver)(
        run_id, kind, name, payload, keep=keep, check=check
    )
    if outcome == "refused":
        raise NotWaiting(f"run {run_id} is not waiting for {kind} {name!r}")
