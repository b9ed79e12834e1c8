"""Starting runs: the insert that respects keys and finds the holder, the hand-off,
and the activity rows that record what keys did.

The key rules themselves are enforced by ``durable_run_one_holder_per_key``, a
unique index on (workflow, key) of the rows with ``holds_key``: an insert that
meets it does nothing (``ON CONFLICT DO NOTHING``), so a taken key is an answer,
never an error that would abort the caller's transaction. On PostgreSQL an
insert that meets another transaction's uncommitted insert of the same key
waits for it to commit (then does nothing) or roll back (then inserts).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django_durable import conf
from django_durable.models import Activity, Run
from django_durable.store.base import (
    alias,
    as_json,
    db,
    engine,
    fetchone,
    now,
)
from django_durable.store.holders import get_holder

__all__ = [
    "DuplicateNote",
    "InsertOrHolder",
    "NewRun",
    "insert_or_get_holder",
    "insert_run",
    "record_activity",
    "run_params",
    "wake_params",
]

# The columns a start gives a new run (the arguments of durable_start_v2, with their
# types); every other column begins as a new Run's default, which the function
# writes as a constant (tests/test_statements.py compares them with the model's).
START_COLUMNS = {
    "id": "uuid",
    "workflow": "varchar",
    "queue": "varchar",
    "priority": "integer",
    "input": "jsonb",
    "context": "jsonb",
    "key": "varchar",
    "holds_key": "boolean",
    "runs_after_id": "uuid",
    "parent_id": "uuid",
    "due_at": "timestamptz",
    "timeout_at": "timestamptz",
    "debounce_deadline": "timestamptz",
    "step_names": "jsonb",
    "trace_context": "jsonb",
    "created_at": "timestamptz",
    "flow_key": "varchar",
}

# The holder columns durable_start answers with, in the model's field order (the
# fields holders.get_holder reads).
HOLDER_ATTNAMES = (
    "id",
    "workflow",
    "queue",
    "status",
    "input",
    "key",
    "holds_key",
    "due_at",
    "debounce_deadline",
    "started_at",
)
# The times among them (JSON gives them as ISO 8601 text).
_HOLDER_TIMES = tuple(
    n
    for n, attname in enumerate(HOLDER_ATTNAMES)
    if attname in ("due_at", "debounce_deadline", "started_at")
)


class DuplicateNote(NamedTuple):
    """A duplicate that ``insert_or_get_holder`` records in its own statement: when the
    holder is in one of ``holder_states`` (``(status, picked_up)``, from
    ``keys.holder_answers``), the start only answers, so its activity row is written
    right there, with ``outcome`` and the start's input."""

    outcome: str
    holder_states: frozenset[tuple[str, bool]]


class InsertOrHolder(NamedTuple):
    """What ``insert_or_get_holder`` found: the run went in, or the holder (None when
    it finished between the insert and the look), and whether the duplicate was noted.
    A noted duplicate is answered by the holder's id alone (``holder_id``): no
    ``Run`` is built for it."""

    inserted: bool
    holder: Run | None = None
    noted: bool = False
    input_changed: bool | None = None
    holder_id: uuid.UUID | None = None


# The two answers that carry nothing else, made once: a run that went in, and no
# run inserted and no holder any more.
_INSERTED = InsertOrHolder(True)
_NOTHING = InsertOrHolder(False)


@dataclasses.dataclass(slots=True, kw_only=True)
class NewRun:
    """A run a start is about to insert: the columns a start gives it (START_COLUMNS),
    by column name, and the input's JSON text when the start has it. Every other
    column of ``durable_run`` begins as a new ``Run``'s default, so a start has no way
    to set one (the class has no such attribute).
    No model instance is built: a start needs the values, not a ``Run``."""

    id: uuid.UUID
    workflow: str
    queue: str
    priority: int
    input: Any
    created_at: datetime
    context: Any = dataclasses.field(default_factory=dict)
    key: str | None = None
    holds_key: bool = False
    runs_after_id: uuid.UUID | None = None
    parent_id: uuid.UUID | None = None
    due_at: datetime | None = None
    timeout_at: datetime | None = None
    debounce_deadline: datetime | None = None
    step_names: Sequence[str] = ()
    trace_context: dict | None = None
    flow_key: str | None = None  # flow control by key (workflows/flow.py)
    # Not a column: the input's JSON text when the start has it already (it checked
    # the input by serialising it), so START sends it without serialising it again.
    input_json: str | None = None


@functools.cache
def _new_run_defaults() -> tuple[tuple[Any, Any], ...]:
    """The other fields and the value each has in a new Run (what durable_start writes)."""
    fresh = Run()
    return tuple(
        (f, getattr(fresh, f.attname))
        for f in Run._meta.concrete_fields
        if f.column not in START_COLUMNS
    )


# How START passes its arguments: a UUID, a time or a JSON value as text, with no
# cast. durable_start has one signature, so PostgreSQL reads each quoted argument as
# its parameter's type; a cast per argument made the server look up 20 type names
# and parse 40 more tokens at every start (docs/benchmarks.md, "Profiles"). And
# psycopg's client-side binding (Django's default) quotes a text several times
# faster than it adapts a UUID, a datetime, a JSON value or a list; with the Python
# around it, that adapting was the largest part of a start's own CPU time.


@functools.lru_cache(maxsize=1024)
def _names_json(names: tuple[str, ...]) -> str:
    """A workflow's step names as JSON: the same few lists at every start of it."""
    return json.dumps(list(names))


def _start_params(run: NewRun) -> dict[str, Any]:
    """START's run arguments, one per column of START_COLUMNS (a test checks that),
    as text where durable_start's parameter reads it as its type; the input as the
    text the start checked it as, when it has it. Written out, not looped over the
    columns and without a helper per value: this runs at every start, and most of
    the optional columns are empty. A run due now is due at its creation: that time
    is written out once."""
    created = run.created_at.isoformat()
    due, timeout, deadline = run.due_at, run.timeout_at, run.debounce_deadline
    runs_after, parent = run.runs_after_id, run.parent_id
    return {
        "id": str(run.id),
        "workflow": run.workflow,
        "queue": run.queue,
        "priority": run.priority,
        "input": run.input_json if run.input_json is not None else as_json(run.input),
        "context": as_json(run.context) if run.context else "{}",
        "key": run.key,
        "holds_key": run.holds_key,
        "runs_after_id": str(runs_after) if runs_after is not None else None,
        "parent_id": str(parent) if parent is not None else None,
        "due_at": (
            created if due is run.created_at else due.isoformat() if due is not None else None
        ),
        "timeout_at": timeout.isoformat() if timeout is not None else None,
        "debounce_deadline": deadline.isoformat() if deadline is not None else None,
        "step_names": _names_json(tuple(run.step_names)),  # a workflow gives a tuple: no copy
        "trace_context": as_json(run.trace_context),
        "created_at": created,
        "flow_key": run.flow_key,
    }


def run_params(run: NewRun, connection) -> dict[str, Any]:
    """Every column of the new run as the database takes it (the engine's INSERT_RUN and
    HAND_OFF): the
    start's columns and a new run's defaults."""
    params = {}
    for field, default in _new_run_defaults():
        params[field.column] = field.get_db_prep_save(default, connection)
    for field in Run._meta.concrete_fields:
        if field.column in START_COLUMNS:
            params[field.column] = field.get_db_prep_save(getattr(run, field.column), connection)
    return params


@functools.cache
def _answers(holder_states: frozenset[tuple[str, bool]]) -> str:
    """durable_start_v2's p_answers (a text[]), as START passes it: the holder states
    ``keys.holder_answers`` computed from the key rules (``(status, picked_up)``),
    each as the function reads a holder's state ('completed:true'), in PostgreSQL's
    text form of an array, which the function's parameter reads as its type (a text
    quotes faster than a list adapts)."""
    return "{" + ",".join(sorted(f"{s}:{str(p).lower()}" for s, p in holder_states)) + "}"


def wake_params(run: NewRun, connection) -> dict[str, Any]:
    """The NOTIFY parameters: it goes out (at commit) when the new run is due now (a
    run due when it was created is, without reading the clock again)."""
    due = run.due_at
    return {
        "wake": due is not None and (due <= run.created_at or due <= now(connection)),
        "channel": conf.get("NOTIFY_CHANNEL"),
    }


def insert_run(run: NewRun) -> bool:
    """Insert ``run`` unless that breaks a key constraint; return whether it was inserted."""
    connection = db()
    statement = engine(connection).INSERT_RUN
    return fetchone(statement, run_params(run, connection), connection) is not None


def insert_or_get_holder(
    run: NewRun, *, note: DuplicateNote | None = None, connection=None
) -> InsertOrHolder:
    """Insert ``run`` like ``insert_run``; if its key is taken, also return the holder.

    Where the engine has START (PostgreSQL), one statement (durable_start: it also
    wakes a worker, and with ``note`` records the duplicate when the holder answers
    it). Elsewhere INSERT_RUN then ``get_holder``, no NOTIFY, and the caller records
    the duplicate itself. ``connection``: ``db()``, when the caller has it already.
    """
    connection = connection or db()
    start = engine(connection).START
    if start is None:
        if insert_run(run):
            return _INSERTED
        holder = get_holder(run.workflow, run.key) if run.key is not None else None
        return InsertOrHolder(False, holder, holder_id=holder.id if holder else None)
    params = _start_params(run)
    params.update(wake_params(run, connection))
    params["outcome"] = note.outcome if note is not None else None
    params["answers"] = _answers(note.holder_states) if note is not None else "{}"
    (answer,) = fetchone(start, params, connection)
    if answer == "true":  # the run went in (the common answer: no JSON to parse)
        return _INSERTED
    if answer is None:
        return _NOTHING
    found = json.loads(answer)
    holder_id = uuid.UUID(found["id"])
    if found["noted"]:
        return InsertOrHolder(
            False, noted=True, input_changed=found["input_changed"], holder_id=holder_id
        )
    return InsertOrHolder(
        False, _holder(found), input_changed=found["input_changed"], holder_id=holder_id
    )


def _holder(found: dict[str, Any]) -> Run:
    """The holder of durable_start's JSON answer (its HOLDER_ATTNAMES), converted to what the
    ORM reads: a UUID and times for the JSON's strings."""
    values = [found[attname] for attname in HOLDER_ATTNAMES]
    values[0] = uuid.UUID(values[0])
    for n in _HOLDER_TIMES:
        if values[n] is not None:
            values[n] = datetime.fromisoformat(values[n])
    return Run.from_db(alias(), list(HOLDER_ATTNAMES), values)


def record_activity(
    kind: str, *, run_id: uuid.UUID | None, workflow: str, key: str | None, details: dict
) -> None:
    Activity.objects.create(
        kind=kind,
        run_id=run_id,
        workflow=workflow,
        key=key,
        details={"key": key, "workflow": workflow, **details},
        created_at=now(),
    )
