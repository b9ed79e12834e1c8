"""Starting runs with keys, and acting on runs (cancel, resume, hand a key on)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

from django.db import DEFAULT_DB_ALIAS, IntegrityError, models, transaction

from .. import conf
from ..models import (
    Activity,
    Run,
    Status,
)
from .base import _db, _field_plan, _literal, _qn, now, sql_cursor

# --- starting -----------------------------------------------------------------


_INSERT_SQL: dict[tuple, str] = {}


def _insert_statement(obj, *, on_conflict: str = "", db=None) -> tuple[str, list]:
    """A single-row INSERT of a model instance, prepared without the ORM's save().

    NULL columns are left out (no column has a database default, so that is the
    same row); the SQL is built once per model and set of columns, so the
    statement text repeats and PostgreSQL can keep a plan for it. On PostgreSQL a
    value that is its field's simple default is written as a literal: one
    parameter fewer to send, and still one statement per shape.
    """
    db = db or _db()
    meta = type(obj)._meta
    columns, slots, values, _fields = _insert_parts(obj, db)
    cache_key = (db.vendor, meta.db_table, tuple(columns), tuple(slots), on_conflict)
    sql = _INSERT_SQL.get(cache_key)
    if sql is None:
        qn = db.ops.quote_name
        sql = _INSERT_SQL[cache_key] = (
            f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(c) for c in columns)}) "
            f"VALUES ({', '.join(slots)}){on_conflict}"
        )
    return sql, values


def _insert_parts(obj, db) -> tuple[list[str], list[str], list[Any], list]:
    """The columns of an INSERT of ``obj``, each one's SQL (``%s`` or a literal), the
    parameters, and the fields."""
    meta = type(obj)._meta
    literals = _default_literals(meta) if db.vendor == "postgresql" else {}
    columns: list[str] = []
    slots: list[str] = []
    values: list[Any] = []
    fields: list = []
    for field, attname, column, plain in _field_plan(meta, db):
        value = getattr(obj, attname)
        if value is None:
            continue
        default = literals.get(attname)
        if default is not None and type(value) is type(default[0]) and value == default[0]:
            columns.append(column)
            slots.append(default[1])
            fields.append(field)
            continue
        if not plain:
            value = field.get_db_prep_save(field.pre_save(obj, True), db)
            if value is None:
                continue
        columns.append(column)
        slots.append("%s")
        values.append(value)
        fields.append(field)
    return columns, slots, values, fields


@functools.cache
def _default_literals(meta) -> dict[str, tuple[Any, str]]:
    """Per field with a simple default (a number, a flag, a plain word, an empty JSON
    object): the default and its SQL literal."""
    literals: dict[str, tuple[Any, str]] = {}
    for field in meta.concrete_fields:
        if not field.has_default():
            continue
        default = field.get_default()
        if isinstance(field, models.JSONField) and default == {}:
            literals[field.attname] = ({}, "'{}'")
        elif isinstance(default, bool):
            literals[field.attname] = (default, "true" if default else "false")
        elif isinstance(default, int) and not callable(field.default):
            literals[field.attname] = (default, str(int(default)))
        elif isinstance(default, str) and default.replace("_", "").isalnum():
            literals[field.attname] = (default, f"'{default}'")
    return literals


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
    with sql_cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {_qn('id')}", values)
        inserted = cursor.fetchone() is not None
    if inserted:
        _inserted(run)
    return inserted


class DuplicateNote(NamedTuple):
    """A duplicate that ``insert_or_get_holder`` records in its own statement: when the
    holder is in one of ``holder_states`` (``(status, picked_up)``, from
    ``keys.holder_answers``), the start only answers, so its activity row is written
    right there, with ``outcome`` and the start's ``input``."""

    outcome: str
    holder_states: frozenset[tuple[str, bool]]
    input: dict


class InsertOrHolder(NamedTuple):
    """What ``insert_or_get_holder`` found: the run went in, or the holder (None when
    it finished between the insert and the look), and whether the duplicate was noted."""

    inserted: bool
    holder: Run | None = None
    noted: bool = False
    input_changed: bool | None = None


def insert_or_get_holder(run: Run, *, note: DuplicateNote | None = None) -> InsertOrHolder:
    """Insert ``run`` like ``insert_run``; if its key is taken, also return the holder.

    On PostgreSQL this is one statement, atomic on its own: the INSERT, the NOTIFY
    that wakes an idle worker (when the new run is due now; delivered at commit),
    the holder's row when the key is taken and, with ``note``, the duplicate's
    activity row when the holder answers it. The holder is read with the
    statement's snapshot, so a holder that committed while the INSERT waited on it
    is not seen: the caller then asks ``get_holder``. Elsewhere it is ``insert_run``
    then ``get_holder``, no NOTIFY, and the caller records the duplicate itself.
    """
    db = _db()
    if db.vendor != "postgresql":
        if insert_run(run):
            return InsertOrHolder(True)
        holder = get_holder(run.workflow, run.key) if run.key is not None else None
        return InsertOrHolder(False, holder)
    sql, values = _insert_statement(run, on_conflict=" ON CONFLICT DO NOTHING", db=db)
    notify = run.due_at is not None and run.due_at <= now()
    answers = note.holder_states if note is not None else frozenset()
    statement = _insert_or_holder_sql(sql, notify, answers)
    params = [*values, run.workflow, run.key]  # in the order the statement names them
    if answers:
        params += [note.outcome, db.ops.adapt_json_value(note.input, None), now()]
    if notify:
        params += [conf.get("NOTIFY_CHANNEL"), run.queue]
    with sql_cursor(db) as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    if row is None:
        return InsertOrHolder(False)
    if row[0]:
        _inserted(run)
        return InsertOrHolder(True)
    holder = Run.from_db(DEFAULT_DB_ALIAS, _HOLDER_COLUMNS, _decode_holder(row[2:-2]))
    return InsertOrHolder(False, holder, noted=bool(row[-2]), input_changed=row[-1])


_INSERT_OR_HOLDER_SQL: dict[tuple, str] = {}


def _insert_or_holder_sql(insert: str, notify: bool, answers: frozenset) -> str:
    cache_key = (insert, notify, answers)
    statement = _INSERT_OR_HOLDER_SQL.get(cache_key)
    if statement is not None:
        return statement
    qn = _qn
    holder_columns = ", ".join(qn(c) for c in _HOLDER_COLUMNS)
    nulls = ", ".join(["NULL"] * (len(_HOLDER_COLUMNS) - 1))
    notify_sql = "pg_notify(%s, %s)::text IS NULL" if notify else "false"
    parts = [
        f"WITH new AS ({insert} RETURNING {qn('id')}), "
        f"holder AS (SELECT {holder_columns} FROM {qn(Run._meta.db_table)} "
        f"WHERE {qn('workflow')} = %s AND {qn('key')} = %s AND {qn('holds_key')} "
        "AND NOT EXISTS (SELECT 1 FROM new))"
    ]
    noted, changed = "false", "NULL::boolean"
    if answers:
        # The duplicate's activity row, as record_activity writes it, only when the
        # holder's state is one in which the start just answers.
        table = qn(Activity._meta.db_table)
        changed = "holder.input IS DISTINCT FROM dup.input"
        parts.append(
            ", dup AS (SELECT %s::text AS outcome, %s::jsonb AS input, %s::timestamptz AS at), "
            f"noted AS (INSERT INTO {table} (kind, run_id, workflow, {qn('key')}, details, "
            f"created_at) SELECT '{Activity.Kind.KEY_DUPLICATE}', holder.id, holder.workflow, "
            "holder.key, jsonb_build_object('key', holder.key, 'workflow', holder.workflow, "
            f"'outcome', dup.outcome, 'input_changed', {changed}, 'input', dup.input), dup.at "
            f"FROM holder, dup WHERE {_holder_in(answers)} RETURNING 1)"
        )
        noted = "EXISTS (SELECT 1 FROM noted)"
        changed = f"(SELECT {changed} FROM dup)"
    parts.append(
        f" SELECT true, {notify_sql}, new.{qn('id')}, {nulls}, false, NULL::boolean FROM new "
        f"UNION ALL SELECT false, false, {holder_columns}, {noted}, {changed} FROM holder"
    )
    statement = _INSERT_OR_HOLDER_SQL[cache_key] = "".join(parts)
    return statement


def _holder_in(states: frozenset[tuple[str, bool]]) -> str:
    """SQL over the ``holder`` row: its ``(status, picked_up)`` is one of ``states``."""
    by_status: dict[str, set[bool]] = {}
    for status, picked_up in states:
        by_status.setdefault(status, set()).add(picked_up)
    whole = sorted(s for s, seen in by_status.items() if len(seen) == 2)
    terms = []
    if whole:
        terms.append(f"holder.status IN ({', '.join(_literal(s) for s in whole)})")
    for status, seen in sorted(by_status.items()):
        if len(seen) == 1:
            test = "IS NOT NULL" if True in seen else "IS NULL"
            terms.append(f"(holder.status = {_literal(status)} AND holder.started_at {test})")
    return f"({' OR '.join(terms)})"


def _decode_holder(values: Sequence[Any]) -> list[Any]:
    """The JSON ``input`` column arrives as text (Django loads jsonb itself)."""
    values = list(values)
    index = _HOLDER_COLUMNS.index("input")
    values[index] = Run._meta.get_field("input").from_db_value(values[index], None, _db())
    return values


class _Retry(Exception):
    pass


def hand_off(run: Run, holder_id: uuid.UUID, holder_status: str) -> bool:
    """Take the key of the finished holder ``holder_id`` for the new ``run``: release
    it (if it still holds the key in ``holder_status``), insert ``run`` and record the
    hand-off, all or nothing. False (nothing written) when the holder moved on.

    On PostgreSQL one statement, atomic on its own: the conditional UPDATE of the
    holder, the INSERT that runs only if it released the key (the released version
    no longer counts for the unique index within the statement), the activity row
    and the NOTIFY. Elsewhere the same writes in a transaction.
    """
    details = {"from_run_id": str(holder_id), "to_run_id": str(run.id)}
    db = _db()
    if db.vendor != "postgresql":
        try:
            with transaction.atomic():
                if not release_key(holder_id, statuses=[holder_status]):
                    return False
                if not insert_run(run):
                    raise _Retry  # undo the release: another run holds the key now
                record_activity(
                    Activity.Kind.KEY_HANDED_OFF,
                    run_id=run.id,
                    workflow=run.workflow,
                    key=run.key,
                    details=details,
                )
        except _Retry:
            return False
        return True
    columns, slots, values, fields = _insert_parts(run, db)
    notify = run.due_at is not None and run.due_at <= now()
    cache_key = (tuple(columns), tuple(slots), notify)
    sql = _HAND_OFF_SQL.get(cache_key)
    if sql is None:
        qn = db.ops.quote_name
        table = qn(Run._meta.db_table)
        # Explicit casts: a SELECT list does not take its types from the target columns.
        selected = ", ".join(
            f"{slot}::{field.db_type(db)}" for slot, field in zip(slots, fields, strict=True)
        )
        notify_sql = "pg_notify(%s, %s)::text IS NULL" if notify else "false"
        sql = _HAND_OFF_SQL[cache_key] = (
            f"WITH released AS (UPDATE {table} SET {qn('holds_key')} = false "
            f"WHERE {qn('id')} = %s AND {qn('holds_key')} AND {qn('status')} = %s "
            f"RETURNING {qn('id')}), "
            f"new AS (INSERT INTO {table} ({', '.join(qn(c) for c in columns)}) "
            f"SELECT {selected} WHERE EXISTS (SELECT 1 FROM released) RETURNING {qn('id')}), "
            f"noted AS (INSERT INTO {qn(Activity._meta.db_table)} (kind, run_id, workflow, "
            f"{qn('key')}, details, created_at) SELECT "
            f"'{Activity.Kind.KEY_HANDED_OFF}', new.{qn('id')}, %s::text, %s::text, "
            "%s::jsonb, %s::timestamptz FROM new RETURNING 1) "
            f"SELECT {notify_sql}, EXISTS (SELECT 1 FROM noted) FROM new"
        )
    params = [holder_id, holder_status, *values, run.workflow, run.key]
    params += [
        db.ops.adapt_json_value({"key": run.key, "workflow": run.workflow, **details}, None),
        now(),
    ]
    if notify:
        params += [conf.get("NOTIFY_CHANNEL"), run.queue]
    with sql_cursor(db) as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False
    _inserted(run)
    return True


_HAND_OFF_SQL: dict[tuple, str] = {}


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
    with sql_cursor() as cursor:
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
