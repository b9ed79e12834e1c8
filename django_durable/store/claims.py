"""Claiming due runs, and when the next one is due: both read the claim index
``durable_run_claim`` (queue, due_at) queue by queue."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django_durable.models import CLAIMABLE_STATUSES, Run, Status
from django_durable.store.base import (
    _db,
    _literal,
    now,
    run_from_row,
    sql_cursor,
)


def claim(
    *, worker_id: str, queues: Sequence[str] | None, limit: int, lease: timedelta
) -> list[Run]:
    """Claim up to ``limit`` due runs, oldest due first, in one statement.

    On PostgreSQL the candidates are locked with ``FOR UPDATE SKIP LOCKED`` so
    concurrent workers claim different runs without waiting on each other; the
    lock lasts only as long as this statement. SQLite serialises writers, so the
    same statement is atomic there without row locks.
    """
    at = now()
    db = _db()
    ops = db.ops
    queues = list(queues or ())
    sql, per_queue = _claim_sql(db, len(queues))
    due_now = ops.adapt_datetimefield_value(at)
    if per_queue:  # in the order the statement names them: the queues come first
        params: list[Any] = [*queues, worker_id, ops.adapt_datetimefield_value(at + lease)]
        params += [due_now, due_now, limit, limit]
    else:
        params = [worker_id, ops.adapt_datetimefield_value(at + lease), due_now, due_now]
        params += [*queues, limit]
    if db.vendor == "postgresql":
        with sql_cursor(db) as cursor:
            cursor.execute(sql, params)
            runs = [run_from_row(_RUN_ATTNAMES, row) for row in cursor.fetchall()]
    else:  # SQLite needs the backend's datetime converters: let the ORM apply them
        runs = list(Run.objects.raw(sql, params))
    runs.sort(key=lambda r: (r.due_at or at, r.created_at))
    return runs


_CLAIM_SQL: dict[tuple[str, int], tuple[str, bool]] = {}
_RUN_ATTNAMES = [field.attname for field in Run._meta.concrete_fields]


def claimable_sql(db) -> str:
    """The condition of the partial claim index (statuses as literals, see below)."""
    qn = db.ops.quote_name
    statuses = ", ".join(_literal(s) for s in CLAIMABLE_STATUSES)
    return f"{qn('status')} IN ({statuses}) AND {qn('due_at')} IS NOT NULL"


def served_queues_sql(db, queues: int) -> str:
    """A CTE ``served(name)`` (PostgreSQL): the ``queues`` queues named by parameters,
    or, for 0, every queue with a claimable run, found by skipping through the claim
    index one queue at a time."""
    if queues:
        return f"served(name) AS (VALUES {', '.join(['(%s)'] * queues)}) "
    qn = db.ops.quote_name
    table, queue, indexed = qn(Run._meta.db_table), qn("queue"), claimable_sql(db)
    return (
        f"RECURSIVE served(name) AS ((SELECT {queue} FROM {table} WHERE {indexed} "
        f"ORDER BY {queue} LIMIT 1) UNION ALL SELECT (SELECT {queue} FROM {table} "
        f"WHERE {indexed} AND {queue} > served.name ORDER BY {queue} LIMIT 1) "
        "FROM served WHERE served.name IS NOT NULL) "
    )


def _claim_sql(db, queues: int) -> tuple[str, bool]:
    """The claim statement for a worker of ``queues`` queues (0: every queue), and
    whether it picks per queue.

    On PostgreSQL the claim picks the oldest due runs of each queue served through
    ``durable_run_claim`` (queue, due_at), then claims the oldest of those: it reads
    about as many index entries as it claims per queue, however many runs wait in
    any queue. A worker of every queue first finds the queues that have claimable
    runs by skipping through the same index, one probe per queue. Statuses are
    literals, not parameters: a prepared claim's generic plan can then prove that
    the partial index applies. SQLite has no LATERAL: one ordered scan.
    """
    cached = _CLAIM_SQL.get((db.vendor, queues))
    if cached is not None:
        return cached
    qn = db.ops.quote_name
    table = qn(Run._meta.db_table)
    status, due_at, queue, id_ = qn("status"), qn("due_at"), qn("queue"), qn("id")
    compensating = _literal(Status.COMPENSATING)
    indexed = claimable_sql(db)
    per_queue = db.vendor == "postgresql"
    served = served_queues_sql(db, queues) if per_queue else ""
    if per_queue:
        picked = (
            f"SELECT picked.{id_} FROM served CROSS JOIN LATERAL (SELECT {id_}, {due_at} "
            f"FROM {table} WHERE {queue} = served.name AND {indexed} AND {due_at} <= %s "
            f"ORDER BY {due_at} LIMIT %s FOR UPDATE SKIP LOCKED) AS picked "
            f"ORDER BY picked.{due_at} LIMIT %s"
        )
    else:
        of_queues = f" AND {queue} IN ({', '.join(['%s'] * queues)})" if queues else ""
        picked = (
            f"SELECT {id_} FROM {table} WHERE {indexed} AND {due_at} <= %s{of_queues} "
            f"ORDER BY {due_at} LIMIT %s"
        )
    columns = ", ".join(qn(f.column) for f in Run._meta.concrete_fields)
    # A claimed compensating run stays compensating (cancel() must keep refusing
    # it) and stops being due while it is owned.
    sql = (
        f"{'WITH ' + served if served else ''}"
        f"UPDATE {table} SET {status} = CASE WHEN {status} = {compensating} THEN "
        f"{compensating} ELSE {_literal(Status.RUNNING)} END, "
        f"{due_at} = CASE WHEN {status} = {compensating} THEN NULL ELSE {due_at} END, "
        f"{qn('worker_id')} = %s, {qn('lease_expires_at')} = %s, "
        f"{qn('fence')} = {qn('fence')} + 1, "
        f"{qn('started_at')} = COALESCE({qn('started_at')}, %s) "
        f"WHERE {id_} IN ({picked}) RETURNING {columns}"
    )
    _CLAIM_SQL[(db.vendor, queues)] = (sql, per_queue)
    return sql, per_queue


def next_due_at(queues: Sequence[str] | None) -> datetime | None:
    """When the next claimable run of ``queues`` becomes due (the claim index answers
    it: on PostgreSQL the first entry of each queue served, see ``served_queues_sql``)."""
    db = _db()
    if db.vendor != "postgresql":
        runs = Run.objects.filter(status__in=CLAIMABLE_STATUSES, due_at__isnull=False)
        if queues:
            runs = runs.filter(queue__in=list(queues))
        return runs.order_by("due_at").values_list("due_at", flat=True).first()
    queues = list(queues or ())
    qn = db.ops.quote_name
    due_at = qn("due_at")
    sql = (
        f"WITH {served_queues_sql(db, len(queues))}SELECT min(first.{due_at}) FROM served "
        f"CROSS JOIN LATERAL (SELECT {due_at} FROM {qn(Run._meta.db_table)} "
        f"WHERE {qn('queue')} = served.name AND {claimable_sql(db)} "
        f"ORDER BY {due_at} LIMIT 1) AS first"
    )
    with sql_cursor(db) as cursor:
        cursor.execute(sql, queues)
        return cursor.fetchone()[0]
