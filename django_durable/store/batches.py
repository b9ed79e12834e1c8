"""Starting many runs of one workflow at once (``start_many``): one statement per
batch on PostgreSQL.

START_BATCH inserts a batch of runs that share their workflow, queue, priority and
due time, and reads back, for each one whose key was taken, the key's holder, in
the same statement: the items come in as arrays (``unnest``), each keeps its place
(``ord``), and ``ON CONFLICT DO NOTHING`` leaves a taken key to its holder, as for
one start (``durable_run_one_holder_per_key`` arbitrates). The holder is read with
the statement's snapshot: a holder whose insert committed while this one waited on
it is not seen, and that item comes back with neither (the caller starts it alone).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django_durable import conf
from django_durable.store.base import as_json, fetchall, now

__all__ = ["BatchAnswer", "start_batch"]

# One batch of new runs (PostgreSQL); every column of durable_run is named. The
# holders are found through durable_run_one_holder_per_key (one probe per taken
# key); ``wake`` sends one NOTIFY for the batch when its runs are due now (at
# commit). One row per item, in the items' order.
START_BATCH = """
WITH item AS (
    SELECT *
    FROM unnest(%(ids)s::uuid[], %(inputs)s::jsonb[], %(keys)s::text[], %(flow_keys)s::text[])
         WITH ORDINALITY AS i(id, input, "key", flow_key, ord)
),
new AS (
    INSERT INTO durable_run (
        id, workflow, queue, status, priority, input, context, result, error, "key",
        holds_key, runs_after_id, parent_id, step_index, attempt, due_at, timeout_at,
        debounce_deadline, waiting_for, state, worker_id, lease_expires_at, fence,
        recoveries, step_names, trace_context, created_at, started_at, finished_at,
        rerun_of_id, rerun_from_step, inputs, flow_key
    )
    SELECT item.id, %(workflow)s, %(queue)s, 'pending', %(priority)s, item.input,
           '{}'::jsonb, NULL, NULL, item.key, item.key IS NOT NULL, NULL, NULL, 0, 1,
           %(due_at)s::timestamptz, %(timeout_at)s::timestamptz, NULL, NULL, '{}'::jsonb,
           NULL, NULL, 0, 0, %(step_names)s::jsonb, %(trace_context)s::jsonb,
           %(created_at)s::timestamptz, NULL, NULL, NULL, NULL, NULL, item.flow_key
    FROM item
    ORDER BY item.ord
    ON CONFLICT DO NOTHING
    RETURNING id
),
wake AS (
    SELECT pg_notify(%(channel)s, %(queue)s) FROM (SELECT 1 FROM new LIMIT 1) AS any_new
    WHERE %(wake)s
)
SELECT item.ord, new.id IS NOT NULL, holder.id, holder.status, holder.started_at,
       holder.input IS DISTINCT FROM item.input,
       (SELECT count(*) FROM wake)
FROM item
LEFT JOIN new ON new.id = item.id
LEFT JOIN durable_run AS holder
       ON new.id IS NULL AND item.key IS NOT NULL
      AND holder.workflow = %(workflow)s AND holder.key = item.key AND holder.holds_key
ORDER BY item.ord
"""


class BatchAnswer(NamedTuple):
    """One item of a batch: inserted, or the holder of its key (``holder_id``,
    ``holder_status``, whether a worker picked it up, whether its input differs);
    neither when the holder could not be seen."""

    inserted: bool
    holder_id: uuid.UUID | None = None
    holder_status: str | None = None
    picked_up: bool = False
    input_changed: bool = False


def start_batch(
    *,
    workflow: str,
    queue: str,
    priority: int,
    due_at: datetime,
    timeout_at: datetime | None,
    step_names: Sequence[str],
    items: list[tuple[uuid.UUID, dict, str | None, str | None]],
    trace_context: dict | None = None,
) -> list[BatchAnswer]:
    """Insert ``items`` (id, input, key, flow key) as pending runs of ``workflow`` in one
    statement (START_BATCH), all with the ``trace_context`` of the call that started
    them; one answer per item, in order. PostgreSQL only."""
    at = now()
    params: dict[str, Any] = {
        "ids": [item[0] for item in items],
        "inputs": [as_json(item[1]) for item in items],
        "keys": [item[2] for item in items],
        "flow_keys": [item[3] for item in items],
        "workflow": workflow,
        "queue": queue,
        "priority": priority,
        "due_at": due_at,
        "timeout_at": timeout_at,
        "step_names": as_json(step_names),
        "trace_context": None if trace_context is None else as_json(trace_context),
        "created_at": at,
        "wake": due_at <= at,
        "channel": conf.get("NOTIFY_CHANNEL"),
    }
    rows = fetchall(START_BATCH, params)
    return [
        BatchAnswer(True)
        if inserted
        else BatchAnswer(False, holder_id, status, started is not None, bool(changed))
        for _ord, inserted, holder_id, status, started, changed, _woke in rows
    ]
