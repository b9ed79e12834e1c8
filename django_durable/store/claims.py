"""Claiming due runs, and when the next one is due: both read the claim index
``durable_run_claim`` (queue, priority DESC, due_at) over the claimable statuses,
queue by queue, highest priority first, then oldest due.

Two queue rules take part in every claim: a paused queue (a ``durable_queue`` row
with ``paused``) is not claimed from, and a queue with a concurrency limit
(``DURABLE["QUEUES"][name]["concurrency"]``) gets only the room its limit leaves
beside the runs of that queue already running, whichever worker runs them. With
flow-keyed runs due, the claim also applies the flow limits the caller passes (the
store reads no declaration: the worker passes operations.flow.claim_limits()) and
takes turns across flow keys (docs/flow-control.md).

How the limits hold across workers: each claimed run of a limited scope takes a
numbered slot that a partial unique index keeps to one running run (models.
RUN_SLOT_CONSTRAINTS); the claim serialises per scope and counts after its lock so
that the index has nothing to refuse in normal operation. On PostgreSQL that is
durable_claim_v6, run at READ COMMITTED (CLAIM_LEVEL, when the alias or the
session's default sets another level); SQLite serialises its writers, so its CLAIM
counts and claims in one write.
The statements are the engine's (store/engines: CLAIM, CLAIM_LEVEL, NEXT_DUE_AT,
TAKE_TURNS).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from django_durable import conf
from django_durable.models import CLAIMABLE_STATUSES, QueueState, Run
from django_durable.store import observers, slots, turns
from django_durable.store.base import (
    RUN_ATTNAMES,
    atomic,
    db,
    engine,
    execute,
    fetchall,
    fetchone,
    from_row,
    now,
)
from django_durable.store.flow import FlowLimit

__all__ = ["claim", "next_due_at"]


def _limits_served(queues: Sequence[str] | None, limits: Mapping[str, int]) -> dict[str, int]:
    """The limited queues among those served (None: every queue)."""
    if queues is None:
        return dict(limits)
    return {name: cap for name, cap in limits.items() if name in queues}


def _flow_served(
    limits: Mapping[str, FlowLimit] | None,
    workflows: Sequence[str] | None,
    prefixes: Sequence[str],
) -> dict[str, FlowLimit]:
    """The flow limits of the workflows served (``workflows`` None: any)."""
    if not limits or workflows is None:
        return dict(limits or {})
    known = set(workflows)
    return {
        name: limit
        for name, limit in limits.items()
        if name in known or any(name.startswith(p) for p in prefixes)
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
    flow_limits: Mapping[str, FlowLimit] | None = None,
) -> list[Run]:
    """Claim up to ``limit`` due runs of ``queues`` (None: every queue), highest
    priority first, then oldest due (in turns across flow keys), leaving paused
    queues alone, a limited queue (``limits``: queue -> concurrency, by default those
    of ``DURABLE["QUEUES"]``) no more than its room, a workflow with flow limits
    (``flow_limits``: name -> ``FlowLimit``, the caller's; None: no flow limit) no
    more than they allow, and only runs of ``workflows`` (None: any) or of names
    starting with one of ``prefixes``: CLAIM in one statement (after CLAIM_LEVEL in
    one transaction where the engine sets the claim's level), then the turns it gave
    where the engine has TAKE_TURNS (the engine's statements: store/engines)."""
    watcher = observers.claim_watcher  # telemetry's, when installed
    started = time.perf_counter() if watcher is not None else 0.0
    connection = db()  # looked up once: each look-up costs a thread-local read
    eng = engine(connection)
    at = now(connection)
    if limits is None:
        limits = conf.queue_limits()
    served_limits = _limits_served(queues, limits)
    served_flow = _flow_served(flow_limits, workflows, prefixes)
    params = {
        "worker_id": worker_id,
        "limit": limit,
        **eng.queue_params(queues, served_limits),
        **eng.workflow_params(workflows, prefixes),
        **eng.lease_params(at, lease),
        **eng.flow_params(served_flow, at, connection),
    }
    if not eng.CLAIM_GIVES_SLOTS and (served_limits or served_flow):
        # The claim and its slots, one serialised write; inside a caller's transaction,
        # a part of it (no savepoint: an error there is the caller's to roll back).
        with atomic(savepoint=False):
            runs = list(Run.objects.raw(eng.CLAIM, params))
            slots.give_slots(runs, served_limits, served_flow)
    elif eng.ROWS_NEED_BACKEND_CONVERTERS:  # dates as text: the backend converts them
        runs = list(Run.objects.raw(eng.CLAIM, params))
    elif eng.sets_claim_level(connection) and not connection.in_atomic_block:
        with atomic():  # the level first, then the claim, in one transaction
            execute(eng.CLAIM_LEVEL, ())
            rows = fetchall(eng.CLAIM, params, connection)
        runs = [from_row(Run, RUN_ATTNAMES, row, connection) for row in rows]
    else:
        rows = fetchall(eng.CLAIM, params, connection)
        runs = [from_row(Run, RUN_ATTNAMES, row, connection) for row in rows]
    if eng.TAKE_TURNS is not None:  # turns only order: no transaction with the claim
        turns.take_turns(runs, at, connection, eng.TAKE_TURNS)
    if watcher is not None:
        watcher(runs, time.perf_counter() - started, lease, queues)
    runs.sort(key=lambda r: (-r.priority, r.due_at or at, r.created_at))
    return runs


def next_due_at(
    queues: Sequence[str] | None, limits: Mapping[str, int] | None = None
) -> datetime | None:
    """When the next claimable run of the open ``queues`` (None: every queue) becomes
    due; a limited queue with no room left is not counted (where the engine has
    NEXT_DUE_AT; otherwise one ORM query)."""
    if limits is None:
        limits = conf.queue_limits()
    eng = engine()
    if eng.NEXT_DUE_AT is None:
        runs = Run.objects.filter(status__in=CLAIMABLE_STATUSES, due_at__isnull=False).exclude(
            queue__in=QueueState.objects.filter(paused=True).values("name")
        )
        if queues:
            runs = runs.filter(queue__in=list(queues))
        return runs.order_by("due_at").values_list("due_at", flat=True).first()
    params = eng.queue_params(queues, _limits_served(queues, limits))
    params["limit"] = 1
    return fetchone(eng.NEXT_DUE_AT, params)[0]
