"""Claiming due runs, and when the next one is due: both read the claim index
``durable_run_claim`` (queue, priority DESC, due_at) over the claimable statuses,
queue by queue, highest priority first, then oldest due.

Two queue rules take part in every claim: a paused queue (a ``durable_queue`` row
with ``paused``) is not claimed from, and a queue with a concurrency limit
(``DURABLE["QUEUES"][name]["concurrency"]``) gets only the room its limit leaves
beside the runs of that queue already running, whichever worker runs them.

How the limit holds across workers (PostgreSQL): the claimers of a limited queue
take a transaction-level advisory lock per limited queue (LOCK_LIMITED_QUEUES)
before CLAIM, in one short transaction. The lock serialises them, and CLAIM, a
new statement, takes its snapshot after the lock: it counts the runs the previous
holder of the lock claimed and committed. Counting inside the statement that
waited for a row lock would not do: in READ COMMITTED a statement's snapshot
predates its lock waits. Oban's global limits and DBOS's queue concurrency
serialise their fetchers on one row per queue for the same reason. Queues without
a limit take no lock and claim as before, in one statement.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from django_durable import conf
from django_durable.models import CLAIMABLE_STATUSES, QueueState, Run
from django_durable.store import flow, observers
from django_durable.store.base import atomic, db, fetchall, fetchone, from_row, is_postgres, now

__all__ = ["claim", "next_due_at"]

# Serialise the claimers of the limited queues %(names)s (PostgreSQL): one
# transaction-level advisory lock per queue, taken in name order (no deadlock
# between two claimers of overlapping queues), released at commit.
LOCK_LIMITED_QUEUES = """
SELECT count(pg_advisory_xact_lock(hashtextextended('django_durable.queue:' || name, 0)))
FROM (SELECT name FROM unnest(%(names)s::text[]) AS name ORDER BY name) AS limited
"""

# Claim up to %(limit)s due runs in one statement (PostgreSQL): a call of
# durable_claim_v2 (django_durable/migrations/sql/durable_claim_v2.sql says how: the
# queues served, their room, the runs picked through durable_run_claim with FOR
# UPDATE SKIP LOCKED, and with flow keys due, the flow limits and turns through
# durable_run_flow; store/functions.py why a function). The claimed runs' columns,
# in the model's field order.
CLAIM = """
SELECT id, workflow, queue, status, priority, input, context, result, error, "key",
    holds_key, runs_after_id, parent_id, step_index, attempt, due_at, timeout_at,
    debounce_deadline, waiting_for, state, worker_id, lease_expires_at, fence,
    recoveries, step_names, trace_context, created_at, started_at, finished_at,
    rerun_of_id, rerun_from_step, inputs, flow_key
FROM durable_claim_v2(
    %(queues)s::text[], %(limit)s::integer, %(limited)s::text[], %(caps)s::integer[],
    %(workflows)s::text[], %(prefixes)s::text[], %(worker_id)s::varchar, %(lease)s::interval,
    %(flow_workflows)s::text[], %(key_caps)s::integer[], %(flow_caps)s::integer[],
    %(rates)s::integer[], %(pers)s::interval[]
)
"""


def priority_levels(queue: str) -> str:
    """``levels``: the priority levels in use among the claimable runs of the queue
    named by the SQL expression ``queue``, highest first, read from durable_run_claim
    by a loose index scan (one probe per level), as durable_next_due_at_v1 reads them:
    for the queue depth (store.depth); composed once, at import."""
    return f"""    WITH RECURSIVE levels(priority) AS (
        (SELECT priority FROM durable_run
         WHERE queue = {queue}
           AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
         ORDER BY priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT priority FROM durable_run
                WHERE queue = {queue}
                  AND status IN ('pending', 'waiting', 'compensating') AND due_at IS NOT NULL
                  AND priority < levels.priority
                ORDER BY priority DESC LIMIT 1)
        FROM levels
        WHERE levels.priority IS NOT NULL
    )
"""


# When the next claimable run of the open queues is due (PostgreSQL), for an idle
# worker's wait: a call of durable_next_due_at_v1 (its migration's file says how).
NEXT_DUE_AT = """
SELECT durable_next_due_at_v1(
    %(queues)s::text[], %(limit)s::integer, %(limited)s::text[], %(caps)s::integer[]
)
"""

# The columns CLAIM returns, in its order (tests/test_statements.py checks them
# against the model).
CLAIMED_COLUMNS = (
    "id",
    "workflow",
    "queue",
    "status",
    "priority",
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
    "trace_context",
    "created_at",
    "started_at",
    "finished_at",
    "rerun_of_id",
    "rerun_from_step",
    "inputs",
    "flow_key",
)


def _limits_served(queues: Sequence[str] | None, limits: Mapping[str, int]) -> dict[str, int]:
    """The limited queues among those served (None: every queue)."""
    if queues is None:
        return dict(limits)
    return {name: cap for name, cap in limits.items() if name in queues}


def _queue_params(queues: Sequence[str] | None, limits: Mapping[str, int], postgres: bool) -> dict:
    if postgres:
        return {
            "queues": list(queues) if queues else None,
            "limited": list(limits),
            "caps": list(limits.values()),
        }
    return {
        "queues": json.dumps(list(queues)) if queues else None,
        "caps": json.dumps(dict(limits)),
    }


def _workflow_params(
    workflows: Sequence[str] | None, prefixes: Sequence[str], postgres: bool
) -> dict:
    if postgres:
        return {
            "workflows": None if workflows is None else list(workflows),
            "prefixes": [p.replace("%", r"\%").replace("_", r"\_") + "%" for p in prefixes],
        }
    return {
        "workflows": None if workflows is None else json.dumps(list(workflows)),
        "prefixes": json.dumps(list(prefixes)),
    }


def claim(
    *,
    worker_id: str,
    queues: Sequence[str] | None,
    limit: int,
    lease: timedelta,
    limits: Mapping[str, int] | None = None,
    workflows: Sequence[str] | None = None,
    prefixes: Sequence[str] = (),
    flow_limits: Mapping[str, flow.FlowLimit] | None = None,
) -> list[Run]:
    """Claim up to ``limit`` due runs of ``queues`` (None: every queue), highest
    priority first, then oldest due (in turns across flow keys), leaving paused
    queues alone and a limited queue (``limits``: queue -> concurrency, by default
    those of ``DURABLE["QUEUES"]``) no more than its room, a workflow with flow limits
    (``flow_limits``: name -> ``flow.FlowLimit``, by default ``flow.source``'s) no
    more than they allow, and only runs of ``workflows`` (None: any) or of names
    starting with one of ``prefixes``: CLAIM in one statement, after
    LOCK_LIMITED_QUEUES in one transaction when a limited queue is served
    (flow.CLAIM_SQLITE on SQLite, then its turns)."""
    watcher = observers.claim_watcher  # telemetry's, when installed
    started = time.perf_counter() if watcher is not None else 0.0
    connection = db()  # looked up once: each look-up costs a thread-local read
    postgres = connection.vendor == "postgresql"
    at = now(connection)
    if limits is None:
        limits = conf.queue_limits()
    served_limits = _limits_served(queues, limits)
    params = {
        "worker_id": worker_id,
        "limit": limit,
        **_queue_params(queues, served_limits, postgres),
        **_workflow_params(workflows, prefixes, postgres),
        **flow.flow_params(
            flow.served_limits(flow_limits, workflows, prefixes), postgres, at, connection
        ),
    }
    if postgres:
        params["lease"] = lease  # from the database's clock, in the statement
    else:
        params.update(now=at, lease_expires_at=at + lease)  # from this process's
    if not postgres:  # SQLite needs the backend's own datetime conversions
        runs = list(Run.objects.raw(flow.CLAIM_SQLITE, params))
        flow.take_turns_sqlite(runs, at, connection)  # turns only order: no transaction
    elif served_limits:
        with atomic():
            fetchone(LOCK_LIMITED_QUEUES, {"names": sorted(served_limits)}, connection)
            rows = fetchall(CLAIM, params, connection)
        runs = [from_row(Run, CLAIMED_COLUMNS, row, connection) for row in rows]
    else:
        rows = fetchall(CLAIM, params, connection)
        runs = [from_row(Run, CLAIMED_COLUMNS, row, connection) for row in rows]
    if watcher is not None:
        watcher(runs, time.perf_counter() - started, lease, queues)
    runs.sort(key=lambda r: (-r.priority, r.due_at or at, r.created_at))
    return runs


def next_due_at(
    queues: Sequence[str] | None, limits: Mapping[str, int] | None = None
) -> datetime | None:
    """When the next claimable run of the open ``queues`` (None: every queue) becomes
    due; a limited queue with no room left is not counted (on PostgreSQL)."""
    if limits is None:
        limits = conf.queue_limits()
    postgres = is_postgres()
    if not postgres:
        runs = Run.objects.filter(status__in=CLAIMABLE_STATUSES, due_at__isnull=False).exclude(
            queue__in=QueueState.objects.filter(paused=True).values("name")
        )
        if queues:
            runs = runs.filter(queue__in=list(queues))
        return runs.order_by("due_at").values_list("due_at", flat=True).first()
    params = _queue_params(queues, _limits_served(queues, limits), postgres)
    params["limit"] = 1
    return fetchone(NEXT_DUE_AT, params)[0]
