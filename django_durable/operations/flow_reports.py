"""What an operator asks about flow control (docs/flow-control.md):
``durable.flow_stats(workflow)`` (per flow key: running / limit, due, begins in the
rate's window, when the next may begin) and ``durable.explain_run(run_id)`` (one
sentence: what the run is doing or waiting for now). The dashboard's run page, its
workflow page and ``manage.py durable inspect`` / ``durable flow`` show the same.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone

from django_durable import conf, store
from django_durable.models import (
    FINISHED_STATUSES,
    HELD_STATUSES,
    QueueState,
    Run,
    Status,
    WorkerNode,
)
from django_durable.operations.calls import public_call
from django_durable.operations.flow_holds import ceil_second
from django_durable.workflows.definition import Workflow, registry
from django_durable.workflows.flow import flow_limits

__all__ = [
    "aexplain_run",
    "aflow_stats",
    "declared_text",
    "describe",
    "explain_run",
    "flow_stats",
]


@public_call("aflow_stats")
def flow_stats(workflow: type[Workflow] | str, *, limit: int = 1000) -> list[dict[str, Any]]:
    """One dict per flow key of ``workflow`` (a class or its name) that has runs due or
    running, most due first, at most ``limit``: ``flow_key``, ``running``, ``due`` (due
    now, held back or not), ``concurrency_limit`` (``concurrency_per_key`` or None),
    ``started_in_window`` (begins in the last ``per``, None without a rate),
    ``rate_limit`` (the rate's limit or None), ``next_start_at`` (an aware datetime
    when the rate holds the key back, else None)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"limit must be an int of at least 1, got {limit!r}")
    definition = registry.resolve(workflow)
    limits = flow_limits(definition)
    at = store.now()
    running = {k: n for k, n in store.running_by_key(definition.name).items() if k}
    due = store.due_by_key(definition.name, at=at)
    keys = sorted(set(running) | set(due), key=lambda k: (-due.get(k, 0), -running.get(k, 0), k))
    keys = keys[:limit]
    rate = limits.rate if limits is not None else None
    begun = store.begins_in_window(definition.name, keys, rate.per, at=at) if rate else {}
    stats = []
    for key in keys:
        in_window, oldest = begun.get(key, (0, None))
        held_by_rate = rate is not None and in_window >= rate.limit and due.get(key, 0) > 0
        stats.append(
            {
                "flow_key": key,
                "running": running.get(key, 0),
                "due": due.get(key, 0),
                "concurrency_limit": limits.concurrency_per_key if limits else None,
                "started_in_window": in_window if rate is not None else None,
                "rate_limit": rate.limit if rate is not None else None,
                "next_start_at": oldest + rate.per if held_by_rate else None,
            }
        )
    return stats


def declared_text(definition: type[Workflow]) -> str:
    """The workflow's flow limits in words ("2 per key, 10 per minute per key")."""
    limits = flow_limits(definition)
    if limits is None:
        return "a flow key, no limit"
    parts = []
    if limits.concurrency_per_key is not None:
        parts.append(f"{limits.concurrency_per_key} running per key")
    if limits.rate is not None:
        parts.append(f"{limits.rate} per key")
    if limits.concurrency is not None:
        parts.append(f"{limits.concurrency} running in all")
    return ", ".join(parts)


def _when(at: datetime, *, ahead: bool = False) -> str:
    """``at`` to the second; a time ``ahead`` (something may happen then) rounded up,
    never named early."""
    if ahead:
        at = ceil_second(at)
    return timezone.localtime(at).strftime("%Y-%m-%d %H:%M:%S %Z")


def _waiting_for(run: Run) -> str:
    what = run.waiting_for or ""
    if what.startswith("event:"):
        return f"Waiting for the event {what[6:]!r}."
    if what.startswith("input:"):
        return f"Waiting for the input {what[6:]!r}."
    if what == "sleep" and run.due_at is not None:
        return f"Sleeping until {_when(run.due_at, ahead=True)}."
    if what == "children":
        return "Waiting for its child runs to finish."
    return f"Waiting ({what or 'for a timer'})."


def _live_workers(at: datetime) -> list[WorkerNode]:
    return list(WorkerNode.objects.filter(heartbeat_at__gte=at - conf.get("LEASE")))


def _serves(worker: WorkerNode, run: Run) -> bool:
    if worker.queues and run.queue not in worker.queues:
        return False
    if worker.workflows is None:
        return True
    return any(
        run.workflow == name or (name.endswith("*") and run.workflow.startswith(name[:-1]))
        for name in worker.workflows
    )


def _no_worker(run: Run, workers: list[WorkerNode]) -> str | None:
    """Why no live worker takes ``run``, saying which of the two is missing; None
    when one would."""
    on_queue = [w for w in workers if not w.queues or run.queue in w.queues]
    if not on_queue:
        return f"No live worker serves its queue {run.queue!r}."
    if not any(_serves(worker, run) for worker in on_queue):
        return (
            f"No live worker that serves its queue {run.queue!r} knows its workflow "
            f"{run.workflow!r}."
        )
    return None


def _limit_reason(run: Run, at: datetime) -> str | None:
    """The first queue, workflow, flow-key or rate limit that holds ``run`` back."""
    queue_cap = conf.queue_limits().get(run.queue)
    if queue_cap is not None:
        running = store.running_of(queue=run.queue)
        if running >= queue_cap:
            return (
                f"Its queue {run.queue!r} is at its concurrency ({running} of {queue_cap} running)."
            )
    try:
        limits = flow_limits(registry.get(run.workflow))
    except LookupError:  # a workflow this process does not know: no limit it can tell
        limits = None
    if limits is None:
        return None
    if limits.concurrency is not None:
        running = store.running_of(workflow=run.workflow)
        if running >= limits.concurrency:
            return (
                f"Its workflow {run.workflow!r} is at its concurrency "
                f"({running} of {limits.concurrency} running)."
            )
    if run.flow_key is None:
        return None
    if limits.concurrency_per_key is not None:
        running = store.running_by_key(run.workflow).get(run.flow_key, 0)
        if running >= limits.concurrency_per_key:
            return (
                f"Its flow key {run.flow_key!r} is at its limit "
                f"({running} of {limits.concurrency_per_key} running)."
            )
    if limits.rate is not None and run.started_at is None:
        begun = store.begins_in_window(run.workflow, [run.flow_key], limits.rate.per, at=at)
        n, oldest = begun.get(run.flow_key, (0, None))
        if n >= limits.rate.limit:
            return (
                f"Its flow key {run.flow_key!r} is at its rate ({limits.rate}): "
                f"next begin at {_when(oldest + limits.rate.per, ahead=True)}."
            )
    return None


@public_call("aexplain_run")
def explain_run(run_id: uuid.UUID | str) -> str:
    """One sentence saying what the run is doing or waiting for now; where several
    hold, the first of: finished, running (on the worker named as the workers page
    names it), waiting, not due, queue paused, queue or workflow limit, flow-key
    limit, rate, no live worker. ``ValueError`` for an id that is not a UUID,
    ``Run.DoesNotExist`` (naming the id) for an unknown one."""
    if not isinstance(run_id, uuid.UUID):
        try:
            run_id = uuid.UUID(str(run_id))
        except ValueError:
            raise ValueError(f"not a run id: {run_id!r}") from None
    try:
        run = Run.objects.get(id=run_id)
    except Run.DoesNotExist:
        raise Run.DoesNotExist(f"no run {run_id}") from None
    return describe(run)


def describe(run: Run) -> str:
    """``explain_run``'s sentence for a run already read (the dashboard's run page): a
    finished or running run costs no query; another a few reads."""
    if run.status in FINISHED_STATUSES:
        when = f" at {_when(run.finished_at)}" if run.finished_at else ""
        return f"Finished: {run.status.replace('_', ' ')}{when}."
    if run.status in HELD_STATUSES and run.worker_id is not None:
        doing = "Compensating" if run.status == Status.COMPENSATING else "Running"
        return f"{doing} on worker {run.worker_id}."
    at = store.now()
    if run.status == Status.WAITING and (run.due_at is None or run.due_at > at):
        return _waiting_for(run)
    if run.due_at is None:
        if run.runs_after_id is not None:
            return f"Not due: it waits for run {run.runs_after_id} to give up its key."
        return "Not due: nothing has made it due yet."
    if run.due_at > at:
        return f"Not due until {_when(run.due_at, ahead=True)}."
    if QueueState.objects.filter(name=run.queue, paused=True).exists():
        return f"Its queue {run.queue!r} is paused."
    reason = _limit_reason(run, at)
    if reason is not None:
        return reason
    unserved = _no_worker(run, _live_workers(at))
    if unserved is not None:
        return unserved
    waited = max((at - run.due_at).total_seconds(), 0.0)
    return f"Due for {timedelta(seconds=round(waited))}; the next free worker thread takes it."


async def aflow_stats(workflow: type[Workflow] | str, *, limit: int = 1000) -> list[dict[str, Any]]:
    """``flow_stats()`` for async code; the same arguments."""
    return await sync_to_async(flow_stats, thread_sensitive=True)(workflow, limit=limit)


async def aexplain_run(run_id: uuid.UUID | str) -> str:
    """``explain_run()`` for async code."""
    return await sync_to_async(explain_run, thread_sensitive=True)(run_id)
