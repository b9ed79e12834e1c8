"""Compensating runs: the fenced writes of undo steps.

Which steps are undone, and in which order, is the caller's (runtime/compensation.py):
these functions take the run's new state as a value and write it, conditional on the
run still being this worker's (its fence) and compensating."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db.models import F

from django_durable.models import Run, Status, StepAttempt
from django_durable.store.base import (
    LeaseLost,
    announce_attempt,
    atomic,
    attempt_of,
    insert,
    now,
    owned,
)

__all__ = [
    "begin_compensating",
    "hand_back_compensating",
    "record_compensation_completed",
    "record_compensation_failed",
    "recover_expired_compensations",
]

# --- compensations --------------------------------------------------------------


def _owned_compensating(run: Run):
    return Run.objects.filter(id=run.id, fence=run.fence, status=Status.COMPENSATING)


def _compensation_attempt(run: Run, index: int, name: str, status: str, started_at, **fields):
    return StepAttempt(
        run_id=run.id,
        kind=StepAttempt.Kind.COMPENSATION,
        step=name,
        step_index=index,
        attempt=run.attempt,
        status=status,
        worker_id=run.worker_id,
        started_at=started_at,
        finished_at=now(),
        logs=run.attempt_logs,
        **fields,
    )


def begin_compensating(
    run: Run, step_name: str | None, started_at: datetime | None, error: dict, state: dict
) -> None:
    """A run that failed for good turns ``compensating``: it keeps its key and its
    worker, keeps ``error`` as the original error, and takes ``state`` (the steps to
    undo, which the caller read with ``lock_owned_state`` in its transaction and
    decided); the failed step's attempt (``step_name``) is recorded with it. In the
    caller's transaction when it has one (no savepoint of its own)."""
    with atomic(savepoint=False):
        changes: dict[str, Any] = {
            "status": Status.COMPENSATING,
            "error": error,
            "attempt": 1,
            "due_at": None,
            "waiting_for": None,
            "state": state,
        }
        if not owned(run).update(**changes):
            raise LeaseLost(run.id)
        if step_name is not None:
            attempt = attempt_of(
                run, step_name, StepAttempt.Outcome.FAILED, started_at, error=error
            )
            insert(attempt)
    for name, value in changes.items():
        setattr(run, name, value)
    if step_name is not None:
        announce_attempt(attempt)


def hand_back_compensating(run: Run) -> bool:
    """A compensating run goes back to no worker, due now, still compensating."""
    return bool(
        _owned_compensating(run).update(worker_id=None, lease_expires_at=None, due_at=now())
    )


def record_compensation_completed(
    run: Run,
    index: int,
    name: str,
    started_at: datetime,
    output: Any,
    context: dict,
    *,
    state: dict,
    last: bool,
    replaced: dict | None = None,
) -> None:
    """Record an undone step and the run's new ``state``; ``last`` (nothing left to
    undo) ends the run ``compensated``. ``replaced``: what it replaced in the context,
    kept with its attempt."""
    changes: dict[str, Any] = {"attempt": 1, "state": state, "context": context}
    if last:
        changes.update(
            status=Status.COMPENSATED, finished_at=now(), due_at=None, lease_expires_at=None
        )
    with atomic():
        if not _owned_compensating(run).update(**changes):
            raise LeaseLost(run.id)
        attempt = _compensation_attempt(
            run,
            index,
            name,
            StepAttempt.Outcome.COMPLETED,
            started_at,
            output=output,
            replaced=replaced or None,
        )
        insert(attempt)
    for field, value in changes.items():
        setattr(run, field, value)
    announce_attempt(attempt)


def record_compensation_failed(
    run: Run,
    index: int,
    name: str,
    started_at: datetime,
    error: dict,
    *,
    retry_at: datetime | None,
    run_error: dict,
) -> None:
    """Record a failed compensation attempt: due again at ``retry_at`` (still
    compensating, no worker), or the run ends ``compensation_failed`` with ``run_error``."""
    if retry_at is not None:
        changes: dict[str, Any] = {
            "attempt": run.attempt + 1,
            "due_at": retry_at,
            "worker_id": None,
            "lease_expires_at": None,
        }
    else:
        changes = {
            "status": Status.COMPENSATION_FAILED,
            "error": run_error,
            "finished_at": now(),
            "due_at": None,
            "lease_expires_at": None,
        }
    with atomic():
        if not _owned_compensating(run).update(**changes):
            raise LeaseLost(run.id)
        attempt = _compensation_attempt(
            run, index, name, StepAttempt.Outcome.FAILED, started_at, error=error
        )
        insert(attempt)
    for field, value in changes.items():
        setattr(run, field, value)
    announce_attempt(attempt)


def recover_expired_compensations(step_of: Callable[[dict], int]) -> list[uuid.UUID]:
    """Compensating runs whose worker stopped heartbeating become due again, still
    compensating (so still holding their key and refusing cancel); the lost
    attempt counts, recorded as the undo step ``step_of(state)`` says was running."""
    at = now()
    with atomic():
        expired = list(
            Run.objects.select_for_update(skip_locked=True)
            .filter(status=Status.COMPENSATING, worker_id__isnull=False, lease_expires_at__lt=at)
            .values_list("id", "attempt", "worker_id", "state")[:500]
        )
        if not expired:
            return []
        ids = [row[0] for row in expired]
        Run.objects.filter(id__in=ids, status=Status.COMPENSATING).update(
            worker_id=None, lease_expires_at=None, attempt=F("attempt") + 1, due_at=at
        )
        lost = []
        for run_id, attempt, worker, state in expired:
            index = step_of(state)
            lost.append(
                StepAttempt(
                    run_id=run_id,
                    kind=StepAttempt.Kind.COMPENSATION,
                    step=f"#{index}",
                    step_index=index,
                    attempt=attempt,
                    status=StepAttempt.Outcome.LOST,
                    error={
                        "type": "LeaseExpired",
                        "message": f"worker {worker} stopped heartbeating",
                    },
                    worker_id=worker,
                    started_at=at,
                    finished_at=at,
                )
            )
        StepAttempt.objects.bulk_create(lost)
    return ids
