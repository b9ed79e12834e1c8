"""Handing a finished holder's key to a new run: the key's release, the new run and
the ``key_handed_off`` activity row, all or nothing."""

from __future__ import annotations

import uuid

from django_durable.models import Activity
from django_durable.store.base import as_json, atomic, db, engine, fetchone
from django_durable.store.holders import release_key
from django_durable.store.starts import (
    NewRun,
    insert_run,
    record_activity,
    run_params,
    wake_params,
)

__all__ = ["hand_off"]


class _Retry(Exception):
    pass


def hand_off(run: NewRun, holder_id: uuid.UUID, holder_status: str) -> bool:
    """Take the key of the finished holder ``holder_id`` for the new ``run``: release
    it (if it still holds the key in ``holder_status``), insert ``run`` and record the
    hand-off, all or nothing. False (nothing written) when the holder moved on.

    One statement where the engine has HAND_OFF (PostgreSQL); elsewhere the same
    writes in a transaction.
    """
    details = {"from_run_id": str(holder_id), "to_run_id": str(run.id)}
    connection = db()
    statement = engine(connection).HAND_OFF
    if statement is None:
        try:
            with atomic():
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
    params = run_params(run, connection)
    params.update(wake_params(run, connection))
    params.update(
        holder_id=holder_id,
        holder_status=holder_status,
        details=as_json({"key": run.key, "workflow": run.workflow, **details}),
    )
    return fetchone(statement, params, connection) is not None
