"""Recording what a step did, fenced by the claim: the run's update and the attempt's
row together, or nothing when the worker no longer owns the run (``LeaseLost``).

On PostgreSQL, for a caller in autocommit (a worker thread), each record is one
statement and one round trip, atomic on its own: the fenced UPDATE of the run in
a CTE, the INSERT of the attempt selecting from it (no row: nothing inserted).
Otherwise the same UPDATE and INSERT run through the ORM in a transaction (a
savepoint inside the caller's).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django_durable import state as run_state
from django_durable.models import Event, Run, Status, StepAttempt
from django_durable.store.base import (
    LeaseLost,
    announce_attempt,
    as_json,
    atomic,
    attempt_of,
    fetchone,
    in_autocommit,
    insert,
    is_postgres,
    now,
    owned,
    retry_deadlocks,
)

__all__ = [
    "record_attempt_cancelled",
    "record_run_failed",
    "record_step_completed",
    "record_step_failed",
    "record_suspended",
]

# The attempt's row, inserted only when ``owned`` (the fenced UPDATE before it in the
# same statement) changed the run. Casts: a SELECT list takes no types from the
# target columns.
_INSERT_ATTEMPT = """
INSERT INTO durable_step_attempt (
    run_id, kind, step, step_index, attempt, status, output, error, logs, worker_id,
    started_at, finished_at
)
SELECT owned.id, 'step', %(step)s::varchar, %(step_index)s::integer, %(attempt)s::integer,
       %(outcome)s::varchar, %(output)s::jsonb, %(error)s::jsonb, %(logs)s::jsonb,
       %(worker_id)s::varchar, %(started_at)s::timestamptz, %(finished_at)s::timestamptz
FROM owned
RETURNING id
"""

# A step completed and the run goes on to the next one (still owned, still running).
RECORD_STEP_COMPLETED = (
    """
WITH owned AS (
    UPDATE durable_run
    SET step_index = %(step_index)s + 1, attempt = 1, context = %(context)s::jsonb,
        waiting_for = NULL, state = %(state)s::jsonb
    WHERE id = %(run_id)s AND fence = %(fence)s AND status = 'running'
    RETURNING id
)"""
    + _INSERT_ATTEMPT
)

# The last step completed: the run is completed, its result is the step's output.
RECORD_LAST_STEP_COMPLETED = (
    """
WITH owned AS (
    UPDATE durable_run
    SET step_index = %(step_index)s + 1, attempt = 1, context = %(context)s::jsonb,
        waiting_for = NULL, state = %(state)s::jsonb, status = 'completed',
        result = %(output)s::jsonb, finished_at = %(finished_at)s, due_at = NULL,
        lease_expires_at = NULL
    WHERE id = %(run_id)s AND fence = %(fence)s AND status = 'running'
    RETURNING id
)"""
    + _INSERT_ATTEMPT
)

# A step failed and has attempts left: the run is pending again, due at %(due_at)s.
RECORD_STEP_RETRY = (
    """
WITH owned AS (
    UPDATE durable_run
    SET status = 'pending', attempt = %(attempt)s + 1, due_at = %(due_at)s,
        worker_id = NULL, lease_expires_at = NULL, state = %(state)s::jsonb
    WHERE id = %(run_id)s AND fence = %(fence)s AND status = 'running'
    RETURNING id
)"""
    + _INSERT_ATTEMPT
)

# A step failed for good: so does the run.
RECORD_STEP_FAILED = (
    """
WITH owned AS (
    UPDATE durable_run
    SET status = 'failed', error = %(error)s::jsonb, finished_at = %(finished_at)s,
        due_at = NULL, lease_expires_at = NULL, state = %(state)s::jsonb
    WHERE id = %(run_id)s AND fence = %(fence)s AND status = 'running'
    RETURNING id
)"""
    + _INSERT_ATTEMPT
)


# A worker's record can meet a start, cancel or promotion of the same key in a deadlock
# (the run's row against the key's unique index): PostgreSQL aborts one side, and the
# aborted record is written again, not taken for the step's failure.
@retry_deadlocks
def _record(run: Run, statement: str, changes: dict[str, Any], attempt: StepAttempt) -> None:
    """Apply ``changes`` to the owned run and insert ``attempt``, all or nothing;
    ``LeaseLost`` (nothing written) when the run is no longer this worker's."""
    if is_postgres() and in_autocommit():
        params = {
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
        }
        row = fetchone(statement, params)
        if row is None:
            raise LeaseLost(run.id)
        attempt.id = row[0]
        attempt._state.adding = False
        attempt._state.db = run._state.db
    else:
        with atomic():
            if not owned(run).update(**changes):
                raise LeaseLost(run.id)
            insert(attempt)
    for name, value in changes.items():
        setattr(run, name, value)
    announce_attempt(attempt)


def record_step_completed(
    run: Run, step_name: str, started_at: datetime, output: Any, *, last: bool
) -> None:
    """Record a completed step and advance the run; the last step also finishes it."""
    attempt = attempt_of(run, step_name, StepAttempt.Outcome.COMPLETED, started_at, output=output)
    changes: dict[str, Any] = {
        "step_index": run.step_index + 1,
        "attempt": 1,
        "context": run.context,
        "waiting_for": None,
        "state": run_state.between_steps(run.state),
    }
    if last:
        changes.update(
            status=Status.COMPLETED,
            result=output,
            finished_at=attempt.finished_at,
            due_at=None,
            lease_expires_at=None,
        )
    statement = RECORD_LAST_STEP_COMPLETED if last else RECORD_STEP_COMPLETED
    _record(run, statement, changes, attempt)


def record_step_failed(
    run: Run, step_name: str, started_at: datetime, error: dict, *, retry_at: datetime | None
) -> None:
    """Record a failed attempt: the run is due again at ``retry_at``, or fails for good."""
    attempt = attempt_of(run, step_name, StepAttempt.Outcome.FAILED, started_at, error=error)
    if retry_at is not None:
        changes: dict[str, Any] = {
            "status": Status.PENDING,
            "attempt": run.attempt + 1,
            "due_at": retry_at,
            "worker_id": None,
            "lease_expires_at": None,
            "state": run_state.between_steps(run.state),
        }
        _record(run, RECORD_STEP_RETRY, changes, attempt)
    else:
        changes = {
            "status": Status.FAILED,
            "error": error,
            "finished_at": attempt.finished_at,
            "due_at": None,
            "lease_expires_at": None,
            "state": run_state.between_steps(run.state),
        }
        _record(run, RECORD_STEP_FAILED, changes, attempt)


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


@retry_deadlocks
def record_suspended(
    run: Run, step_name: str, started_at: datetime, context: dict, waits: list, wait
) -> None:
    """Suspend the run in a wait and free the worker.

    The run row is locked so that an event sent at the same moment is either
    seen here (kept, then delivered at once) or finds the run waiting. Kept
    events answer the wait: the newest of each name it waits for (``wait_for_any``:
    the newest of them all). When they are all it needs, the run is due at once.
    """
    at = now()
    with atomic():
        locked = owned(run).select_for_update().only("id", "state").first()
        if locked is None:
            raise LeaseLost(run.id)
        kept = _kept_events(run, wait, run_state.received(locked.state))
        state = run_state.suspended(
            locked.state, waits, wait, {slot: e.payload for slot, e in kept.items()}, at
        )
        if kept:
            # Events sent before the run waited for them: delivered now.
            Event.objects.filter(id__in=[e.id for e in kept.values()]).update(delivered_at=at)
        if run_state.satisfied(state):
            changes: dict[str, Any] = {"status": Status.PENDING, "due_at": at, "waiting_for": None}
        else:
            due = wait.until
            if run.timeout_at is not None and (due is None or run.timeout_at < due):
                due = run.timeout_at
            label = run_state.waiting_label(state)
            changes = {"status": Status.WAITING, "due_at": due, "waiting_for": label}
        changes.update(state=state, context=context, worker_id=None, lease_expires_at=None)
        owned(run).update(**changes)
        attempt = attempt_of(run, step_name, StepAttempt.Outcome.SUSPENDED, started_at)
        insert(attempt)
    for name, value in changes.items():
        setattr(run, name, value)
    announce_attempt(attempt)


def _kept_events(run: Run, wait, got: dict) -> dict[str, Event]:
    """The kept (``buffer=True``) events that answer ``wait``, by slot: the newest per
    name, one query per name not yet received (a wait names a few events)."""
    if wait.kind == "event":
        names = [wait.name]
    elif wait.kind in ("any", "all"):
        names = list(wait.names)
    else:
        return {}
    found: dict[str, Event] = {}
    for name in names:
        slot = run_state.event_slot("event", name)
        if slot in got:
            continue
        event = (
            Event.objects.filter(
                run_id=run.id, kind=Event.Kind.EVENT, name=name, delivered_at__isnull=True
            )
            .order_by("-id")
            .only("id", "payload")
            .first()
        )
        if event is not None:
            found[slot] = event
    if wait.kind == "any" and len(found) > 1:
        newest = max(found, key=lambda slot: found[slot].id)
        found = {newest: found[newest]}
    return found


def record_attempt_cancelled(run: Run, step_name: str, started_at: datetime) -> None:
    attempt = attempt_of(run, step_name, StepAttempt.Outcome.CANCELLED, started_at)
    insert(attempt)
    announce_attempt(attempt)
