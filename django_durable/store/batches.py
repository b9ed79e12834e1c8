"""Starting many runs of one workflow at once (``start_many``): one statement per
batch on PostgreSQL.

START_BATCH inserts a batch of runs that share their workflow, queue, priority and
due time, and reads back, for each one whose key was taken, the key's holder, in
the same statement: the items come in as arrays (``unnest``), each keeps its place
(``ord``), and ``ON CONFLICT DO NOTHING`` leaves a taken key to its holder, as for
one start (``durable_run_one_holder_per_key`` arbitrates). The holder is read with
the statement's snapshot: a holder whose insert committed while this one waited on
it is not seen, and that item comes back with neither (the caller starts it alone).

``record_duplicates`` writes the activity rows of the items whose holders answered,
in one more statement.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from django_durable import conf
from django_durable.models import Activity
from django_durable.store.base import as_json, engine, fetchall, now

__all__ = ["BatchAnswer", "record_duplicates", "start_batch"]


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
    them; one answer per item, in order. Only where the engine has START_BATCH
    (PostgreSQL: its ``BATCHES``)."""
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
    rows = fetchall(engine().START_BATCH, params)
    return [
        BatchAnswer(True)
        if inserted
        else BatchAnswer(False, holder_id, status, started is not None, bool(changed))
        for _ord, inserted, holder_id, status, started, changed, _woke in rows
    ]


def record_duplicates(
    workflow: str, duplicates: Sequence[tuple[uuid.UUID, str | None, dict]], *, at: datetime
) -> None:
    """The ``key_duplicate`` activity rows of a batch's items that their holders
    answered, one per ``(holder id, key, details)``, in one statement."""
    Activity.objects.bulk_create(
        Activity(
            kind=Activity.Kind.KEY_DUPLICATE,
            run_id=holder_id,
            workflow=workflow,
            key=key,
            details=details,
            created_at=at,
        )
        for holder_id, key, details in duplicates
    )
