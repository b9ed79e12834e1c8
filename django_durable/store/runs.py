"""Leases, the fenced writes of step results, and lease recovery."""

from __future__ import annotations

import functools
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models import F
from django.db.models.signals import post_save

from django_durable.models import (
    FINISHED_STATUSES,
    Event,
    Run,
    Status,
    StepAttempt,
)
from django_durable.store.base import (
    LeaseLost,
    _attempt,
    _db,
    _field_plan,
    _owned,
    _prepared,
    notify_due,
    now,
    sql_cursor,
)
from django_durable.store.compensations import hand_back_compensating, recover_expired_compensations


def renew_lease(run: Run, lease: timedelta) -> None:
    """Extend the lease of a run this worker owns; ``LeaseLost`` if it no longer does."""
    updated = Run.objects.filter(id=run.id, fence=run.fence, status=run.status).update(
        lease_expires_at=now() + lease
    )
    if not updated:
        raise LeaseLost(run.id)


def renew_worker_leases(worker_id: str, lease: timedelta) -> int:
    return Run.objects.filter(
        worker_id=worker_id, status__in=[Status.RUNNING, Status.COMPENSATING]
    ).update(lease_expires_at=now() + lease)


def current_status(run_id: uuid.UUID) -> tuple[str, int] | None:
    row = Run.objects.filter(id=run_id).values_list("status", "fence").first()
    return tuple(row) if row else None


# --- recording steps (fenced) ---------------------------------------------------


def _state_between_steps(state: dict | None) -> dict:
    """A step that completed or failed leaves no waits behind. Events received stay
    (one per name for the whole run), and so do the children each call started, so a
    retried step finds the children that completed instead of starting them again."""
    state = state or {}
    return {name: state[name] for name in ("received", "children") if state.get(name)}


_RECORD_SQL: dict[tuple, str] = {}


@functools.cache
def _fields_of(names: tuple[str, ...]) -> list:
    return [Run._meta.get_field(name) for name in names]


def _update_owned_and_record(run: Run, changes: dict[str, Any], attempt: StepAttempt) -> bool:
    """The fenced update of a run this worker owns and, only if it still owns it, the
    insert of the attempt; False (nothing written) when the run is no longer its own.

    On PostgreSQL, for a caller in autocommit (a worker thread), this is one
    statement and one round trip, atomic on its own: the UPDATE in a CTE, the
    INSERT selecting from it. Otherwise it is the UPDATE then the INSERT in a
    transaction (a savepoint inside the caller's).
    """
    db = _db()
    if not (db.vendor == "postgresql" and db.get_autocommit()):
        with transaction.atomic():
            if not _owned(run).update(**changes):
                return False
            attempt.save(force_insert=True)
            return True
    fields = _fields_of(tuple(changes))
    params = [
        field.get_db_prep_save(value, db)
        for field, value in zip(fields, changes.values(), strict=True)
    ]
    params += [run.id, run.fence, Status.RUNNING]
    attempt_fields = [
        (field, value)
        for field, _column, _slot, value in _prepared(_field_plan(StepAttempt._meta, db), attempt)
    ]
    params += [value for _field, value in attempt_fields]
    cache_key = (tuple(changes), tuple(f.column for f, _v in attempt_fields))
    sql = _RECORD_SQL.get(cache_key)
    if sql is None:
        qn = db.ops.quote_name
        sets = ", ".join(f"{qn(f.column)} = %s" for f in fields)
        # Explicit casts: a SELECT list does not take its types from the target columns.
        values = ", ".join(f"%s::{f.db_type(db)}" for f, _v in attempt_fields)
        columns = ", ".join(qn(f.column) for f, _v in attempt_fields)
        sql = _RECORD_SQL[cache_key] = (
            f"WITH owned AS (UPDATE {qn(Run._meta.db_table)} SET {sets} WHERE {qn('id')} = %s "
            f"AND {qn('fence')} = %s AND {qn('status')} = %s RETURNING {qn('id')}) "
            f"INSERT INTO {qn(StepAttempt._meta.db_table)} ({columns}) "
            f"SELECT {values} FROM owned RETURNING {qn('id')}"
        )
    with sql_cursor(db) as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False
    attempt.id = row[0]
    attempt._state.adding = False
    attempt._state.db = DEFAULT_DB_ALIAS
    # The row was written without save(): tell post_save receivers (telemetry, the
    # project's own) as the ORM would have.
    post_save.send(
        sender=StepAttempt,
        instance=attempt,
        created=True,
        update_fields=None,
        raw=False,
        using=DEFAULT_DB_ALIAS,
    )
    return True


def record_step_completed(
    run: Run,
    step_name: str,
    started_at: datetime,
    output: Any,
    *,
    last: bool,
) -> None:
    """Record a completed step and advance the run; the last step also finishes it."""
    at = now()
    changes: dict[str, Any] = {
        "step_index": run.step_index + 1,
        "attempt": 1,
        "context": run.context,
        "waiting_for": None,
        "state": _state_between_steps(run.state),
    }
    if last:
        changes.update(
            status=Status.COMPLETED,
            result=output,
            finished_at=at,
            due_at=None,
            lease_expires_at=None,
        )
    attempt = _attempt(run, step_name, StepAttempt.Outcome.COMPLETED, started_at, output=output)
    if not _update_owned_and_record(run, changes, attempt):
        raise LeaseLost(run.id)
    for name, value in changes.items():
        setattr(run, name, value)


def record_step_failed(
    run: Run,
    step_name: str,
    started_at: datetime,
    error: dict,
    *,
    retry_at: datetime | None,
) -> None:
    """Record a failed attempt: the run is due again at ``retry_at``, or fails for good."""
    if retry_at is not None:
        changes: dict[str, Any] = {
            "status": Status.PENDING,
            "attempt": run.attempt + 1,
            "due_at": retry_at,
            "worker_id": None,
            "lease_expires_at": None,
            "state": _state_between_steps(run.state),
        }
    else:
        changes = {
            "status": Status.FAILED,
            "error": error,
            "finished_at": now(),
            "due_at": None,
            "lease_expires_at": None,
            "state": _state_between_steps(run.state),
        }
    attempt = _attempt(run, step_name, StepAttempt.Outcome.FAILED, started_at, error=error)
    if not _update_owned_and_record(run, changes, attempt):
        raise LeaseLost(run.id)
    for name, value in changes.items():
        setattr(run, name, value)


def record_run_failed(run: Run, error: dict) -> None:
    """Fail a run outside any step (its timeout passed, its definition vanished)."""
    changes = {
        "status": Status.FAILED,
        "error": error,
        "finished_at": now(),
        "due_at": None,
        "lease_expires_at": None,
    }
    if not _owned(run).update(**changes):
        raise LeaseLost(run.id)
    for name, value in changes.items():
        setattr(run, name, value)


def record_suspended(
    run: Run, step_name: str, started_at: datetime, context: dict, waits: list, wait
) -> None:
    """Suspend the run in a wait and free the worker.

    The run row is locked so that an event sent at the same moment is either
    seen here (kept, then delivered at once) or finds the run waiting.
    """
    slot = None if wait.kind in ("sleep", "children") else f"{wait.kind}:{wait.name}"
    with transaction.atomic():
        locked = _owned(run).select_for_update().only("id", "state").first()
        if locked is None:
            raise LeaseLost(run.id)
        state = dict(locked.state or {})
        state["waits"] = waits
        state["pending"] = {
            "kind": wait.kind,
            "name": wait.name,
            "timeout_value": wait.timeout_value,
        }
        received = dict(state.get("received", {}))
        kept = None
        if wait.kind == "event":
            kept = (
                Event.objects.filter(
                    run_id=run.id, kind=Event.Kind.EVENT, name=wait.name, delivered_at__isnull=True
                )
                .order_by("-id")
                .first()
            )
        if kept is not None:
            # An event sent before the run waited for it: deliver the newest now.
            received[slot] = kept.payload
            Event.objects.filter(id=kept.id).update(delivered_at=now())
            changes: dict[str, Any] = {
                "status": Status.PENDING,
                "due_at": now(),
                "waiting_for": None,
            }
        else:
            due = wait.until
            if run.timeout_at is not None and (due is None or run.timeout_at < due):
                due = run.timeout_at
            changes = {
                "status": Status.WAITING,
                "due_at": due,
                "waiting_for": slot or wait.kind,
            }
        state["received"] = received
        changes.update(state=state, context=context, worker_id=None, lease_expires_at=None)
        _owned(run).update(**changes)
        _attempt(run, step_name, StepAttempt.Outcome.SUSPENDED, started_at).save(force_insert=True)
    for name, value in changes.items():
        setattr(run, name, value)


def deliver(run_id: uuid.UUID, kind: str, name: str, payload: Any, *, keep: bool) -> str:
    """Give an event or input to a run: ``"delivered"`` when it was waiting for it,
    ``"kept"`` when it is kept for a later wait, ``"refused"`` otherwise.

    The run row is locked, so this and ``record_suspended`` never miss each other.
    """
    slot = f"{kind}:{name}"
    with transaction.atomic():
        run = (
            Run.objects.select_for_update()
            .only("id", "status", "waiting_for", "state", "queue")
            .get(id=run_id)
        )
        received = (run.state or {}).get("received", {})
        if run.status == Status.WAITING and run.waiting_for == slot and slot not in received:
            state = dict(run.state or {})
            state["received"] = {**received, slot: payload}
            Run.objects.filter(id=run_id).update(
                status=Status.PENDING, due_at=now(), waiting_for=None, state=state
            )
            Event.objects.create(
                run_id=run_id,
                kind=kind,
                name=name,
                payload=payload,
                created_at=now(),
                delivered_at=now(),
            )
            notify_due(run.queue)  # wake an idle worker for the resumed run
            return "delivered"
        if keep and run.status not in FINISHED_STATUSES:
            Event.objects.create(
                run_id=run_id, kind=kind, name=name, payload=payload, created_at=now()
            )
            return "kept"
        return "refused"


def record_attempt_cancelled(run: Run, step_name: str, started_at: datetime) -> None:
    _attempt(run, step_name, StepAttempt.Outcome.CANCELLED, started_at).save(force_insert=True)


def hand_back(run: Run) -> bool:
    """Return a claimed run to ``pending`` so another worker takes it (shutdown)."""
    if run.status == Status.COMPENSATING:
        return hand_back_compensating(run)
    return bool(
        _owned(run).update(
            status=Status.PENDING, worker_id=None, lease_expires_at=None, due_at=now()
        )
    )


# --- recovery -------------------------------------------------------------------


def recover_expired_leases() -> list[uuid.UUID]:
    """Return runs whose worker stopped heartbeating to ``pending``, counting the attempt.

    The fence grows at the next claim, so the worker that lost the run cannot
    record over its new owner even if it comes back.
    """
    at = now()
    recovered = recover_expired_compensations()
    with transaction.atomic():
        expired = list(
            Run.objects.select_for_update(skip_locked=True)
            .filter(status=Status.RUNNING, lease_expires_at__lt=at)
            .values_list("id", "step_index", "attempt", "workflow", "worker_id")[:500]
        )
        if not expired:
            return recovered
        ids = [row[0] for row in expired]
        Run.objects.filter(id__in=ids, status=Status.RUNNING).update(
            status=Status.PENDING,
            worker_id=None,
            lease_expires_at=None,
            attempt=F("attempt") + 1,
            due_at=at,
        )
        StepAttempt.objects.bulk_create(
            StepAttempt(
                run_id=run_id,
                step=f"#{step_index}",
                step_index=step_index,
                attempt=attempt,
                status=StepAttempt.Outcome.LOST,
                error={"type": "LeaseExpired", "message": f"worker {worker} stopped heartbeating"},
                worker_id=worker,
                started_at=at,
                finished_at=at,
            )
            for run_id, step_index, attempt, _workflow, worker in expired
        )
    return ids + recovered
