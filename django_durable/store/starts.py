"""Starting runs with keys, and acting on runs (cancel, resume, hand a key on)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, transaction

from .. import conf
from ..models import (
    Activity,
    Run,
    Status,
)
from .base import _db, _field_plan, _qn, is_postgres, now

# --- starting -----------------------------------------------------------------


_INSERT_SQL: dict[tuple, str] = {}


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
