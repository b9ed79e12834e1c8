"""Worker processes: registration, leases, the LISTEN connection."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import connections
from django.db.models import Q

from django_durable.models import HELD_STATUSES, Run, WorkerNode
from django_durable.store.base import (
    atomic,
    db,
    db_now,
    engine,
    fetchone,
    notify_due,
    now,
    retry_deadlocks,
)

__all__ = [
    "WORKERS_KEPT",
    "Listener",
    "forget_dead_workers",
    "notify_runs_due",
    "open_listener",
    "register_worker",
    "renew_leases",
    "refuses_writes",
    "reset_connection_after_error",
    "unregister_worker",
    "worker_heartbeat",
]

# A stopped or dead worker's row is kept this long after its last heartbeat (the
# Workers page shows it as stopped or gone), then ``forget_dead_workers`` deletes it.
WORKERS_KEPT = timedelta(hours=24)

# --- worker ---------------------------------------------------------------------
# Registration of worker processes, lease renewal for the runs a worker holds,
# the next due time (so an idle worker wakes for timers), and the dedicated
# LISTEN connection.


@retry_deadlocks  # workers starting together, on an alias at SERIALIZABLE
def register_worker(
    worker_id: str,
    *,
    hostname: str,
    pid: int,
    queues: list[str],
    concurrency: int,
    stale_before: datetime,
    workflows: list[str] | None = None,
) -> bool:
    """Record a live worker and the workflows it serves (None: any); False when a worker
    with this id heartbeated after ``stale_before`` (a second process started with the
    same ``--worker-id``)."""
    at = now()
    fields = {
        "hostname": hostname,
        "pid": pid,
        "queues": queues,
        "concurrency": concurrency,
        "workflows": workflows,
        "started_at": at,
        "heartbeat_at": at,
        "stopping": False,
    }
    with atomic():
        node = WorkerNode.objects.select_for_update().filter(id=worker_id).first()
        if node is not None and node.heartbeat_at >= stale_before and not node.stopping:
            return False
        WorkerNode.objects.update_or_create(id=worker_id, defaults=fields)
    return True


def worker_heartbeat(worker_id: str, *, stopping: bool) -> None:
    WorkerNode.objects.filter(id=worker_id).update(heartbeat_at=now(), stopping=stopping)


def unregister_worker(worker_id: str) -> None:
    """A worker's clean stop: its row stays, marked stopping, its last heartbeat now
    (the Workers page shows it as stopped until ``forget_dead_workers`` deletes it;
    the same id may register again at once)."""
    WorkerNode.objects.filter(id=worker_id).update(stopping=True, heartbeat_at=now())


def forget_dead_workers(before: datetime) -> int:
    """Delete worker rows, stopped or dead, whose last heartbeat is older than
    ``before`` (their runs are recovered through their leases, not through these
    rows)."""
    deleted, _ = WorkerNode.objects.filter(heartbeat_at__lt=before).delete()
    return deleted


def renew_leases(
    worker_id: str, owned: Sequence[tuple[uuid.UUID, int]], lease: timedelta
) -> dict[uuid.UUID, tuple[str, int] | None]:
    """Extend the leases of the runs a worker executes, each fenced by its claim.

    Returns the runs it no longer owns, each with its current ``(status, fence)``
    (None if deleted): cancelled, recovered by another worker, or just finished.
    One statement when nothing was lost, two otherwise.
    """
    if not owned:
        return {}
    claims = Q()
    for run_id, fence in owned:
        claims |= Q(id=run_id, fence=fence)
    still = Run.objects.filter(claims, worker_id=worker_id, status__in=HELD_STATUSES)
    if still.update(lease_expires_at=db_now() + lease) == len(owned):
        return {}
    kept = set(still.values_list("id", flat=True))
    lost = {run_id for run_id, _fence in owned} - kept
    found = {
        run_id: (status, fence)
        for run_id, status, fence in Run.objects.filter(id__in=lost).values_list(
            "id", "status", "fence"
        )
    }
    return {run_id: found.get(run_id) for run_id in lost}


def notify_runs_due(run_ids: Sequence[uuid.UUID]) -> None:
    """NOTIFY once per queue of ``run_ids`` (runs handed back or recovered just now)."""
    if not run_ids or engine().NOTIFY is None:
        return
    queues = Run.objects.filter(id__in=list(run_ids)).values_list("queue", flat=True)
    for queue in set(queues):
        notify_due(queue)


def reset_connection_after_error(*, drop: bool = False) -> None:
    """Drop this thread's connection if an error left it unusable (only after errors:
    a worker keeps its connections for its whole life, whatever CONN_MAX_AGE says);
    with ``drop``, even if it still answers: a session on a standby (a read-only
    error) answers, and only a new connection finds the primary (libpq's multi-host
    ``HOST`` with ``target_session_attrs=read-write``)."""
    connection = db()
    if connection.in_atomic_block or connection.connection is None:
        return  # no connection yet, or the caller's transaction decides
    if drop or not connection.is_usable():
        connection.close()  # the next query reconnects


def refuses_writes() -> bool:
    """Does the database's session refuse writes (a standby, a read-only session)?
    Asked after a step's own write was refused (SQLSTATE 25006), to tell a failover
    from a step writing to a read-only database of its own (False where the engine
    has no standby: SQLite)."""
    connection = db()
    statement = engine(connection).REFUSES_WRITES
    if statement is None:
        return False
    return bool(fetchone(statement, [], connection)[0])


class Listener:
    """A connection of its own that LISTENs on a channel for as long as a worker lives.

    It is a second Django connection to the alias (``connections.create_connection``),
    not the thread's: LISTEN must stay on one server session, which a pooler in
    transaction mode cannot promise (use a direct alias: ``DURABLE["LISTEN_DATABASE"]``).
    The LISTEN goes through Django's cursor; notifications are read with psycopg's
    ``Connection.notifies()``.
    """

    def __init__(self, channel: str, alias: str):
        self.connection = connections.create_connection(alias)
        try:
            with self.connection.cursor() as cursor:
                cursor.execute(listen_statement(self.connection, channel))
        except BaseException:
            self.connection.close()
            raise

    def notifies(self, timeout: float, stop_after: int | None = None):
        """The notifications that arrive within ``timeout`` seconds (at most
        ``stop_after`` of them)."""
        return self.connection.connection.notifies(timeout=timeout, stop_after=stop_after)

    def fileno(self) -> int:
        """The session's socket, to wait on with ``select`` beside other files: it is
        readable when a notification may have arrived (``notifies(timeout=0)`` reads it)."""
        return self.connection.connection.fileno()

    def close(self) -> None:
        self.connection.close()


def listen_statement(connection, channel: str) -> str:
    """The engine's LISTEN on ``channel``, quoted as an identifier by the backend."""
    return engine(connection).LISTEN.format(channel=connection.ops.quote_name(channel))


def open_listener(channel: str, alias: str = "default") -> Listener:
    return Listener(channel, alias)
