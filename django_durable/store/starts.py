"""Starting runs with keys: one statement that inserts or finds the holder, the
hand-off, and the activity rows that record what keys did."""

from __future__ import annotations

import functools
import uuid
from typing import Any, NamedTuple

from django.db import DEFAULT_DB_ALIAS, models, transaction

from django_durable import conf
from django_durable.models import Activity, Run
from django_durable.store.base import (
    _db,
    _field_plan,
    _literal,
    _prepared,
    _qn,
    now,
    run_from_row,
    sql_cursor,
)
from django_durable.store.holders import HOLDER_FIELDS, get_holder, release_key

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
    literals = _default_literals(meta) if db.vendor == "postgresql" else None
    row = _prepared(_field_plan(meta, db), obj, literals)
    columns = [column for _field, column, _slot, _value in row]
    slots = [slot for _field, _column, slot, _value in row]
    values = [value for _field, _column, slot, value in row if slot == "%s"]
    fields = [field for field, _column, _slot, _value in row]
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
        elif isinstance(default, str) and default.isidentifier():
            literals[field.attname] = (default, _literal(default))
    return literals


def _wake_params(run: Run) -> list:
    """The NOTIFY parameters for a run due now (delivered at commit); none otherwise."""
    if run.due_at is not None and run.due_at <= now():
        return [conf.get("NOTIFY_CHANNEL"), run.queue]
    return []


def _notify_sql(notify: bool) -> str:
    """A boolean column that sends the NOTIFY of ``_wake_params`` when there is one."""
    return "pg_notify(%s, %s)::text IS NULL" if notify else "false"


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
    # Commit without waiting for the WAL flush when the duplicate is all the statement
    # writes (only for a statement that is its own transaction).
    commit_async: bool = False


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
    wake = _wake_params(run)
    answers = note.holder_states if note is not None else frozenset()
    commit_async = note is not None and note.commit_async
    statement = _insert_or_holder_sql(sql, bool(wake), answers, commit_async)
    params = [*values, run.workflow, run.key]  # in the order the statement names them
    if answers:
        params += [note.outcome, db.ops.adapt_json_value(note.input, None), now()]
    with sql_cursor(db) as cursor:
        cursor.execute(statement, params + wake)
        row = cursor.fetchone()
    if row is None:
        return InsertOrHolder(False)
    if row[0]:
        _inserted(run)
        return InsertOrHolder(True)
    holder = run_from_row(_HOLDER_COLUMNS, row[2:-2])
    return InsertOrHolder(False, holder, noted=bool(row[-2]), input_changed=row[-1])


_INSERT_OR_HOLDER_SQL: dict[tuple, str] = {}


def _insert_or_holder_sql(insert: str, notify: bool, answers: frozenset, commit_async: bool) -> str:
    cache_key = (insert, notify, answers, commit_async)
    statement = _INSERT_OR_HOLDER_SQL.get(cache_key)
    if statement is not None:
        return statement
    qn = _qn
    holder_columns = ", ".join(qn(c) for c in _HOLDER_COLUMNS)
    nulls = ", ".join(["NULL"] * (len(_HOLDER_COLUMNS) - 1))
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
            f"FROM holder, dup WHERE {_holder_in(answers)} "
            f"RETURNING {_noted_returns(commit_async)})"
        )
        noted = "EXISTS (SELECT 1 FROM noted)"
        changed = f"(SELECT {changed} FROM dup)"
    parts.append(
        f" SELECT true, {_notify_sql(notify)}, new.{qn('id')}, {nulls}, false, NULL::boolean "
        "FROM new "
        f"UNION ALL SELECT false, false, {holder_columns}, {noted}, {changed} FROM holder"
    )
    statement = _INSERT_OR_HOLDER_SQL[cache_key] = "".join(parts)
    return statement


def _noted_returns(commit_async: bool) -> str:
    """What the duplicate's INSERT returns; with ``commit_async`` it also turns off
    ``synchronous_commit`` for this transaction, and only when the row is written (a
    new run inserted by the same statement keeps the flush)."""
    return "set_config('synchronous_commit', 'off', true)" if commit_async else "1"


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
    wake = _wake_params(run)
    cache_key = (tuple(columns), tuple(slots), bool(wake))
    sql = _HAND_OFF_SQL.get(cache_key)
    if sql is None:
        qn = db.ops.quote_name
        table = qn(Run._meta.db_table)
        # Explicit casts: a SELECT list does not take its types from the target columns.
        selected = ", ".join(
            f"{slot}::{field.db_type(db)}" for slot, field in zip(slots, fields, strict=True)
        )
        # "holds_key IS NOT FALSE" (the column is NOT NULL, so: holds_key) does not let
        # the planner use the partial indexes of holders: the run is found by its
        # primary key. Statistics from when holders were rare made a whole scan of
        # such an index look cheaper, and the prepared plan kept it.
        sql = _HAND_OFF_SQL[cache_key] = (
            f"WITH released AS (UPDATE {table} SET {qn('holds_key')} = false "
            f"WHERE {qn('id')} = %s AND {qn('holds_key')} IS NOT FALSE AND {qn('status')} = %s "
            f"RETURNING {qn('id')}), "
            f"new AS (INSERT INTO {table} ({', '.join(qn(c) for c in columns)}) "
            f"SELECT {selected} WHERE EXISTS (SELECT 1 FROM released) RETURNING {qn('id')}), "
            f"noted AS (INSERT INTO {qn(Activity._meta.db_table)} (kind, run_id, workflow, "
            f"{qn('key')}, details, created_at) SELECT "
            f"'{Activity.Kind.KEY_HANDED_OFF}', new.{qn('id')}, %s::text, %s::text, "
            "%s::jsonb, %s::timestamptz FROM new RETURNING 1) "
            f"SELECT {_notify_sql(bool(wake))}, EXISTS (SELECT 1 FROM noted) FROM new"
        )
    params = [holder_id, holder_status, *values, run.workflow, run.key]
    params += [
        db.ops.adapt_json_value({"key": run.key, "workflow": run.workflow, **details}, None),
        now(),
        *wake,
    ]
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


# The holder columns insert_or_get_holder returns, in the model's field order
# (which ``run_from_row`` and ``Model.from_db`` expect for a partial row).
_HOLDER_COLUMNS = tuple(
    f.attname for f in Run._meta.concrete_fields if f.attname in {*HOLDER_FIELDS, "queue"}
)


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
