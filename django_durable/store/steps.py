"""Recording what a step did, fenced by the claim: the run's update and the attempt's
row together, or nothing when the worker no longer owns the run (``LeaseLost``).

On PostgreSQL, for a caller in autocommit (a worker thread), each record is one
statement and one round trip, atomic on its own: a call of the function
durable_record_step, which makes the fenced UPDATE of the run and, only if it
changed the run, inserts the attempt. Otherwise the same UPDATE and INSERT run
through the ORM in a transaction (a savepoint inside the caller's).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django_durable.models import Event, Run, Status, StepAttempt
from django_durable.store.base import (
    LeaseLost,
    announce_attempt,
    as_json,
    atomic,
    attempt_of,
    db,
    engine,
    fetchall,
    fetchone,
    in_autocommit,
    insert,
    now,
    owned,
    retry_deadlocks,
)

__all__ = [
    "Completion",
    "completed_attempt",
    "record_attempt_cancelled",
    "record_completion",
    "record_last_steps",
    "record_run_failed",
    "record_step_completed",
    "record_step_failed",
    "record_suspension",
    "kept_event",
]


# A worker's record can meet a start, cancel or promotion of the same key in a deadlock
# (the run's row against the key's unique index): PostgreSQL aborts one side, and the
# aborted record is written again, not taken for the step's failure.
@retry_deadlocks
def _record(run: Run, change: str, changes: dict[str, Any], attempt: StepAttempt) -> None:
    """Apply ``changes`` to the owned run and insert ``attempt``, all or nothing;
    ``LeaseLost`` (nothing written) when the run is no longer this worker's. In
    autocommit, where the engine has RECORD_STEP (PostgreSQL): durable_record_step
    with ``change`` (which of its updates: it makes the same ``changes``)."""
    connection = db()
    statement = engine(connection).RECORD_STEP
    if statement is not None and in_autocommit(connection):
        params = {
            "change": change,
            "run_id": run.id,
            "fence": run.fence,
            "step_index": run.step_index,
            "context": as_json(changes.get("context", run.context)),
            "state": as_json(changes.get("state")),
            "due_at": changes.get("due_at"),
            "step": attempt.step,
            "attempt": attempt.attempt,
            "outcome": attempt.status,
            "output": as_json(attempt.output),
            "error": as_json(attempt.error),
            "logs": as_json(attempt.logs),
            "worker_id": attempt.worker_id,
            "started_at": attempt.started_at,
            "finished_at": attempt.finished_at,
            "replaced": as_json(attempt.replaced),
        }
        (recorded,) = fetchone(statement, params, connection)
        if recorded is None:
            raise LeaseLost(run.id)
    else:
        with atomic():
            if not owned(run).update(**changes):
                raise LeaseLost(run.id)
            insert(attempt)
        recorded = attempt.id
    _recorded(run, changes, attempt, recorded)


class Completion(NamedTuple):
    """A run whose last step completed, waiting to be recorded (``record_last_steps``):
    its attempt's row (``attempt_of``, built when the step ended), its output, and the
    state the run keeps (the caller's: what a step's end leaves of it)."""

    run: Run
    attempt: StepAttempt
    output: Any
    state: dict


def _next_step_changes(run: Run, state: dict) -> dict[str, Any]:
    """A completed step's changes: the run moves on to its next step, with ``state``."""
    return {
        "step_index": run.step_index + 1,
        "attempt": 1,
        "context": run.context,
        "waiting_for": None,
        "state": state,
    }


def _last_step_changes(run: Run, attempt: StepAttempt, output: Any, state: dict) -> dict[str, Any]:
    """A completed last step's changes: past the last step, and the run completed."""
    return {
        **_next_step_changes(run, state),
        "status": Status.COMPLETED,
        "result": output,
        "finished_at": attempt.finished_at,
        "due_at": None,
        "lease_expires_at": None,
    }


@retry_deadlocks
def record_last_steps(completions: Sequence[Completion]) -> list[Run]:
    """Record several completed last steps in one statement (PostgreSQL, autocommit):
    each run is completed and its attempt recorded, all of them or none. Returns the
    runs completed; the others are no longer this worker's (nothing written for them,
    as ``LeaseLost`` says of one)."""
    rows = [(c, _last_step_changes(c.run, c.attempt, c.output, c.state)) for c in completions]
    params = {
        "run_ids": [c.run.id for c, _ in rows],
        "fences": [c.run.fence for c, _ in rows],
        "step_indexes": [c.run.step_index for c, _ in rows],
        "contexts": [as_json(changes["context"]) for _, changes in rows],
        "states": [as_json(changes["state"]) for _, changes in rows],
        "outputs": [as_json(c.output) for c, _ in rows],
        "steps": [c.attempt.step for c, _ in rows],
        "attempts": [c.attempt.attempt for c, _ in rows],
        "logs": [as_json(c.attempt.logs) for c, _ in rows],
        "worker_ids": [c.attempt.worker_id for c, _ in rows],
        "started_ats": [c.attempt.started_at for c, _ in rows],
        "finished_ats": [c.attempt.finished_at for c, _ in rows],
        "replaced": [as_json(c.attempt.replaced) for c, _ in rows],
    }
    recorded: dict[uuid.UUID, int] = dict(fetchall(engine().RECORD_LAST_STEPS, params))
    completed = []
    for completion, changes in rows:
        attempt_id = recorded.get(completion.run.id)
        if attempt_id is None:
            continue
        _recorded(completion.run, changes, completion.attempt, attempt_id)
        completed.append(completion.run)
    return completed


def _recorded(run: Run, changes: dict[str, Any], attempt: StepAttempt, attempt_id: int) -> None:
    """What a record wrote, on the objects: the run's changes, the attempt's id."""
    attempt.id = attempt_id
    attempt._state.adding = False
    attempt._state.db = run._state.db
    for name, value in changes.items():
        setattr(run, name, value)
    announce_attempt(attempt)


def record_step_completed(
    run: Run,
    step_name: str,
    started_at: datetime,
    output: Any,
    *,
    last: bool,
    state: dict,
    replaced: dict | None = None,
) -> None:
    """Record a completed step and advance the run, with ``state`` (what the step's
    end leaves of it: the caller's) and, in its attempt, ``replaced`` (what it replaced
    in the context); the last step also finishes it."""
    attempt = completed_attempt(run, step_name, started_at, output, replaced)
    if last:
        record_completion(Completion(run, attempt, output, state))
        return
    _record(run, "next", _next_step_changes(run, state), attempt)


def record_completion(completion: Completion) -> None:
    """Record one completed last step (``record_step_completed`` with ``last``) from
    the attempt built when it ended; ``LeaseLost`` as there."""
    run, attempt, output, state = completion
    _record(run, "last", _last_step_changes(run, attempt, output, state), attempt)


def completed_attempt(
    run: Run, step_name: str, started_at: datetime, output: Any, replaced: dict | None = None
) -> StepAttempt:
    """The row of the current step's completed attempt, finished now, with what it
    replaced in the context (none: null)."""
    return attempt_of(
        run,
        step_name,
        StepAttempt.Outcome.COMPLETED,
        started_at,
        output=output,
        replaced=replaced or None,
    )


def record_step_failed(
    run: Run,
    step_name: str,
    started_at: datetime,
    error: dict,
    *,
    retry_at: datetime | None,
    state: dict,
) -> None:
    """Record a failed attempt: the run is due again at ``retry_at``, or fails for good;
    either way with ``state`` (what the step's end leaves of it: the caller's)."""
    attempt = attempt_of(run, step_name, StepAttempt.Outcome.FAILED, started_at, error=error)
    if retry_at is not None:
        changes: dict[str, Any] = {
            "status": Status.PENDING,
            "attempt": run.attempt + 1,
            "due_at": retry_at,
            "worker_id": None,
            "lease_expires_at": None,
            "state": state,
        }
        _record(run, "retry", changes, attempt)
    else:
        changes = {
            "status": Status.FAILED,
            "error": error,
            "finished_at": attempt.finished_at,
            "due_at": None,
            "lease_expires_at": None,
            "state": state,
        }
        _record(run, "failed", changes, attempt)


@retry_deadlocks
def record_run_failed(run: Run, error: dict) -> None:
    """Fail a run outside any step (its timeout passed, its definition vanished)."""
    changes = {
        "status": Status.FAILED,
        "error": error,
        "finished_at": now(),
        "due_at": None,
        "lease_expires_at": None,
    }
    if not owned(run).update(**changes):
        raise LeaseLost(run.id)
    for name, value in changes.items():
        setattr(run, name, value)


def kept_event(run_id: uuid.UUID, name: str) -> tuple[int, Any] | None:
    """``(id, payload)`` of the newest kept (``buffer=True``), undelivered event
    ``name`` of the run, or None: one query, through the events' (run, kind, name)
    index."""
    return (
        Event.objects.filter(
            run_id=run_id, kind=Event.Kind.EVENT, name=name, delivered_at__isnull=True
        )
        .order_by("-id")
        .values_list("id", "payload")
        .first()
    )


def record_suspension(
    run: Run,
    step_name: str,
    started_at: datetime,
    *,
    status: str,
    due_at: datetime | None,
    waiting_for: str | None,
    state: dict,
    context: dict,
    delivered: Sequence[int],
    at: datetime,
) -> None:
    """Write a suspension the caller decided, in its transaction after
    ``lock_owned_state`` (so a delivery at the same moment and this never miss each
    other): the kept events it ``delivered`` now, the run waiting (``status``
    ``waiting``, due at ``due_at`` for its timeout) or due again at once (``pending``:
    kept events answered the wait), its ``state`` and ``context``, no worker; and the
    step's suspended attempt. Fenced by the claim: ``LeaseLost`` when the run is no
    longer this worker's."""
    changes: dict[str, Any] = {
        "status": status,
        "due_at": due_at,
        "waiting_for": waiting_for,
        "state": state,
        "context": context,
        "worker_id": None,
        "lease_expires_at": None,
    }
    with atomic(savepoint=False):
        if delivered:
            Event.objects.filter(id__in=list(delivered)).update(delivered_at=at)
        if not owned(run).update(**changes):
            raise LeaseLost(run.id)
        attempt = attempt_of(run, step_name, StepAttempt.Outcome.SUSPENDED, started_at)
        insert(attempt)
    for name, value in changes.items():
        setattr(run, name, value)
    announce_attempt(attempt)


def record_attempt_cancelled(run: Run, step_name: str, started_at: datetime) -> None:
    attempt = attempt_of(run, step_name, StepAttempt.Outcome.CANCELLED, started_at)
    insert(attempt)
    announce_attempt(attempt)
