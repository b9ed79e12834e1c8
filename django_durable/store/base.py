"""What every store module shares: the clock, the vendor, quoting, LeaseLost."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from django.utils import timezone

from django_durable import conf
from django_durable.models import Run, Status, StepAttempt


class LeaseLost(Exception):
    """This worker no longer owns the run (cancelled, recovered elsewhere, finished)."""


def now() -> datetime:
    return timezone.now()


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def _qn(name: str) -> str:
    return connection.ops.quote_name(name)


def _literal(status: str) -> str:
    """A status as an SQL literal: statuses are the model's own constants, never input,
    and a literal (unlike a parameter) lets a prepared statement's plan use the
    partial indexes whose conditions name statuses."""
    assert status.isidentifier(), status
    return f"'{status}'"


def in_autocommit() -> bool:
    """True when the caller has no transaction open: one statement is then atomic alone."""
    return connection.get_autocommit()


def _db():
    """The default connection itself: cheaper to use than the ``connection`` proxy."""
    return connections[DEFAULT_DB_ALIAS]


_PLAIN_FIELDS = (
    models.CharField,
    models.BooleanField,
    models.IntegerField,
    models.PositiveIntegerField,
    models.BigIntegerField,
    models.BigAutoField,
)
_FIELD_PLANS: dict[tuple, list] = {}


def _field_plan(meta, db) -> list[tuple[Any, str, str, Any]]:
    """Per model: (field, attname, column, prep) where ``prep(value)`` gives what
    ``field.get_db_prep_save`` would, the quick way for the common values: plain
    fields are sent as they are, an aware datetime too (Django's own
    ``adapt_datetimefield_value`` returns it unchanged on PostgreSQL), and JSON goes
    straight to the backend's adapter. No field here has a ``pre_save`` that fills
    a value (no ``auto_now``), so the attribute is the value."""
    cache_key = (db.vendor, meta.label)
    plan = _FIELD_PLANS.get(cache_key)
    if plan is None:
        plan = _FIELD_PLANS[cache_key] = [
            (field, field.attname, field.column, _prep_for(field, db))
            for field in meta.concrete_fields
        ]
    return plan


def _prep_for(field, db):
    def prep(value):
        return field.get_db_prep_save(value, db)

    native_uuid = db.features.has_native_uuid_field
    if type(field) in _PLAIN_FIELDS or (type(field) is models.UUIDField and native_uuid):
        return None  # sent as it is
    if type(field) is models.DateTimeField and db.vendor == "postgresql":

        def prep_datetime(value):
            if type(value) is datetime and value.tzinfo is not None:
                return value
            return prep(value)

        return prep_datetime
    if type(field) is models.JSONField:
        adapt, encoder = db.ops.adapt_json_value, field.encoder

        def prep_json(value):
            if type(value) is dict or type(value) is list:
                return adapt(value, encoder)
            return prep(value)

        return prep_json
    return prep


def _prepared(plan, obj, literals: dict[str, tuple[Any, str]] | None = None) -> list[tuple]:
    """(field, column, slot, value) of each non-NULL value of ``obj``, the value as the
    database takes it. ``slot`` is ``%s``, or the SQL literal of a field's simple
    default (``literals``, from ``starts._default_literals``) when the value is that
    default; the value is then None (nothing to send)."""
    state = obj.__dict__
    row = []
    for field, attname, column, prep in plan:
        value = state[attname] if attname in state else getattr(obj, attname)
        if value is None:
            continue
        default = literals.get(attname) if literals else None
        if default is not None and type(value) is type(default[0]) and value == default[0]:
            row.append((field, column, default[1], None))
            continue
        if prep is not None:
            value = prep(value)
            if value is None:
                continue
        row.append((field, column, "%s", value))
    return row


def run_from_row(attnames: Sequence[str], row: Sequence[Any]) -> Run:
    """A ``Run`` from a row of the columns ``attnames`` (in the model's field order) read
    on PostgreSQL, converted as the ORM would (JSON columns arrive as text); the other
    fields are deferred. Cheaper than a RawQuerySet per row."""
    db = _db()
    converters = _converters()
    values = {}
    for attname, value in zip(attnames, row, strict=True):
        field = converters.get(attname)
        values[attname] = (
            field.from_db_value(value, None, db)
            if field is not None and value is not None
            else value
        )
    return build(Run, values, from_db=True)


@functools.cache
def _converters() -> dict[str, Any]:
    """Run's fields that convert what the database returns, by attname."""
    return {f.attname: f for f in Run._meta.concrete_fields if hasattr(f, "from_db_value")}


def build(model, values: dict[str, Any], *, from_db: bool = False):
    """``model(**values)`` (by attname) the cheap way, for the hot paths: the instance's
    ``__dict__`` is filled as ``Model.__init__`` would leave it, without its per-field
    work. ``from_db``: a row read from the default database; fields not in ``values``
    are deferred, as in ``Model.from_db``. Django's own way when something listens to
    the model's ``pre_init``/``post_init``."""
    if (pre_init.receivers or post_init.receivers) and (
        pre_init.has_listeners(model) or post_init.has_listeners(model)
    ):
        if from_db:
            return model.from_db(DEFAULT_DB_ALIAS, list(values), list(values.values()))
        return model(**values)
    obj = model.__new__(model)
    obj._state = state = ModelState()
    if from_db:
        state.adding = False
        state.db = DEFAULT_DB_ALIAS
    obj.__dict__.update(values)
    return obj


def sql_cursor(db=None):
    """A cursor for the store's own hot statements (starts, claims, step records).

    On PostgreSQL with psycopg 3 its statements are prepared: PostgreSQL parses and
    plans each one once per connection instead of at every call, which costs more
    than executing these statements. Django's own cursor binds parameters in the
    client and never prepares. Django's error translation always applies; while
    execute wrappers are installed or queries are logged (DEBUG, assertNumQueries),
    statements go through Django's own cursor wrapper, so they see every statement.
    Otherwise they skip it: a wrapper that has nothing to do costs about as much as
    the rest of the client's work on a short statement.

    Off with ``DURABLE["PREPARED_STATEMENTS"] = False``, or when the database's
    ``OPTIONS`` say ``"prepare_threshold": None``. ``db``: the default connection,
    when the caller has it already.
    """
    db = db or _db()
    if db.vendor != "postgresql" or not _prepares(db):
        return db.cursor()
    preparing = _preparing_cursor_class()
    if preparing is None:
        return db.cursor()
    db.ensure_connection()
    raw = db.connection
    logged = db.queries_logged
    kept = getattr(db, "_durable_cursor", None)
    # One cursor per connection, kept between statements (its results are read
    # before the next): making one is a measurable part of a start.
    if kept is None or kept[0] is not raw or kept[1] != logged or kept[2].closed:
        if raw.prepare_threshold is None:
            # Django leaves psycopg's automatic preparing off; this cursor asks for it
            # statement by statement, which psycopg only allows with some threshold set.
            raw.prepare_threshold = _ONLY_WHEN_ASKED
        factory = raw.cursor_factory
        raw.cursor_factory = preparing
        try:
            cursor = db.cursor()
        finally:
            raw.cursor_factory = factory
        kept = db._durable_cursor = (raw, logged, cursor)
    wrapped = kept[2]
    return _KeptCursor(db, wrapped.cursor, wrapped if logged or db.execute_wrappers else None)


class _KeptCursor:
    """``with sql_cursor() as cursor:`` for a kept cursor: leaving does not close it.
    Either Django's wrapper of it (``wrapped``) or this, which keeps only what that
    wrapper does for a statement when nothing wraps or logs it."""

    __slots__ = ("db", "cursor", "wrapped")

    def __init__(self, db, cursor, wrapped):
        self.db = db
        self.cursor = cursor
        self.wrapped = wrapped

    def __enter__(self):
        return self.wrapped if self.wrapped is not None else self

    def __exit__(self, *exc_info) -> None:
        return None

    def execute(self, sql, params=None):
        db = self.db
        db.validate_no_broken_transaction()
        with db.wrap_database_errors:
            return self.cursor.execute(sql, params)

    def fetchone(self):
        return self.cursor.fetchone()

    def fetchall(self):
        return self.cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount


_ONLY_WHEN_ASKED = 2**31 - 1


def _prepares(db) -> bool:
    """Unless turned off, or the project's ``OPTIONS`` say ``prepare_threshold: None``."""
    options = db.settings_dict.get("OPTIONS") or {}
    return bool(conf.get("PREPARED_STATEMENTS")) and options.get("prepare_threshold", 0) is not None


_PREPARING_CURSOR: list = []


def _preparing_cursor_class():
    """Django's server-binding cursor, preparing every statement it executes (once per
    connection: psycopg keeps the prepared statements of the last 100 texts)."""
    if not _PREPARING_CURSOR:
        try:
            import psycopg
            from django.db.backends.postgresql.base import ServerBindingCursor
        except (ImportError, ImproperlyConfigured):  # no psycopg 3 (SQLite only, or psycopg2)
            _PREPARING_CURSOR.append(None)
        else:

            class PreparingCursor(ServerBindingCursor):
                _executed: tuple = ("", None)

                def execute(self, query, params=None, *, prepare=None, **kwargs):
                    self._executed = (query, params)
                    return super().execute(query, params, prepare=prepare is not False, **kwargs)

                # Django's query log (DEBUG, debug toolbars, assertNumQueries) reads the
                # statement with its values from ``cursor._query.query``, which only a
                # client-binding cursor keeps: this one writes it out when it is read.
                @property
                def _query(self):
                    query, params = self._executed
                    client = psycopg.ClientCursor(self.connection)
                    return SimpleNamespace(query=client.mogrify(query, params).encode())

                @_query.setter
                def _query(self, value):
                    pass

            _PREPARING_CURSOR.append(PreparingCursor)
    return _PREPARING_CURSOR[0]


def notify_due(queue: str) -> None:
    """Wake idle workers on PostgreSQL; delivered when the transaction commits."""
    if is_postgres():
        with sql_cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [conf.get("NOTIFY_CHANNEL"), queue])


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
