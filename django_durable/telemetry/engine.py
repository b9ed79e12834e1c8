"""The engine's metrics: how long claims take, how long due runs wait for one, how
many runs are due per queue, how often workers are lost, hand runs back after a
lost connection, or lose a run (docs/metrics.md).

Claims are timed through the store's claim watcher (``store.watch_claims``), set
while telemetry is installed; recoveries, hand-backs and lease losses are reported
by the runtime. The queue depth is read when a metric reader collects, in one
bounded statement (``store.queue_depths``), never per claim.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from django.apps import apps
from django.db import DatabaseError

from django_durable import store
from django_durable.telemetry.instruments import RunFacts, labels, on
from django_durable.workflows.declared import declared_limits
from django_durable.workflows.flow import FlowLimits

try:  # opentelemetry is optional
    from opentelemetry.metrics import Observation
except ImportError:  # pragma: no cover - exercised when the package is absent
    Observation = None

logger = logging.getLogger("django_durable.telemetry")


def claimed(runs: list[Any], seconds: float, lease: timedelta, queues: Sequence[str] | None):
    """A claim took ``seconds`` and returned ``runs``: record its latency, each run's
    pickup latency (due time to claim; the claim time is its lease's start, set by the
    database's clock on PostgreSQL) and remember the runs for their step spans."""
    inst = on()
    if inst is None:
        return
    try:
        served = ",".join(sorted(queues)) if queues else "*"
        limited = declared_limits() if runs else {}
        inst.claim_latency.record(seconds, {"durable.queue": served})
        for run in runs:
            inst.remember(run.id, RunFacts(run.workflow, run.queue, run.trace_context))
            if run.due_at is None or run.lease_expires_at is None:
                continue  # a compensating run: not due while claimed
            waited = (run.lease_expires_at - lease - run.due_at).total_seconds()
            inst.pickup_latency.record(max(waited, 0.0), labels(run.workflow, run.queue))
            if run.workflow in limited:  # flow control: the wait of a limited workflow's run
                inst.flow_wait.record(max(waited, 0.0), labels(run.workflow, run.queue))
    except Exception:  # telemetry never fails a claim
        logger.exception("recording a claim's metrics failed")


def recovered(run_ids: Iterable[Any]) -> None:
    """Runs whose worker was lost (lease expired) were recovered: count them by
    workflow and queue (one query, only when there were some)."""
    inst = on()
    ids = list(run_ids)
    if inst is None or not ids:
        return
    Run = apps.get_model("django_durable", "Run")
    found = Counter(Run.objects.filter(id__in=ids).values_list("workflow", "queue"))
    for (workflow, queue), count in found.items():
        inst.recoveries.add(count, labels(workflow, queue))


def handed_back(run: Any) -> None:
    """A live worker handed ``run`` back after its connection was lost during a step
    (an outage, a failover, a terminated backend): not a lost worker."""
    inst = on()
    if inst is not None:
        inst.handbacks.add(1, labels(run.workflow, run.queue))


def lease_lost(run: Any) -> None:
    """A worker found that the run it held was claimed by another (its fence moved)."""
    inst = on()
    if inst is not None:
        inst.lease_losses.add(1, labels(run.workflow, run.queue))


def observe_depth(options: Any) -> list[Any]:
    """The ``durable.queue.depth`` callback: due runs per queue, at collection time."""
    inst = on()
    if inst is None or not inst.observes_depth:  # installed again with queue_depth=False
        return []
    return _collected("durable.queue.depth", _depths)


def _depths() -> list[Any]:
    depths = store.queue_depths()
    return [Observation(count, {"durable.queue": queue}) for queue, count in depths.items()]


def _collected(metric: str, read: Any) -> list[Any]:
    """``read()``'s observations; none when the database can't be read (logged). A
    reader's thread keeps no connection between collections."""
    connection = store.db()
    try:
        return read()
    except DatabaseError:
        logger.warning("%s: the database could not be read", metric, exc_info=True)
        store.reset_connection_after_error()
        return []
    finally:
        if not connection.in_atomic_block:
            connection.close()


def held_back(limit: FlowLimits, running: dict, due: dict) -> int:
    """How many of a workflow's due runs its concurrency limits hold back now: per
    flow key those beyond its room (``concurrency_per_key``), and beyond the
    workflow's room (``concurrency``); the caller adds the rate's."""
    held = 0
    for key, count in due.items():
        if key is None:
            continue
        room = count
        if limit.concurrency_per_key is not None:
            room = min(room, max(limit.concurrency_per_key - running.get(key, 0), 0))
        held += count - room
    if limit.concurrency is not None:
        total_due = sum(due.values())
        room = max(limit.concurrency - sum(running.values()), 0)
        held = max(held, total_due - room)
    return held


def observe_flow(options: Any) -> list[Any]:
    """The ``durable.flow.held`` callback: per workflow with flow limits, its due runs
    the limits hold back, at collection time (two grouped reads per such workflow;
    labelled by workflow only, never by flow key: the cardinality stays bounded)."""
    inst = on()
    if inst is None or not inst.observes_depth:
        return []
    return _collected("durable.flow.held", _held)


def _held() -> list[Any]:
    observed = []
    for name, limit in declared_limits().items():
        running = store.running_by_key(name)
        due = store.due_by_key(name)
        held = held_back(limit, running, due)
        if limit.rate is not None:
            begun = store.begins_in_window(name, list(due), limit.rate.per)
            full = {k for k, (n, _oldest) in begun.items() if n >= limit.rate.limit}
            held = max(held, sum(n for k, n in due.items() if k in full))
        observed.append(Observation(held, {"durable.workflow": name}))
    return observed
