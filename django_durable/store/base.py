"""What every store module shares: the database, the clock, running a named statement.

Everything django-durable reads and writes goes to one ``DATABASES`` alias,
``DURABLE["DATABASE"]`` (default ``"default"``): raw statements through
``connections[alias].cursor()`` (Django's cursor, so ``execute_wrapper``, DEBUG
logging, APM hooks and the debug toolbar see each one), ORM queries through the
models' managers, which are bound to the same alias (``models.DurableManager``).

The clock: on PostgreSQL every lease, heartbeat, due time and recovery is judged
by the database's clock, so a worker or web server whose own clock is off can
neither take a live run nor delay or advance one. Statements that claim, renew or
recover compare with ``now()`` inside the statement (``db_now()`` in the ORM);
times computed in Python (a start's ``due_at``, a retry's, a sleep's) come from
``now()`` here, this process's clock corrected by its offset from the database's,
measured whenever a connection to it opens (``connection_created``). SQLite is
one machine: it keeps this process's clock.
"""

from __future__ import annotations

import functools
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from types import ModuleType
from typing import Any, ParamSpec, TypeVar

from django.db import OperationalError, connections, transaction
from django.db.backends.signals import connection_created
from django.db.models.functions import Now
from django.utils import timezone

from django_durable import conf, signals
from django_durable.models import Run, Status, StepAttempt
from django_durable.store import engines

__all__ = [
    "LeaseLost",
    "alias",
    "atomic",
    "db",
    "db_now",
    "engine",
    "in_autocommit",
    "notify_due",
    "now",
    "retry_deadlocks",
    "send_after_commit",
]


class LeaseLost(Exception):
    """This worker no longer owns the run (cancelled, recovered elsewhere, finished)."""


def alias() -> str:
    """The ``DATABASES`` alias of django-durable's tables."""
    return conf.get("DATABASE")


def db():
    """The connection of django-durable's tables (this thread's)."""
    return connections[alias()]


def atomic(**kwargs):
    """``transaction.atomic`` on django-durable's database."""
    return transaction.atomic(using=alias(), **kwargs)


def engine(connection=None) -> ModuleType:
    """The engine of django-durable's database (``store/engines``: its statements and
    what it does), chosen once per connection alias; ``connection``: ``db()``, when
    the caller has it already."""
    return engines.for_connection(connection or db())


# The runs table's columns, in the model's order: the one list the statements that
# name every column (the engines' INSERTs) are checked against, and the order of a
# claimed row (the claim returns durable_run rows).
RUN_COLUMNS = tuple(field.column for field in Run._meta.concrete_fields)
RUN_ATTNAMES = tuple(field.attname for field in Run._meta.concrete_fields)


# The offset of each database's clock from this process's clock (PostgreSQL), by
# alias: a property of the database server, measured again whenever a connection to
# it opens (the last measurement stands).
_clock_offsets: dict[str, timedelta] = {}


def _measure_clock(sender, connection, **kwargs) -> None:
    """Measure a new connection's clock offset (``connection_created``)."""
    if connection.alias != alias() or not engine(connection).SERVER_CLOCK:
        return
    before = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(engine(connection).READ_CLOCK)
        (database_now,) = cursor.fetchone()
    after = timezone.now()
    offset = database_now - (before + (after - before) / 2)
    # An offset within the round trip is no offset: keep this process's clock.
    _clock_offsets[connection.alias] = offset if abs(offset) > after - before else timedelta(0)


connection_created.connect(_measure_clock, dispatch_uid="django_durable.store.clock")


def now(connection=None) -> datetime:
    """The time by the database's clock (PostgreSQL: this process's, corrected);
    ``connection``: ``db()``, when the caller has it already."""
    at = timezone.now()
    offset = _clock_offsets.get(connection.alias if connection is not None else alias())
    return at + offset if offset else at


def db_now():
    """The database's clock inside a statement (``Now()`` on PostgreSQL), for the ORM's
    lease and recovery writes; on SQLite this process's clock."""
    return Now() if engine().SERVER_CLOCK else timezone.now()


def in_autocommit(connection=None) -> bool:
    """True when the caller has no transaction open: one statement is then atomic alone;
    ``connection``: ``db()``, when the caller has it already."""
    return (connection or db()).get_autocommit()


# --- deadlocks ----------------------------------------------------------------------

# PostgreSQL aborted this transaction to let another go on: "deadlock detected", and
# "could not serialize access" (an alias at REPEATABLE READ or SERIALIZABLE).
DEADLOCK_SQLSTATE = "40P01"
RETRIED_SQLSTATES = frozenset({DEADLOCK_SQLSTATE, "40001"})
DEADLOCK_ATTEMPTS = 8


P = ParamSpec("P")
R = TypeVar("R")


def is_aborted_for_another(exc: BaseException) -> bool:
    """True for the ``OperationalError`` PostgreSQL raises to break a deadlock, or to
    refuse a transaction that could not be serialized with another."""
    return isinstance(exc, OperationalError) and (
        getattr(exc.__cause__, "sqlstate", None) in RETRIED_SQLSTATES
    )


def retry_deadlocks(fn: Callable[P, R]) -> Callable[P, R]:
    """Run ``fn`` again (up to 8 attempts in all, after a random pause that grows with
    each: two transactions that met once often meet again at once) when PostgreSQL
    broke a deadlock, or refused a serialization, by aborting its transaction: the
    other transaction went on, so this one meets no lock the next time. Only where
    ``fn`` owns its transaction: a caller's own ``atomic()`` block is aborted as a
    whole, and the error is theirs."""

    @functools.wraps(fn)
    def retrying(*args: P.args, **kwargs: P.kwargs) -> R:
        for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except OperationalError as exc:
                last = attempt == DEADLOCK_ATTEMPTS
                if last or not is_aborted_for_another(exc) or db().in_atomic_block:
                    raise
            time.sleep(random.uniform(0.001, min(0.002 * 2**attempt, 0.2)))
        raise AssertionError("unreachable")

    return retrying


# --- running statements -------------------------------------------------------------


def fetchone(sql: str, params: Sequence | Mapping, connection=None) -> tuple | None:
    """The statement's first row; ``connection``: ``db()``, when the caller has it already."""
    with (connection or db()).cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def fetchall(sql: str, params: Sequence | Mapping, connection=None) -> list[tuple]:
    """The statement's rows; ``connection``: ``db()``, when the caller has it already."""
    with (connection or db()).cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def execute(sql: str, params: Sequence | Mapping) -> int:
    """Run a statement; return how many rows it changed."""
    with db().cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def as_json(value: Any) -> str | None:
    """A JSON parameter for a statement that casts it (``%s::jsonb``)."""
    if value is None:
        return None
    if type(value) is dict and not value:  # a new run's context: no encoder needed
        return "{}"
    return json.dumps(value)


def from_row(model, attnames: Sequence[str], row: Sequence[Any], connection=None):
    """A model instance from a row a raw statement returned, for the columns
    ``attnames`` (in the model's field order; the other fields are deferred),
    converted as the ORM converts what it reads (``Field.from_db_value``);
    ``connection``: ``db()``, when the caller has it already."""
    connection = connection or db()
    converting = _converting_fields(model)
    values = []
    for attname, value in zip(attnames, row, strict=True):
        field = converting.get(attname)
        if field is not None and value is not None:
            value = field.from_db_value(value, None, connection)
        values.append(value)
    return model.from_db(connection.alias, list(attnames), values)


@functools.cache
def _converting_fields(model) -> dict[str, Any]:
    """The model's fields that convert what the database returns, by attname."""
    return {f.attname: f for f in model._meta.concrete_fields if hasattr(f, "from_db_value")}


def insert(obj) -> None:
    """Insert a new row of one of django-durable's models (in its database)."""
    obj.save(force_insert=True, using=alias())


def send_after_commit(signal, sender, *, connection=None, **kwargs) -> None:
    """Send one of django-durable's signals once the current transaction commits (at
    once in autocommit); ``connection``: ``db()``, when the caller has it already."""
    if not signals.listened(signal):  # nobody listens at all
        return
    if (connection or db()).in_atomic_block:
        send = functools.partial(signals.send, signal, sender, **kwargs)
        transaction.on_commit(send, using=alias())
    else:
        signals.send(signal, sender, **kwargs)


def announce_attempt(attempt: StepAttempt) -> None:
    """``signals.attempt_recorded`` for a recorded attempt, after commit."""
    send_after_commit(signals.attempt_recorded, StepAttempt, attempt=attempt)


# --- waking workers -------------------------------------------------------------------


def notify_due(queue: str) -> None:
    """Wake the idle workers of ``queue`` (the engine's NOTIFY, at commit); on a
    database without NOTIFY they poll."""
    notify = engine().NOTIFY
    if notify is not None:
        execute(notify, [conf.get("NOTIFY_CHANNEL"), queue])


# --- a worker's own runs ------------------------------------------------------------


def owned(run: Run):
    """The run, only while this worker's claim (``fence``) still owns it, running."""
    return Run.objects.filter(id=run.id, fence=run.fence, status=Status.RUNNING)


def attempt_of(run: Run, step_name: str, status: str, started_at: datetime, **fields):
    """The ``StepAttempt`` row of the current step's attempt."""
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
        logs=run.attempt_logs,
        **fields,
    )
