"""What every store module shares: the clock, the vendor, quoting, LeaseLost."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.utils import timezone

from .. import conf
from ..models import (
    Run,
    Status,
    StepAttempt,
)


class LeaseLost(Exception):
    """This worker no longer owns the run (cancelled, recovered elsewhere, finished)."""


def now() -> datetime:
    return timezone.now()


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def _qn(name: str) -> str:
    return connection.ops.quote_name(name)


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


def notify_due(queue: str) -> None:
    """Wake idle workers on PostgreSQL; delivered when the transaction commits."""
    if is_postgres():
        with connection.cursor() as cursor:
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
