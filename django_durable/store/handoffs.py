"""Handing a finished holder's key to a new run: the key's release, the new run and
the ``key_handed_off`` activity row, all or nothing."""

from __future__ import annotations

import uuid

from django_durable.models import Activity
from django_durable.store.base import as_json, atomic, db, fetchone
from django_durable.store.holders import release_key
from django_durable.store.starts import (
    NewRun,
    insert_run,
    record_activity,
    run_params,
    wake_params,
)

__all__ = ["HAND_OFF", "hand_off"]

# Hand a finished holder's key to a new run (PostgreSQL), all or nothing, in one
# statement: ``released`` lets the key go if the holder still holds it in the status
# the start saw (found by its primary key: "holds_key IS NOT FALSE" matches no partial
# index of holders, which stale statistics once made the planner scan whole);
# ``new`` inserts the run only if that happened (the released version no longer
# counts for the unique index within the statement); ``noted`` records the hand-off;
# and the NOTIFY wakes a worker.
HAND_OFF = """
WITH released AS (
    UPDATE durable_run SET holds_key = false
    WHERE id = %(holder_id)s AND holds_key IS NOT FALSE AND status = %(holder_status)s
    RETURNING id
),
new AS (
    INSERT INTO durable_run (
        id, workflow, queue, status, priority, input, context, result, error, "key",
        holds_key, runs_after_id, parent_id, step_index, attempt, due_at,
        timeout_at, debounce_deadline, waiting_for, state, worker_id,
        lease_expires_at, fence, recoveries, step_names, trace_context, created_at,
        started_at, finished_at, rerun_of_id, rerun_from_step, inputs, flow_key
    )
    SELECT
        %(id)s::uuid, %(workflow)s::varchar, %(queue)s::varchar, %(status)s::varchar,
        %(priority)s::integer, %(input)s::jsonb, %(context)s::jsonb, %(result)s::jsonb,
        %(error)s::jsonb, %(key)s::varchar, %(holds_key)s::boolean, %(runs_after_id)s::uuid,
        %(parent_id)s::uuid, %(step_index)s::integer, %(attempt)s::integer,
        %(due_at)s::timestamptz, %(timeout_at)s::timestamptz,
        %(debounce_deadline)s::timestamptz, %(waiting_for)s::varchar, %(state)s::jsonb,
        %(worker_id)s::varchar, %(lease_expires_at)s::timestamptz, %(fence)s::integer,
        %(recoveries)s::integer, %(step_names)s::jsonb, %(trace_context)s::jsonb,
        %(created_at)s::timestamptz, %(started_at)s::timestamptz,
        %(finished_at)s::timestamptz, %(rerun_of_id)s::uuid, %(rerun_from_step)s::varchar,
        %(inputs)s::jsonb, %(flow_key)s::varchar
    WHERE EXISTS (SELECT 1 FROM released)
    RETURNING id
),
noted AS (
    INSERT INTO durable_activity (kind, run_id, workflow, "key", details, created_at)
    SELECT 'key_handed_off', new.id, %(workflow)s, %(key)s, %(details)s::jsonb, %(created_at)s
    FROM new
    RETURNING 1
)
SELECT CASE WHEN %(wake)s THEN pg_notify(%(channel)s, %(queue)s)::text IS NULL ELSE false END,
       EXISTS (SELECT 1 FROM noted)
FROM new
"""


class _Retry(Exception):
    pass


def hand_off(run: NewRun, holder_id: uuid.UUID, holder_status: str) -> bool:
    """Take the key of the finished holder ``holder_id`` for the new ``run``: release
    it (if it still holds the key in ``holder_status``), insert ``run`` and record the
    hand-off, all or nothing. False (nothing written) when the holder moved on.

    On PostgreSQL one statement (HAND_OFF); elsewhere the same writes in a transaction.
    """
    details = {"from_run_id": str(holder_id), "to_run_id": str(run.id)}
    connection = db()
    if connection.vendor != "postgresql":
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
    return fetchone(HAND_OFF, params, connection) is not None
