"""Claiming due runs, and when the next one is due: both read the claim index
``durable_run_claim`` (queue, due_at) over the claimable statuses, queue by queue."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta

from django_durable.models import CLAIMABLE_STATUSES, Run
from django_durable.store.base import fetchall, fetchone, from_row, is_postgres, now

__all__ = ["claim", "next_due_at"]

# The queues a claim serves (PostgreSQL): those named by %(queues)s, or when that is
# NULL every queue with a claimable run, found by skipping through durable_run_claim
# one queue at a time (a loose index scan: one probe per queue, however many runs
# wait). The conditions repeat the claim index's own, so the planner can use it.
_SERVED_QUEUES = """
RECURSIVE served(name) AS (
    (SELECT unnest(%(queues)s::text[]) AS name)
    UNION ALL
    (SELECT queue FROM durable_run
     WHERE %(queues)s::text[] IS NULL
       AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT queue FROM durable_run
            WHERE status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
              AND queue > served.name
            ORDER BY queue LIMIT 1)
    FROM served
    WHERE %(queues)s::text[] IS NULL AND served.name IS NOT NULL
)
"""

# Claim up to %(limit)s due runs, oldest due first, in one statement (PostgreSQL).
# ``picked`` takes the oldest due runs of each queue served through durable_run_claim
# (it reads about as many index entries as it claims per queue) and locks them with
# FOR UPDATE SKIP LOCKED, so concurrent workers claim different runs without waiting
# on each other; MATERIALIZED keeps the planner from folding it into the UPDATE,
# which would lock rows the LIMIT then drops; the UPDATE takes the picked rows by
# primary key (an array of ids: a plan that cannot turn into a scan of the table,
# whatever a generic plan guesses of how many were picked). The lock lasts only
# this statement. Due and lease times are the database's clock (statement_timestamp(),
# not now(): a caller's transaction does not stop it), so a
# worker whose own clock is off neither claims early nor sets a short lease; and a
# worker claims only runs of the workflows it knows (%(workflows)s; NULL: any), so a
# worker running older code leaves a new workflow's runs to one that has it.
# A claimed compensating run stays compensating (cancel() keeps refusing it) and
# stops being due while it is owned; the fence grows, so the previous owner's late
# writes no longer match.
CLAIM = (
    "WITH "
    + _SERVED_QUEUES
    + """,
picked AS MATERIALIZED (
    SELECT p.id, p.due_at
    FROM served
    CROSS JOIN LATERAL (
        SELECT id, due_at FROM durable_run
        WHERE queue = served.name
          AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
          AND due_at <= statement_timestamp()
          AND (%(workflows)s::text[] IS NULL OR workflow = ANY (%(workflows)s::text[])
               OR workflow LIKE ANY (%(prefixes)s::text[]))
        ORDER BY due_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS p
    WHERE served.name IS NOT NULL
    ORDER BY p.due_at
    LIMIT %(limit)s
)
UPDATE durable_run SET
    status = CASE WHEN status = 'compensating' THEN 'compensating' ELSE 'running' END,
    due_at = CASE WHEN status = 'compensating' THEN NULL ELSE durable_run.due_at END,
    worker_id = %(worker_id)s,
    lease_expires_at = statement_timestamp() + %(lease)s,
    fence = fence + 1,
    started_at = COALESCE(started_at, statement_timestamp())
WHERE durable_run.id = ANY (ARRAY(SELECT id FROM picked))
RETURNING durable_run.id, durable_run.workflow, durable_run.queue, durable_run.status,
    durable_run.input, durable_run.context, durable_run.result, durable_run.error,
    durable_run."key", durable_run.holds_key, durable_run.runs_after_id,
    durable_run.parent_id, durable_run.step_index, durable_run.attempt,
    durable_run.due_at, durable_run.timeout_at, durable_run.debounce_deadline,
    durable_run.waiting_for, durable_run.state, durable_run.worker_id,
    durable_run.lease_expires_at, durable_run.fence, durable_run.recoveries,
    durable_run.step_names, durable_run.created_at,
    durable_run.started_at, durable_run.finished_at
"""
)

# The same on SQLite, which serialises writers (no row locks needed) and has no
# LATERAL: one ordered scan of the due runs of the queues in %(queues)s (a JSON
# list), or of every queue when it is NULL.
CLAIM_SQLITE = """
UPDATE durable_run SET
    status = CASE WHEN status = 'compensating' THEN 'compensating' ELSE 'running' END,
    due_at = CASE WHEN status = 'compensating' THEN NULL ELSE due_at END,
    worker_id = %(worker_id)s,
    lease_expires_at = %(lease_expires_at)s,
    fence = fence + 1,
    started_at = COALESCE(started_at, %(now)s)
WHERE id IN (
    SELECT id FROM durable_run
    WHERE status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
      AND due_at <= %(now)s
      AND (%(queues)s IS NULL OR queue IN (SELECT value FROM json_each(%(queues)s)))
      AND (%(workflows)s IS NULL OR workflow IN (SELECT value FROM json_each(%(workflows)s))
           OR EXISTS (SELECT 1 FROM json_each(%(prefixes)s) AS p
                      WHERE substr(workflow, 1, length(p.value)) = p.value))
    ORDER BY due_at
    LIMIT %(limit)s
)
RETURNING *
"""

# When the next claimable run of the served queues is due (PostgreSQL): the first
# entry of each queue in durable_run_claim.
NEXT_DUE_AT = (
    "WITH "
    + _SERVED_QUEUES
    + """
SELECT min(first.due_at)
FROM served
CROSS JOIN LATERAL (
    SELECT due_at FROM durable_run
    WHERE queue = served.name
      AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
    ORDER BY due_at
    LIMIT 1
) AS first
"""
)

# The columns CLAIM returns, in its order (tests/test_statements.py checks them
# against the model).
CLAIMED_COLUMNS = (
    "id",
    "workflow",
    "queue",
    "status",
    "input",
    "context",
    "result",
    "error",
    "key",
    "holds_key",
    "runs_after_id",
    "parent_id",
    "step_index",
    "attempt",
    "due_at",
    "timeout_at",
    "debounce_deadline",
    "waiting_for",
    "state",
    "worker_id",
    "lease_expires_at",
    "fence",
    "recoveries",
    "step_names",
    "created_at",
    "started_at",
    "finished_at",
)


def claim(
    *,
    worker_id: str,
    queues: Sequence[str] | None,
    limit: int,
    lease: timedelta,
    workflows: Sequence[str] | None = None,
    prefixes: Sequence[str] = (),
) -> list[Run]:
    """Claim up to ``limit`` due runs of ``queues`` (None: every queue) and of
    ``workflows`` (None: any) or of names starting with one of ``prefixes``, oldest
    due first, in one statement (CLAIM, or CLAIM_SQLITE)."""
    at = now()
    params: dict = {"worker_id": worker_id, "limit": limit}
    if is_postgres():
        params["lease"] = lease
        params["queues"] = list(queues) if queues else None
        params["workflows"] = None if workflows is None else list(workflows)
        params["prefixes"] = [p.replace("%", r"\%").replace("_", r"\_") + "%" for p in prefixes]
        rows = fetchall(CLAIM, params)
        runs = [from_row(Run, CLAIMED_COLUMNS, row) for row in rows]
    else:  # SQLite needs the backend's own datetime conversions: the ORM applies them
        params.update(now=at, lease_expires_at=at + lease)
        params["workflows"] = None if workflows is None else json.dumps(list(workflows))
        params["prefixes"] = json.dumps(list(prefixes))
        params["queues"] = json.dumps(list(queues)) if queues else None
        runs = list(Run.objects.raw(CLAIM_SQLITE, params))
    runs.sort(key=lambda r: (r.due_at or at, r.created_at))
    return runs


def next_due_at(queues: Sequence[str] | None) -> datetime | None:
    """When the next claimable run of ``queues`` (None: every queue) becomes due."""
    if not is_postgres():
        runs = Run.objects.filter(status__in=CLAIMABLE_STATUSES, due_at__isnull=False)
        if queues:
            runs = runs.filter(queue__in=list(queues))
        return runs.order_by("due_at").values_list("due_at", flat=True).first()
    return fetchone(NEXT_DUE_AT, {"queues": list(queues) if queues else None})[0]
