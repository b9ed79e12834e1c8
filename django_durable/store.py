"""The one module that talks SQL: inserts that respect keys, row locks, claims,
fenced writes of step results, recovery and pruning.

Everything here is a short statement or a short transaction. No row lock is
held while user code runs: a claim commits before the first step starts, and
every later write of the claiming worker is fenced (``fence`` must still be the
value the claim set, and the run must still be running).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, models, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.db.models.signals import post_save
from django.utils import timezone

from . import conf
from .models import (
    ACTIVE_STATUSES,
    CLAIMABLE_STATUSES,
    FINISHED_STATUSES,
    Activity,
    Event,
    Run,
    Schedule,
    Status,
    StepAttempt,
    WorkerNode,
)


class LeaseLost(Exception):
    """This worker no longer owns the run (cancelled, recovered elsewhere, finished)."""


def now() -> datetime:
    return timezone.now()


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def _qn(name: str) -> str:
    return connection.ops.quote_name(name)


# --- starting -----------------------------------------------------------------


def in_autocommit() -> bool:
    """True when the caller has no transaction open: one statement is then atomic alone."""
    return connection.get_autocommit()


def _db():
    """The default connection itself: cheaper to use than the ``connection`` proxy."""
    return connections[DEFAULT_DB_ALIAS]


_INSERT_SQL: dict[tuple, str] = {}
_PLAIN_FIELDS = (
    models.CharField,
    models.BooleanField,
    models.IntegerField,
    models.PositiveIntegerField,
    models.BigIntegerField,
    models.BigAutoField,
)
_FIELD_PLANS: dict[tuple, list] = {}


def _field_plan(meta, db) -> list[tuple[Any, str, str, bool]]:
    """Per model: (field, attname, column, plain) where ``plain`` fields are sent as they
    are (their ``get_db_prep_save`` returns a valid value unchanged). No field here
    has a ``pre_save`` that fills a None (no ``auto_now``), so None stays NULL."""
    cache_key = (db.vendor, meta.label)
    plan = _FIELD_PLANS.get(cache_key)
    if plan is None:
        native_uuid = db.features.has_native_uuid_field
        plan = _FIELD_PLANS[cache_key] = [
            (
                field,
                field.attname,
                field.column,
                type(field) in _PLAIN_FIELDS or (type(field) is models.UUIDField and native_uuid),
            )
            for field in meta.concrete_fields
        ]
    return plan


def _insert_statement(obj, *, on_conflict: str = "") -> tuple[str, list]:
    """A single-row INSERT of a model instance, prepared without the ORM's save().

    NULL columns are left out (no column has a database default, so that is the
    same row); the SQL is built once per model and set of columns, so the
    statement text repeats and PostgreSQL can keep a plan for it.
    """
    db = _db()
    meta = type(obj)._meta
    columns: list[str] = []
    values: list[Any] = []
    for field, attname, column, plain in _field_plan(meta, db):
        value = getattr(obj, attname)
        if value is not None and not plain:
            value = field.get_db_prep_save(field.pre_save(obj, True), db)
        if value is not None:
            columns.append(column)
            values.append(value)
    cache_key = (db.vendor, meta.db_table, tuple(columns), on_conflict)
    sql = _INSERT_SQL.get(cache_key)
    if sql is None:
        qn = db.ops.quote_name
        sql = _INSERT_SQL[cache_key] = (
            f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(c) for c in columns)}) "
            f"VALUES ({', '.join(['%s'] * len(columns))}){on_conflict}"
        )
    return sql, values


def _inserted(run: Run) -> None:
    run._state.adding = False
    run._state.db = DEFAULT_DB_ALIAS


def insert_run(run: Run) -> bool:
    """Insert ``run`` unless that breaks a key constraint; return whether it was inserted.

    ``ON CONFLICT DO NOTHING`` makes a taken key an answer, not an error: the
    statement never aborts the caller's transaction. On PostgreSQL, an insert
    that meets another transaction's uncommitted insert of the same key waits
    for it to commit (then does nothing) or roll back (then inserts).
    """
    sql, values = _insert_statement(run, on_conflict=" ON CONFLICT DO NOTHING")
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {_qn('id')}", values)
        inserted = cursor.fetchone() is not None
    if inserted:
        _inserted(run)
    return inserted


def insert_or_get_holder(run: Run) -> tuple[bool, Run | None]:
    """Insert ``run`` like ``insert_run``; if its key is taken, also return the holder.

    On PostgreSQL this is one round trip: the INSERT, the NOTIFY that wakes an
    idle worker (when the new run is due now; delivered at commit) and, when
    the key is taken, the holder's row, in one statement. The holder is read
    with the statement's snapshot, so a holder that committed while the INSERT
    waited on it is not seen: the caller then asks ``get_holder``, as before.
    Elsewhere it is ``insert_run`` then ``get_holder`` (and no NOTIFY exists).
    Returns ``(inserted, holder)``; ``holder`` is None when inserted.
    """
    if not is_postgres():
        if insert_run(run):
            return True, None
        return False, get_holder(run.workflow, run.key) if run.key is not None else None
    sql, values = _insert_statement(run, on_conflict=" ON CONFLICT DO NOTHING")
    notify = run.due_at is not None and run.due_at <= now()
    statement = _INSERT_OR_HOLDER_SQL.get((sql, notify))
    if statement is None:
        table = _qn(Run._meta.db_table)
        holder_columns = ", ".join(f"h.{_qn(c)}" for c in _HOLDER_COLUMNS)
        nulls = ", ".join(["NULL"] * (len(_HOLDER_COLUMNS) - 1))
        notify_sql = "pg_notify(%s, %s)::text IS NULL" if notify else "false"
        statement = _INSERT_OR_HOLDER_SQL[(sql, notify)] = (
            f"WITH new AS ({sql} RETURNING {_qn('id')}) "
            f"SELECT true, {notify_sql}, new.{_qn('id')}, {nulls} FROM new "
            f"UNION ALL SELECT false, false, {holder_columns} FROM {table} h "
            f"WHERE h.{_qn('workflow')} = %s AND h.{_qn('key')} = %s AND h.{_qn('holds_key')} "
            "AND NOT EXISTS (SELECT 1 FROM new)"
        )
    params = [*values]
    if notify:
        params += [conf.get("NOTIFY_CHANNEL"), run.queue]
    params += [run.workflow, run.key]
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    if row is None:
        return False, None
    if row[0]:
        _inserted(run)
        return True, None
    holder = Run.from_db(DEFAULT_DB_ALIAS, _HOLDER_COLUMNS, _decode_holder(row[2:]))
    return False, holder


_INSERT_OR_HOLDER_SQL: dict[tuple[str, bool], str] = {}


def _decode_holder(values: Sequence[Any]) -> list[Any]:
    """The JSON ``input`` column arrives as text (Django loads jsonb itself)."""
    values = list(values)
    index = _HOLDER_COLUMNS.index("input")
    values[index] = Run._meta.get_field("input").from_db_value(values[index], None, _db())
    return values


def create_run(run: Run) -> None:
    """Insert a run that cannot meet a key constraint (no key)."""
    run.save(force_insert=True)


HOLDER_FIELDS = (
    "id",
    "workflow",
    "status",
    "input",
    "started_at",
    "due_at",
    "debounce_deadline",
    "key",
    "holds_key",
)


# The holder columns insert_or_get_holder returns, in the model's field order
# (which ``Model.from_db`` expects for a partial row).
_HOLDER_COLUMNS = tuple(
    f.attname for f in Run._meta.concrete_fields if f.attname in {*HOLDER_FIELDS, "queue"}
)


def get_holder(workflow: str, key: str, *, lock: bool = False) -> Run | None:
    """The run holding ``key``; with ``lock``, its row stays locked until commit so a
    finishing holder and a start that waits behind it see each other."""
    runs = Run.objects.only(*HOLDER_FIELDS, "queue")
    if lock:
        runs = runs.select_for_update()
    return runs.filter(workflow=workflow, key=key, holds_key=True).first()


def release_key(run_id: uuid.UUID, *, statuses: Iterable[str]) -> bool:
    """Let ``run_id`` give up its key if it still holds it in one of ``statuses``."""
    return bool(
        Run.objects.filter(id=run_id, holds_key=True, status__in=list(statuses)).update(
            holds_key=False
        )
    )


def take_key(run_id: uuid.UUID) -> bool:
    """Make ``run_id`` the holder of its key again; False if another run holds it."""
    try:
        with transaction.atomic():
            return bool(Run.objects.filter(id=run_id, holds_key=False).update(holds_key=True))
    except IntegrityError:
        return False


def replace_holder(holder_id: uuid.UUID, error: dict) -> bool:
    """Cancel an active, non-compensating holder and free its key, in one statement."""
    at = now()
    return bool(
        Run.objects.filter(
            id=holder_id,
            holds_key=True,
            status__in=[Status.PENDING, Status.RUNNING, Status.WAITING],
        ).update(
            status=Status.CANCELLED,
            holds_key=False,
            error=error,
            finished_at=at,
            due_at=None,
            lease_expires_at=None,
        )
    )


def update_pending_input(run_id: uuid.UUID, input: dict, **fields: Any) -> bool:
    """Give a run that no worker has picked up a newer input (debounce, run_again)."""
    return bool(
        Run.objects.filter(id=run_id, status=Status.PENDING, started_at__isnull=True).update(
            input=input, **fields
        )
    )


def get_waiting_behind(workflow: str, key: str, *, lock: bool = False) -> Run | None:
    runs = Run.objects.only(*HOLDER_FIELDS, "runs_after", "queue")
    if lock:
        runs = runs.select_for_update()
    return runs.filter(
        workflow=workflow,
        key=key,
        holds_key=False,
        runs_after__isnull=False,
        status=Status.PENDING,
    ).first()


def update_waiting_input(run_id: uuid.UUID, input: dict) -> None:
    Run.objects.filter(id=run_id, status=Status.PENDING, holds_key=False).update(input=input)


def move_waiting_behind(workflow: str, key: str, holder_id: uuid.UUID) -> None:
    """The run waiting behind a replaced holder waits behind its replacement instead."""
    Run.objects.filter(
        workflow=workflow,
        key=key,
        status=Status.PENDING,
        holds_key=False,
        runs_after__isnull=False,
    ).exclude(id=holder_id).update(runs_after=holder_id)


def active_children(parent_id: uuid.UUID) -> list[uuid.UUID]:
    return list(
        Run.objects.filter(
            parent_id=parent_id, status__in=[Status.PENDING, Status.RUNNING, Status.WAITING]
        ).values_list("id", flat=True)
    )


def wait_behind(run_id: uuid.UUID, holder_id: uuid.UUID) -> None:
    Run.objects.filter(id=run_id, status=Status.PENDING, holds_key=False).update(
        runs_after=holder_id
    )


def take_key_and_run(run_id: uuid.UUID, *, timeout: timedelta | None) -> bool:
    """A waiting ``run_again`` run takes its key and becomes due; its timeout starts now."""
    at = now()
    try:
        with transaction.atomic():
            return bool(
                Run.objects.filter(id=run_id, status=Status.PENDING, holds_key=False).update(
                    holds_key=True,
                    due_at=at,
                    timeout_at=at + timeout if timeout else None,
                )
            )
    except IntegrityError:
        return False


def waiting_behind_finished() -> list[tuple[str, str]]:
    """Keys with a run waiting behind a holder that finished or no longer holds them."""
    waiting = Run.objects.filter(
        status=Status.PENDING, holds_key=False, runs_after__isnull=False
    ).exclude(
        runs_after__status__in=[
            Status.PENDING,
            Status.RUNNING,
            Status.WAITING,
            Status.COMPENSATING,
        ],
        runs_after__holds_key=True,
    )
    return list(waiting.values_list("workflow", "key")[:500])


def record_activity(
    kind: str, *, run_id: uuid.UUID | None, workflow: str, key: str | None, details: dict
) -> None:
    activity = Activity(
        kind=kind,
        run_id=run_id,
        workflow=workflow,
        key=key,
        details={"key": key, "workflow": workflow, **details},
        created_at=now(),
    )
    # A plain INSERT: no save() machinery (nothing listens to Activity's model signals).
    sql, values = _insert_statement(activity)
    with connection.cursor() as cursor:
        cursor.execute(sql, values)


def notify_due(queue: str) -> None:
    """Wake idle workers on PostgreSQL; delivered when the transaction commits."""
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [conf.get("NOTIFY_CHANNEL"), queue])


# --- acting on runs -------------------------------------------------------------


def cancel_run(run_id: uuid.UUID, error: Any) -> bool:
    """Mark an active run cancelled. Its key stays held: a status change never frees a key."""
    return bool(
        Run.objects.filter(
            id=run_id, status__in=[Status.PENDING, Status.RUNNING, Status.WAITING]
        ).update(
            status=Status.CANCELLED,
            error=error,
            finished_at=now(),
            due_at=None,
            lease_expires_at=None,
        )
    )


def resume_failed(run_id: uuid.UUID) -> bool:
    """A failed run becomes due again at the step that failed, with a fresh attempt count."""
    return bool(
        Run.objects.filter(id=run_id, status=Status.FAILED).update(
            status=Status.PENDING,
            attempt=1,
            due_at=now(),
            finished_at=None,
            worker_id=None,
            lease_expires_at=None,
        )
    )


# --- claiming -------------------------------------------------------------------


def claim(
    *, worker_id: str, queues: Sequence[str] | None, limit: int, lease: timedelta
) -> list[Run]:
    """Claim up to ``limit`` due runs, oldest due first, in one statement.

    On PostgreSQL the candidates are locked with ``FOR UPDATE SKIP LOCKED`` so
    concurrent workers claim different runs without waiting on each other; the
    lock lasts only as long as this statement. SQLite serialises writers, so the
    same statement is atomic there without row locks.
    """
    at = now()
    ops = connection.ops
    table = _qn(Run._meta.db_table)
    # A claimed compensating run stays compensating (cancel() must keep refusing
    # it) and stops being due while it is owned.
    params: list[Any] = [
        Status.COMPENSATING,
        Status.COMPENSATING,
        Status.RUNNING,
        Status.COMPENSATING,
        worker_id,
        ops.adapt_datetimefield_value(at + lease),
        ops.adapt_datetimefield_value(at),
    ]
    where = [
        f"{_qn('status')} IN ({', '.join(['%s'] * len(CLAIMABLE_STATUSES))})",
        f"{_qn('due_at')} IS NOT NULL",
        f"{_qn('due_at')} <= %s",
    ]
    inner_params: list[Any] = [*CLAIMABLE_STATUSES, ops.adapt_datetimefield_value(at)]
    if queues:
        where.append(f"{_qn('queue')} IN ({', '.join(['%s'] * len(queues))})")
        inner_params.extend(queues)
    lock = " FOR UPDATE SKIP LOCKED" if is_postgres() else ""
    sql = (
        f"UPDATE {table} SET {_qn('status')} = CASE WHEN {_qn('status')} = %s THEN %s "
        f"ELSE %s END, {_qn('due_at')} = CASE WHEN {_qn('status')} = %s THEN NULL "
        f"ELSE {_qn('due_at')} END, {_qn('worker_id')} = %s, "
        f"{_qn('lease_expires_at')} = %s, {_qn('fence')} = {_qn('fence')} + 1, "
        f"{_qn('started_at')} = COALESCE({_qn('started_at')}, %s) "
        f"WHERE {_qn('id')} IN (SELECT {_qn('id')} FROM {table} WHERE {' AND '.join(where)} "
        f"ORDER BY {_qn('due_at')} LIMIT %s{lock}) RETURNING {_run_columns()}"
    )
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, *inner_params, limit])
            runs = [_run_from_row(row) for row in cursor.fetchall()]
    else:  # SQLite needs the backend's datetime converters: let the ORM apply them
        runs = list(Run.objects.raw(sql, [*params, *inner_params, limit]))
    runs.sort(key=lambda r: (r.due_at or at, r.created_at))
    return runs


def _run_columns() -> str:
    return ", ".join(_qn(f.column) for f in Run._meta.concrete_fields)


def _run_from_row(row: Sequence[Any]) -> Run:
    """A whole ``Run`` from a row of ``_run_columns()`` on PostgreSQL, converted as the
    ORM would (JSON columns arrive as text), without a RawQuerySet per claim."""
    db = _db()
    values = [
        field.from_db_value(value, None, db) if convert and value is not None else value
        for (field, convert), value in zip(_run_converters(), row, strict=True)
    ]
    return Run.from_db(DEFAULT_DB_ALIAS, None, values)


_CONVERTERS: list[tuple[Any, bool]] = []


def _run_converters() -> list[tuple[Any, bool]]:
    if not _CONVERTERS:
        _CONVERTERS.extend(
            (field, hasattr(field, "from_db_value")) for field in Run._meta.concrete_fields
        )
    return _CONVERTERS


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


def _owned(run: Run):
    return Run.objects.filter(id=run.id, fence=run.fence, status=Status.RUNNING)


def _attempt(run: Run, step_name: str, status: str, started_at: datetime, **fields) -> StepAttempt:
    return StepAttempt(
        run_id=run.id,
        kind=StepAttempt.Kind.STEP,
        step=step_name,
        step_index=run.step_index,
        attempt=run.attempt,
        status=status,
        worker_id=run.worker_id,
        started_at=started_at,
        finished_at=now(),
        **fields,
    )


def _state_between_steps(state: dict | None) -> dict:
    """A step that completed or failed leaves no waits behind. Events received stay
    (one per name for the whole run), and so do the children each call started, so a
    retried step finds the children that completed instead of starting them again."""
    state = state or {}
    return {name: state[name] for name in ("received", "children") if state.get(name)}


_RECORD_SQL: dict[tuple, str] = {}


def _update_owned_and_record(run: Run, changes: dict[str, Any], attempt: StepAttempt) -> bool:
    """The fenced update of a run this worker owns and, only if it still owns it, the
    insert of the attempt; False (nothing written) when the run is no longer its own.

    On PostgreSQL, for a caller in autocommit (a worker thread), this is one
    statement and one round trip, atomic on its own: the UPDATE in a CTE, the
    INSERT selecting from it. Otherwise it is the UPDATE then the INSERT in a
    transaction (a savepoint inside the caller's).
    """
    if not (is_postgres() and in_autocommit()):
        with transaction.atomic():
            if not _owned(run).update(**changes):
                return False
            attempt.save(force_insert=True)
            return True
    db = _db()
    meta = Run._meta
    fields = [meta.get_field(name) for name in changes]
    params = [
        field.get_db_prep_save(value, db)
        for field, value in zip(fields, changes.values(), strict=True)
    ]
    params += [run.id, run.fence, Status.RUNNING]
    attempt_fields = [
        (field, value)
        for field, _attname, _column, _plain in _field_plan(StepAttempt._meta, db)
        if (value := field.get_db_prep_save(field.pre_save(attempt, True), db)) is not None
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
            f"WITH owned AS (UPDATE {qn(meta.db_table)} SET {sets} WHERE {qn('id')} = %s "
            f"AND {qn('fence')} = %s AND {qn('status')} = %s RETURNING {qn('id')}) "
            f"INSERT INTO {qn(StepAttempt._meta.db_table)} ({columns}) "
            f"SELECT {values} FROM owned RETURNING {qn('id')}"
        )
    with connection.cursor() as cursor:
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


# --- pruning --------------------------------------------------------------------


def prunable(before: datetime):
    """Finished top-level runs that finished before ``before``.

    A child goes with its parent, never alone, so a parent's record of its
    children stays whole. A run another run still waits behind (``run_again``)
    stays until the key has moved on to that run.
    """
    waiting_behind = Run.objects.filter(
        runs_after=OuterRef("pk"), status=Status.PENDING, holds_key=False
    )
    active_child = Run.objects.filter(parent=OuterRef("pk"), status__in=ACTIVE_STATUSES)
    return Run.objects.filter(
        status__in=FINISHED_STATUSES, finished_at__lt=before, parent__isnull=True
    ).exclude(Exists(waiting_behind) | Exists(active_child))


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


def prune_runs(before: datetime, batch_size: int, *, dry_run: bool = False) -> int:
    """Delete finished runs that finished before ``before`` with their children,
    ``batch_size`` top-level runs per short transaction, so a large table is never
    locked for long. A deleted holder's key is free again. Returns how many runs
    were (or, with ``dry_run``, would be) deleted, children included."""
    total = 0
    skipped: set[uuid.UUID] = set()
    while True:
        roots = list(
            prunable(before)
            .exclude(id__in=skipped)
            .order_by("finished_at")
            .values_list("id", flat=True)[:batch_size]
        )
        if not roots:
            return total
        with transaction.atomic():
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
                # History only: a finished run that once waited behind one of these.
                Run.objects.filter(runs_after_id__in=ids).update(runs_after=None)
                Run.objects.filter(id__in=ids).delete()
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
        **fields,
    )


def begin_compensating(
    run: Run, step_name: str | None, started_at: datetime | None, error: dict, pending: list[int]
) -> None:
    """A run that failed for good turns ``compensating``: it keeps its key and its
    worker, keeps ``error`` as the original error, and will undo ``pending``
    (step indexes, in the order to undo them)."""
    with transaction.atomic():
        locked = _owned(run).select_for_update().only("id", "state").first()
        if locked is None:
            raise LeaseLost(run.id)
        state = dict(locked.state or {})
        state["compensation"] = {"pending": pending, "failed_step": step_name}
        changes: dict[str, Any] = {
            "status": Status.COMPENSATING,
            "error": error,
            "attempt": 1,
            "due_at": None,
            "waiting_for": None,
            "state": state,
        }
        _owned(run).update(**changes)
        if step_name is not None:
            _attempt(run, step_name, StepAttempt.Outcome.FAILED, started_at, error=error).save(
                force_insert=True
            )
    for name, value in changes.items():
        setattr(run, name, value)


def hand_back_compensating(run: Run) -> bool:
    """A compensating run goes back to no worker, due now, still compensating."""
    return bool(
        _owned_compensating(run).update(worker_id=None, lease_expires_at=None, due_at=now())
    )


def record_compensation_completed(
    run: Run, index: int, name: str, started_at: datetime, output: Any, context: dict
) -> None:
    """Record an undone step; the last one ends the run ``compensated``."""
    state = dict(run.state or {})
    compensation = dict(state.get("compensation") or {})
    compensation["pending"] = [i for i in compensation.get("pending", []) if i != index]
    state["compensation"] = compensation
    changes: dict[str, Any] = {"attempt": 1, "state": state, "context": context}
    if not compensation["pending"]:
        changes.update(
            status=Status.COMPENSATED, finished_at=now(), due_at=None, lease_expires_at=None
        )
    with transaction.atomic():
        if not _owned_compensating(run).update(**changes):
            raise LeaseLost(run.id)
        _compensation_attempt(
            run, index, name, StepAttempt.Outcome.COMPLETED, started_at, output=output
        ).save(force_insert=True)
    for field, value in changes.items():
        setattr(run, field, value)


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
    with transaction.atomic():
        if not _owned_compensating(run).update(**changes):
            raise LeaseLost(run.id)
        _compensation_attempt(
            run, index, name, StepAttempt.Outcome.FAILED, started_at, error=error
        ).save(force_insert=True)
    for field, value in changes.items():
        setattr(run, field, value)


def recover_expired_compensations() -> list[uuid.UUID]:
    """Compensating runs whose worker stopped heartbeating become due again, still
    compensating (so still holding their key and refusing cancel); the lost
    attempt counts."""
    at = now()
    with transaction.atomic():
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
            pending = ((state or {}).get("compensation") or {}).get("pending") or [0]
            lost.append(
                StepAttempt(
                    run_id=run_id,
                    kind=StepAttempt.Kind.COMPENSATION,
                    step=f"#{pending[0]}",
                    step_index=pending[0],
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


# --- children -------------------------------------------------------------------


def lock_owned_state(run: Run) -> dict:
    """The state of a run this worker owns, its row locked until the transaction ends
    (so children are started and recorded by one owner, once)."""
    row = _owned(run).select_for_update().values_list("state", flat=True).first()
    if row is None and not _owned(run).exists():
        raise LeaseLost(run.id)
    return dict(row or {})


def save_owned_state(run: Run, state: dict) -> None:
    if not _owned(run).update(state=state):
        raise LeaseLost(run.id)
    run.state = state


def run_outcomes(ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, tuple[str, Any, Any, Any]]:
    """``{id: (status, result, error, parent_id)}`` of the given runs (missing ones
    are left out)."""
    rows = Run.objects.filter(id__in=list(ids)).values_list(
        "id", "status", "result", "error", "parent_id"
    )
    return {row[0]: tuple(row[1:]) for row in rows}


def cancel_runs(ids: Sequence[uuid.UUID], error: dict) -> list[uuid.UUID]:
    """Cancel those of ``ids`` that are still pending, running or waiting."""
    cancelled = []
    for run_id in ids:
        if cancel_run(run_id, error):
            cancelled.append(run_id)
    return cancelled


def waiting_parents(limit: int = 500) -> list[tuple[uuid.UUID, dict]]:
    """Runs suspended until their children (or awaited runs) finish."""
    return list(
        Run.objects.filter(status=Status.WAITING, waiting_for="children")
        .order_by("id")
        .values_list("id", "state")[:limit]
    )


def waiting_parent_state(run_id: uuid.UUID) -> dict | None:
    row = (
        Run.objects.filter(id=run_id, status=Status.WAITING, waiting_for="children")
        .values_list("state", flat=True)
        .first()
    )
    return None if row is None else dict(row or {})


def wake_parent(run_id: uuid.UUID) -> bool:
    """Make a run waiting for children due now; False if it wasn't waiting for them."""
    row = Run.objects.filter(id=run_id).values_list("queue", flat=True).first()
    woken = bool(
        Run.objects.filter(id=run_id, status=Status.WAITING, waiting_for="children").update(
            status=Status.PENDING, due_at=now(), waiting_for=None
        )
    )
    if woken:
        notify_due(row)
    return woken


# --- schedules ------------------------------------------------------------------


def lock_due_schedules(at: datetime, limit: int) -> list[Schedule]:
    """Enabled schedules due at ``at``, locked until the caller's transaction ends.

    ``SKIP LOCKED``: a schedule another node is firing is skipped, and once that
    node commits, its advanced ``next_fire_at`` no longer matches. SQLite has no
    row locks; ``advance_schedule`` compares and sets instead.
    """
    return list(
        Schedule.objects.select_for_update(skip_locked=True)
        .filter(enabled=True, next_fire_at__isnull=False, next_fire_at__lte=at)
        .order_by("next_fire_at")[:limit]
    )


def advance_schedule(
    schedule: Schedule,
    *,
    fired_at: datetime,
    next_fire_at: datetime | None,
    run_id: uuid.UUID | None,
    failed: bool,
) -> bool:
    """Move a schedule past the tick it fired, only if no one else did (compare and
    set on ``next_fire_at``); False means another node fired that tick."""
    changes: dict[str, Any] = {"next_fire_at": next_fire_at, "last_fired_at": fired_at}
    if run_id is not None:
        changes["last_run_id"] = run_id
    if failed:
        changes["failures"] = F("failures") + 1
    return bool(
        Schedule.objects.filter(
            id=schedule.id, enabled=True, next_fire_at=schedule.next_fire_at
        ).update(**changes)
    )


def record_manual_fire(
    name: str, *, fired_at: datetime, run_id: uuid.UUID | None, failed: bool
) -> None:
    changes: dict[str, Any] = {"last_fired_at": fired_at}
    if run_id is not None:
        changes["last_run_id"] = run_id
    if failed:
        changes["failures"] = F("failures") + 1
    Schedule.objects.filter(name=name).update(**changes)


# --- worker ---------------------------------------------------------------------
# Registration of worker processes, lease renewal for the runs a worker holds,
# the next due time (so an idle worker wakes for timers), and the dedicated
# LISTEN connection.


def register_worker(
    worker_id: str,
    *,
    hostname: str,
    pid: int,
    queues: list[str],
    concurrency: int,
    stale_before: datetime,
) -> bool:
    """Record a live worker; False when a worker with this id heartbeated after ``stale_before``
    (a second process started with the same ``--worker-id``)."""
    at = now()
    fields = {
        "hostname": hostname,
        "pid": pid,
        "queues": queues,
        "concurrency": concurrency,
        "started_at": at,
        "heartbeat_at": at,
        "stopping": False,
    }
    with transaction.atomic():
        node = WorkerNode.objects.select_for_update().filter(id=worker_id).first()
        if node is not None and node.heartbeat_at >= stale_before and not node.stopping:
            return False
        WorkerNode.objects.update_or_create(id=worker_id, defaults=fields)
    return True


def worker_heartbeat(worker_id: str, *, stopping: bool) -> None:
    WorkerNode.objects.filter(id=worker_id).update(heartbeat_at=now(), stopping=stopping)


def unregister_worker(worker_id: str) -> None:
    WorkerNode.objects.filter(id=worker_id).delete()


def forget_dead_workers(before: datetime) -> int:
    """Delete worker rows that stopped heartbeating before ``before`` (their runs are
    recovered through their leases, not through these rows)."""
    deleted, _ = WorkerNode.objects.filter(heartbeat_at__lt=before).delete()
    return deleted


def renew_leases(
    worker_id: str, owned: Sequence[tuple[uuid.UUID, int]], lease: timedelta
) -> dict[uuid.UUID, tuple[str, int] | None]:
    """Extend the leases of the runs a worker executes, each fenced by its claim.

    Returns the runs it no longer owns, each with its current ``(status, fence)``
    (None if deleted): cancelled, recovered by another worker, or just finished.
    One statement when nothing was lost, two otherwise.
    """
    if not owned:
        return {}
    claims = Q()
    for run_id, fence in owned:
        claims |= Q(id=run_id, fence=fence)
    still = Run.objects.filter(
        claims, worker_id=worker_id, status__in=[Status.RUNNING, Status.COMPENSATING]
    )
    if still.update(lease_expires_at=now() + lease) == len(owned):
        return {}
    kept = set(still.values_list("id", flat=True))
    lost = {run_id for run_id, _fence in owned} - kept
    found = {
        run_id: (status, fence)
        for run_id, status, fence in Run.objects.filter(id__in=lost).values_list(
            "id", "status", "fence"
        )
    }
    return {run_id: found.get(run_id) for run_id in lost}


def notify_runs_due(run_ids: Sequence[uuid.UUID]) -> None:
    """NOTIFY once per queue of ``run_ids`` (runs handed back or recovered just now)."""
    if not run_ids or not is_postgres():
        return
    queues = Run.objects.filter(id__in=list(run_ids)).values_list("queue", flat=True)
    for queue in set(queues):
        notify_due(queue)


def next_due_at(queues: Sequence[str] | None) -> datetime | None:
    """When the next claimable run of ``queues`` becomes due (the claim index answers it)."""
    runs = Run.objects.filter(status__in=CLAIMABLE_STATUSES, due_at__isnull=False)
    if queues:
        runs = runs.filter(queue__in=list(queues))
    return runs.order_by("due_at").values_list("due_at", flat=True).first()


def reset_connection_after_error() -> None:
    """Drop this thread's connection if an error left it unusable (only after errors:
    a worker keeps its connections for its whole life, whatever CONN_MAX_AGE says)."""
    if connection.in_atomic_block or connection.connection is None:
        return  # no connection yet, or the caller's transaction decides
    if not connection.is_usable():
        connection.close()  # the next query reconnects


def open_listener(channel: str, alias: str = "default"):
    """A dedicated autocommit psycopg connection that LISTENs on ``channel``.

    It is not Django's connection: LISTEN must stay on one server session for as
    long as the worker lives, which a pooler in transaction mode cannot promise.
    """
    import psycopg
    from django.db import connections
    from psycopg import sql

    params = connections[alias].get_connection_params()
    for name in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(name, None)
    listener = psycopg.connect(**params, autocommit=True)
    try:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    except BaseException:
        listener.close()
        raise
    return listener
