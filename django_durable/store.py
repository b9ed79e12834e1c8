"""The one module that talks SQL: inserts that respect keys, row locks, claims,
fenced writes of step results, recovery and pruning.

Everything here is a short statement or a short transaction. No row lock is
held while user code runs: a claim commits before the first step starts, and
every later write of the claiming worker is fenced (``fence`` must still be the
value the claim set, and the run must still be running).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q
from django.utils import timezone

from . import conf
from .models import (
    CLAIMABLE_STATUSES,
    FINISHED_STATUSES,
    Activity,
    Event,
    Run,
    Status,
    StepAttempt,
    WorkerNode,
)


class LeaseLost(Exception):
    """This worker no longer owns the run (cancelled, recovered elsewhere, finished)."""


def now() -> datetime:
    return timezone.now()


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def _qn(name: str) -> str:
    return connection.ops.quote_name(name)


# --- starting -----------------------------------------------------------------


def insert_run(run: Run) -> bool:
    """Insert ``run`` unless that breaks a key constraint; return whether it was inserted.

    ``ON CONFLICT DO NOTHING`` makes a taken key an answer, not an error: the
    statement never aborts the caller's transaction. On PostgreSQL, an insert
    that meets another transaction's uncommitted insert of the same key waits
    for it to commit (then does nothing) or roll back (then inserts).
    """
    fields = Run._meta.concrete_fields
    columns = ", ".join(_qn(f.column) for f in fields)
    values = [f.get_db_prep_save(f.pre_save(run, True), connection) for f in fields]
    placeholders = ", ".join(["%s"] * len(fields))
    sql = (
        f"INSERT INTO {_qn(Run._meta.db_table)} ({columns}) VALUES ({placeholders}) "
        f"ON CONFLICT DO NOTHING RETURNING {_qn('id')}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        inserted = cursor.fetchone() is not None
    if inserted:
        run._state.adding = False
        run._state.db = connection.alias
    return inserted


def create_run(run: Run) -> None:
    """Insert a run that cannot meet a key constraint (no key)."""
    run.save(force_insert=True)


HOLDER_FIELDS = (
    "id",
    "workflow",
    "status",
    "input",
    "started_at",
    "due_at",
    "debounce_deadline",
    "key",
    "holds_key",
)


def get_holder(workflow: str, key: str, *, lock: bool = False) -> Run | None:
    """The run holding ``key``; with ``lock``, its row stays locked until commit so a
    finishing holder and a start that waits behind it see each other."""
    runs = Run.objects.only(*HOLDER_FIELDS, "queue")
    if lock:
        runs = runs.select_for_update()
    return runs.filter(workflow=workflow, key=key, holds_key=True).first()


def release_key(run_id: uuid.UUID, *, statuses: Iterable[str]) -> bool:
    """Let ``run_id`` give up its key if it still holds it in one of ``statuses``."""
    return bool(
        Run.objects.filter(id=run_id, holds_key=True, status__in=list(statuses)).update(
            holds_key=False
        )
    )


def take_key(run_id: uuid.UUID) -> bool:
    """Make ``run_id`` the holder of its key again; False if another run holds it."""
    try:
        with transaction.atomic():
            return bool(Run.objects.filter(id=run_id, holds_key=False).update(holds_key=True))
    except IntegrityError:
        return False


def replace_holder(holder_id: uuid.UUID, error: dict) -> bool:
    """Cancel an active, non-compensating holder and free its key, in one statement."""
    at = now()
    return bool(
        Run.objects.filter(
            id=holder_id,
            holds_key=True,
            status__in=[Status.PENDING, Status.RUNNING, Status.WAITING],
        ).update(
            status=Status.CANCELLED,
            holds_key=False,
            error=error,
            finished_at=at,
            due_at=None,
            lease_expires_at=None,
        )
    )


def update_pending_input(run_id: uuid.UUID, input: dict, **fields: Any) -> bool:
    """Give a run that no worker has picked up a newer input (debounce, run_again)."""
    return bool(
        Run.objects.filter(id=run_id, status=Status.PENDING, started_at__isnull=True).update(
            input=input, **fields
        )
    )


def get_waiting_behind(workflow: str, key: str, *, lock: bool = False) -> Run | None:
    runs = Run.objects.only(*HOLDER_FIELDS, "runs_after", "queue")
    if lock:
        runs = runs.select_for_update()
    return runs.filter(
        workflow=workflow,
        key=key,
        holds_key=False,
        runs_after__isnull=False,
        status=Status.PENDING,
    ).first()


def update_waiting_input(run_id: uuid.UUID, input: dict) -> None:
    Run.objects.filter(id=run_id, status=Status.PENDING, holds_key=False).update(input=input)


def move_waiting_behind(workflow: str, key: str, holder_id: uuid.UUID) -> None:
    """The run waiting behind a replaced holder waits behind its replacement instead."""
    Run.objects.filter(
        workflow=workflow,
        key=key,
        status=Status.PENDING,
        holds_key=False,
        runs_after__isnull=False,
    ).exclude(id=holder_id).update(runs_after=holder_id)


def active_children(parent_id: uuid.UUID) -> list[uuid.UUID]:
    return list(
        Run.objects.filter(
            parent_id=parent_id, status__in=[Status.PENDING, Status.RUNNING, Status.WAITING]
        ).values_list("id", flat=True)
    )


def wait_behind(run_id: uuid.UUID, holder_id: uuid.UUID) -> None:
    Run.objects.filter(id=run_id, status=Status.PENDING, holds_key=False).update(
        runs_after=holder_id
    )


def take_key_and_run(run_id: uuid.UUID, *, timeout: timedelta | None) -> bool:
    """A waiting ``run_again`` run takes its key and becomes due; its timeout starts now."""
    at = now()
    try:
        with transaction.atomic():
            return bool(
                Run.objects.filter(id=run_id, status=Status.PENDING, holds_key=False).update(
                    holds_key=True,
                    due_at=at,
                    timeout_at=at + timeout if timeout else None,
                )
            )
    except IntegrityError:
        return False


def waiting_behind_finished() -> list[tuple[str, str]]:
    """Keys with a run waiting behind a holder that finished or no longer holds them."""
    waiting = Run.objects.filter(
        status=Status.PENDING, holds_key=False, runs_after__isnull=False
    ).exclude(
        runs_after__status__in=[
            Status.PENDING,
            Status.RUNNING,
            Status.WAITING,
            Status.COMPENSATING,
        ],
        runs_after__holds_key=True,
    )
    return list(waiting.values_list("workflow", "key")[:500])


def record_activity(
    kind: str, *, run_id: uuid.UUID | None, workflow: str, key: str | None, details: dict
) -> None:
    Activity.objects.create(
        kind=kind,
        run_id=run_id,
        workflow=workflow,
        key=key,
        details={"key": key, "workflow": workflow, **details},
        created_at=now(),
    )


def notify_due(queue: str) -> None:
    """Wake idle workers on PostgreSQL; delivered when the transaction commits."""
    if is_postgres():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [conf.get("NOTIFY_CHANNEL"), queue])


# --- acting on runs -------------------------------------------------------------


def cancel_run(run_id: uuid.UUID, error: Any) -> bool:
    """Mark an active run cancelled. Its key stays held: a status change never frees a key."""
    return bool(
        Run.objects.filter(
            id=run_id, status__in=[Status.PENDING, Status.RUNNING, Status.WAITING]
        ).update(
            status=Status.CANCELLED,
            error=error,
            finished_at=now(),
            due_at=None,
            lease_expires_at=None,
        )
    )


def resume_failed(run_id: uuid.UUID) -> bool:
    """A failed run becomes due again at the step that failed, with a fresh attempt count."""
    return bool(
        Run.objects.filter(id=run_id, status=Status.FAILED).update(
            status=Status.PENDING,
            attempt=1,
            due_at=now(),
            finished_at=None,
            worker_id=None,
            lease_expires_at=None,
        )
    )


# --- claiming -------------------------------------------------------------------


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
    ops = connection.ops
    table = _qn(Run._meta.db_table)
    params: list[Any] = [
        Status.RUNNING,
        worker_id,
        ops.adapt_datetimefield_value(at + lease),
        ops.adapt_datetimefield_value(at),
    ]
    where = [
        f"{_qn('status')} IN (%s, %s)",
        f"{_qn('due_at')} IS NOT NULL",
        f"{_qn('due_at')} <= %s",
    ]
    inner_params: list[Any] = [*CLAIMABLE_STATUSES, ops.adapt_datetimefield_value(at)]
    if queues:
        where.append(f"{_qn('queue')} IN ({', '.join(['%s'] * len(queues))})")
        inner_params.extend(queues)
    lock = " FOR UPDATE SKIP LOCKED" if is_postgres() else ""
    sql = (
        f"UPDATE {table} SET {_qn('status')} = %s, {_qn('worker_id')} = %s, "
        f"{_qn('lease_expires_at')} = %s, {_qn('fence')} = {_qn('fence')} + 1, "
        f"{_qn('started_at')} = COALESCE({_qn('started_at')}, %s) "
        f"WHERE {_qn('id')} IN (SELECT {_qn('id')} FROM {table} WHERE {' AND '.join(where)} "
        f"ORDER BY {_qn('due_at')} LIMIT %s{lock}) RETURNING *"
    )
    runs = list(Run.objects.raw(sql, [*params, *inner_params, limit]))
    runs.sort(key=lambda r: (r.due_at, r.created_at))
    return runs


def renew_lease(run: Run, lease: timedelta) -> None:
    """Extend the lease of a run this worker owns; ``LeaseLost`` if it no longer does."""
    updated = Run.objects.filter(id=run.id, fence=run.fence, status=run.status).update(
        lease_expires_at=now() + lease
    )
    if not updated:
        raise LeaseLost(run.id)


def renew_worker_leases(worker_id: str, lease: timedelta) -> int:
    return Run.objects.filter(
        worker_id=worker_id, status__in=[Status.RUNNING, Status.COMPENSATING]
    ).update(lease_expires_at=now() + lease)


def current_status(run_id: uuid.UUID) -> tuple[str, int] | None:
    row = Run.objects.filter(id=run_id).values_list("status", "fence").first()
    return tuple(row) if row else None


# --- recording steps (fenced) ---------------------------------------------------


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


def record_step_completed(
    run: Run,
    step_name: str,
    started_at: datetime,
    output: Any,
    *,
    last: bool,
) -> None:
    """Record a completed step and advance the run; the last step also finishes it."""
    at = now()
    changes: dict[str, Any] = {
        "step_index": run.step_index + 1,
        "attempt": 1,
        "context": run.context,
        "waiting_for": None,
    }
    if last:
        changes.update(
            status=Status.COMPLETED,
            result=output,
            finished_at=at,
            due_at=None,
            lease_expires_at=None,
        )
    with transaction.atomic():
        if not _owned(run).update(**changes):
            raise LeaseLost(run.id)
        _attempt(run, step_name, StepAttempt.Outcome.COMPLETED, started_at, output=output).save(
            force_insert=True
        )
    for name, value in changes.items():
        setattr(run, name, value)


def record_step_failed(
    run: Run,
    step_name: str,
    started_at: datetime,
    error: dict,
    *,
    retry_at: datetime | None,
) -> None:
    """Record a failed attempt: the run is due again at ``retry_at``, or fails for good."""
    if retry_at is not None:
        changes: dict[str, Any] = {
            "status": Status.PENDING,
            "attempt": run.attempt + 1,
            "due_at": retry_at,
            "worker_id": None,
            "lease_expires_at": None,
        }
    else:
        changes = {
            "status": Status.FAILED,
            "error": error,
            "finished_at": now(),
            "due_at": None,
            "lease_expires_at": None,
        }
    with transaction.atomic():
        if not _owned(run).update(**changes):
            raise LeaseLost(run.id)
        _attempt(run, step_name, StepAttempt.Outcome.FAILED, started_at, error=error).save(
            force_insert=True
        )
    for name, value in changes.items():
        setattr(run, name, value)


def record_run_failed(run: Run, error: dict) -> None:
    """Fail a run outside any step (its timeout passed, its definition vanished)."""
    changes = {
        "status": Status.FAILED,
        "error": error,
        "finished_at": now(),
        "due_at": None,
        "lease_expires_at": None,
    }
    if not _owned(run).update(**changes):
        raise LeaseLost(run.id)
    for name, value in changes.items():
        setattr(run, name, value)


def record_suspended(
    run: Run, step_name: str, started_at: datetime, context: dict, waits: list, wait
) -> None:
    """Suspend the run in a wait and free the worker.

    The run row is locked so that an event sent at the same moment is either
    seen here (kept, then delivered at once) or finds the run waiting.
    """
    slot = None if wait.kind == "sleep" else f"{wait.kind}:{wait.name}"
    with transaction.atomic():
        locked = _owned(run).select_for_update().only("id", "state").first()
        if locked is None:
            raise LeaseLost(run.id)
        state = dict(locked.state or {})
        state["waits"] = waits
        state["pending"] = {
            "kind": wait.kind,
            "name": wait.name,
            "timeout_value": wait.timeout_value,
        }
        received = dict(state.get("received", {}))
        kept = None
        if wait.kind == "event":
            kept = (
                Event.objects.filter(
                    run_id=run.id, kind=Event.Kind.EVENT, name=wait.name, delivered_at__isnull=True
                )
                .order_by("-id")
                .first()
            )
        if kept is not None:
            # An event sent before the run waited for it: deliver the newest now.
            received[slot] = kept.payload
            Event.objects.filter(id=kept.id).update(delivered_at=now())
            changes: dict[str, Any] = {
                "status": Status.PENDING,
                "due_at": now(),
                "waiting_for": None,
            }
        else:
            due = wait.until
            if run.timeout_at is not None and (due is None or run.timeout_at < due):
                due = run.timeout_at
            changes = {
                "status": Status.WAITING,
                "due_at": due,
                "waiting_for": slot or "sleep",
            }
        state["received"] = received
        changes.update(state=state, context=context, worker_id=None, lease_expires_at=None)
        _owned(run).update(**changes)
        _attempt(run, step_name, StepAttempt.Outcome.SUSPENDED, started_at).save(force_insert=True)
    for name, value in changes.items():
        setattr(run, name, value)


def deliver(run_id: uuid.UUID, kind: str, name: str, payload: Any, *, keep: bool) -> str:
    """Give an event or input to a run: ``"delivered"`` when it was waiting for it,
    ``"kept"`` when it is kept for a later wait, ``"refused"`` otherwise.

    The run row is locked, so this and ``record_suspended`` never miss each other.
    """
    slot = f"{kind}:{name}"
    with transaction.atomic():
        run = (
            Run.objects.select_for_update()
            .only("id", "status", "waiting_for", "state", "queue")
            .get(id=run_id)
        )
        received = (run.state or {}).get("received", {})
        if run.status == Status.WAITING and run.waiting_for == slot and slot not in received:
            state = dict(run.state or {})
            state["received"] = {**received, slot: payload}
            Run.objects.filter(id=run_id).update(
                status=Status.PENDING, due_at=now(), waiting_for=None, state=state
            )
            Event.objects.create(
                run_id=run_id,
                kind=kind,
                name=name,
                payload=payload,
                created_at=now(),
                delivered_at=now(),
            )
            notify_due(run.queue)  # wake an idle worker for the resumed run
            return "delivered"
        if keep and run.status not in FINISHED_STATUSES:
            Event.objects.create(
                run_id=run_id, kind=kind, name=name, payload=payload, created_at=now()
            )
            return "kept"
        return "refused"


def record_attempt_cancelled(run: Run, step_name: str, started_at: datetime) -> None:
    _attempt(run, step_name, StepAttempt.Outcome.CANCELLED, started_at).save(force_insert=True)


def hand_back(run: Run) -> bool:
    """Return a claimed run to ``pending`` so another worker takes it (shutdown)."""
    return bool(
        _owned(run).update(
            status=Status.PENDING, worker_id=None, lease_expires_at=None, due_at=now()
        )
    )


# --- recovery -------------------------------------------------------------------


def recover_expired_leases() -> list[uuid.UUID]:
    """Return runs whose worker stopped heartbeating to ``pending``, counting the attempt.

    The fence grows at the next claim, so the worker that lost the run cannot
    record over its new owner even if it comes back.
    """
    at = now()
    with transaction.atomic():
        expired = list(
            Run.objects.select_for_update(skip_locked=True)
            .filter(status=Status.RUNNING, lease_expires_at__lt=at)
            .values_list("id", "step_index", "attempt", "workflow", "worker_id")[:500]
        )
        if not expired:
            return []
        ids = [row[0] for row in expired]
        Run.objects.filter(id__in=ids, status=Status.RUNNING).update(
            status=Status.PENDING,
            worker_id=None,
            lease_expires_at=None,
            attempt=F("attempt") + 1,
            due_at=at,
        )
        StepAttempt.objects.bulk_create(
            StepAttempt(
                run_id=run_id,
                step=f"#{step_index}",
                step_index=step_index,
                attempt=attempt,
                status=StepAttempt.Outcome.LOST,
                error={"type": "LeaseExpired", "message": f"worker {worker} stopped heartbeating"},
                worker_id=worker,
                started_at=at,
                finished_at=at,
            )
            for run_id, step_index, attempt, _workflow, worker in expired
        )
    return ids


# --- pruning --------------------------------------------------------------------


def prunable(before: datetime):
    """Finished runs that finished before ``before`` (children only with their parent)."""
    return Run.objects.filter(status__in=FINISHED_STATUSES, finished_at__lt=before).filter(
        Q(parent__isnull=True) | Q(parent__status__in=FINISHED_STATUSES)
    )


def prune_runs(before: datetime, batch_size: int) -> int:
    """Delete finished runs that finished before ``before``, a batch per transaction,
    so a large table is never locked for long. A deleted holder's key is free again."""
    total = 0
    while True:
        ids = list(prunable(before).values_list("id", flat=True)[:batch_size])
        if not ids:
            return total
        with transaction.atomic():
            Run.objects.filter(id__in=ids).update(runs_after=None)
            Run.objects.filter(runs_after_id__in=ids).update(runs_after=None)
            deleted, _ = Run.objects.filter(id__in=ids, status__in=FINISHED_STATUSES).delete()
        total += len(ids)
        if len(ids) < batch_size:
            return total


def prune_activity(before: datetime, batch_size: int) -> int:
    total = 0
    while True:
        ids = list(
            Activity.objects.filter(created_at__lt=before).values_list("id", flat=True)[:batch_size]
        )
        if not ids:
            return total
        Activity.objects.filter(id__in=ids).delete()
        total += len(ids)


# --- worker ---------------------------------------------------------------------
# Registration of worker processes, lease renewal for the runs a worker holds,
# the next due time (so an idle worker wakes for timers), and the dedicated
# LISTEN connection.


def register_worker(
    worker_id: str,
    *,
    hostname: str,
    pid: int,
    queues: list[str],
    concurrency: int,
    stale_before: datetime,
) -> bool:
    """Record a live worker; False when a worker with this id heartbeated after ``stale_before``
    (a second process started with the same ``--worker-id``)."""
    at = now()
    fields = {
        "hostname": hostname,
        "pid": pid,
        "queues": queues,
        "concurrency": concurrency,
        "started_at": at,
        "heartbeat_at": at,
        "stopping": False,
    }
    with transaction.atomic():
        node = WorkerNode.objects.select_for_update().filter(id=worker_id).first()
        if node is not None and node.heartbeat_at >= stale_before and not node.stopping:
            return False
        WorkerNode.objects.update_or_create(id=worker_id, defaults=fields)
    return True


def worker_heartbeat(worker_id: str, *, stopping: bool) -> None:
    WorkerNode.objects.filter(id=worker_id).update(heartbeat_at=now(), stopping=stopping)


def unregister_worker(worker_id: str) -> None:
    WorkerNode.objects.filter(id=worker_id).delete()


def forget_dead_workers(before: datetime) -> int:
    """Delete worker rows that stopped heartbeating before ``before`` (their runs are
    recovered through their leases, not through these rows)."""
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
    still = Run.objects.filter(
        claims, worker_id=worker_id, status__in=[Status.RUNNING, Status.COMPENSATING]
    )
    if still.update(lease_expires_at=now() + lease) == len(owned):
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
    if not run_ids or not is_postgres():
        return
    queues = Run.objects.filter(id__in=list(run_ids)).values_list("queue", flat=True)
    for queue in set(queues):
        notify_due(queue)


def next_due_at(queues: Sequence[str] | None) -> datetime | None:
    """When the next claimable run of ``queues`` becomes due (the claim index answers it)."""
    runs = Run.objects.filter(status__in=CLAIMABLE_STATUSES, due_at__isnull=False)
    if queues:
        runs = runs.filter(queue__in=list(queues))
    return runs.order_by("due_at").values_list("due_at", flat=True).first()


def reset_connection_after_error() -> None:
    """Drop this thread's connection if an error left it unusable (only after errors:
    a worker keeps its connections for its whole life, whatever CONN_MAX_AGE says)."""
    if connection.in_atomic_block or connection.connection is None:
        return  # no connection yet, or the caller's transaction decides
    if not connection.is_usable():
        connection.close()  # the next query reconnects


def open_listener(channel: str, alias: str = "default"):
    """A dedicated autocommit psycopg connection that LISTENs on ``channel``.

    It is not Django's connection: LISTEN must stay on one server session for as
    long as the worker lives, which a pooler in transaction mode cannot promise.
    """
    import psycopg
    from django.db import connections
    from psycopg import sql

    params = connections[alias].get_connection_params()
    for name in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(name, None)
    listener = psycopg.connect(**params, autocommit=True)
    try:
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    except BaseException:
        listener.close()
        raise
    return listener
