"""Which due runs flow limits hold back now, as the dashboard says it: per flow key of
a workflow, when its next run may begin and why not now (the workflow page's *Next
start*), and per queue, how many of its due runs no worker may claim now because of
a flow limit (the Queues page). ``durable.flow_stats`` gives the raw numbers.

Reads only, through the ORM on both databases, and none for a project that declares
no flow limit. The Queues page's count reads the due runs of the limited workflows
grouped by (queue, workflow, flow key): one row per flow key with runs due.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Q

from django_durable import conf, store
from django_durable.models import CLAIMABLE_STATUSES, HOLDS_WORKER, QueueState, Run
from django_durable.workflows.definition import Workflow, registry
from django_durable.workflows.flow import FlowLimits, flow_limits

__all__ = ["NextStart", "ceil_second", "held_by_queue", "next_starts"]

UNLIMITED = float("inf")


def ceil_second(at: datetime) -> datetime:
    """``at`` rounded up to the whole second: a time shown to the second is never early."""
    if at.microsecond == 0:
        return at
    return at.replace(microsecond=0) + timedelta(seconds=1)


@dataclass(frozen=True)
class NextStart:
    """When a flow key's next due run may begin: ``text`` says why not now (empty
    when nothing holds it), ``at`` the time a rate lets it (None: not a time)."""

    text: str
    at: datetime | None = None
    now: bool = False


def next_starts(definition: type[Workflow], rows: list[dict[str, Any]]) -> list[NextStart]:
    """For each row of ``flow_stats(definition)``: the first of its queue paused, its
    queue or the workflow at its concurrency, the key at its ``concurrency_per_key``,
    its rate (the time, rounded up), else now. At most three queries, however many rows."""
    limits = flow_limits(definition)
    queue = definition.queue
    whole = _whole_reason(definition, limits, queue) if any(r["due"] for r in rows) else ""
    starts = []
    for row in rows:
        if row["due"] == 0:
            starts.append(NextStart("nothing due"))
            continue
        if whole:
            starts.append(NextStart(whole))
            continue
        later = ceil_second(row["next_start_at"]) if row["next_start_at"] else None
        cap = row["concurrency_limit"]
        if cap is not None and row["running"] >= cap:
            text = f"when one of its runs finishes ({row['running']} of {cap} running)"
            starts.append(NextStart(text + (", not before" if later else ""), later))
        elif later is not None:
            n, limit = row["started_in_window"], row["rate_limit"]
            starts.append(NextStart(f"at its rate ({n} of {limit} begun)", later))
        else:
            starts.append(NextStart("", now=True))
    return starts


def _whole_reason(definition: type[Workflow], limits: FlowLimits | None, queue: str) -> str:
    """What holds every flow key of the workflow back: its queue, or its concurrency."""
    if QueueState.objects.filter(name=queue, paused=True).exists():
        return f"when its queue {queue} is resumed (paused)"
    queue_cap = conf.queue_limits().get(queue)
    if queue_cap is not None:
        running = store.running_of(queue=queue)
        if running >= queue_cap:
            return f"when a run of its queue finishes (queue {queue}: {running} of {queue_cap})"
    if limits is not None and limits.concurrency is not None:
        running = store.running_of(workflow=definition.name)
        if running >= limits.concurrency:
            return (
                f"when a run of the workflow finishes (workflow at its concurrency, "
                f"{running} of {limits.concurrency} running)"
            )
    return ""


def held_by_queue() -> dict[str, dict[str, int]]:
    """Per queue, per workflow: how many of its due runs flow limits hold back now
    (due, less the room the workflow's ``concurrency`` and each key's
    ``concurrency_per_key`` and rate leave). A key's room goes to its queues in name
    order; a queue's own limit and pausing are not counted here (the page shows them).
    No query when no workflow declares a flow limit, else at most three."""
    limited = {w.name: flow_limits(w) for w in registry.all()}
    limited = {name: limits for name, limits in limited.items() if limits is not None}
    if not limited:
        return {}
    at = store.now()
    due = _due(limited, at)
    if not due:
        return {}
    running = _running(limited)
    begun = _begun(limited, at)
    held: dict[str, dict[str, int]] = defaultdict(dict)
    for workflow, keys in due.items():
        limits = limited[workflow]
        claimable: dict[str, int] = defaultdict(int)
        for key, queues in keys.items():
            room = _key_room(
                limits, key, running.get((workflow, key), 0), begun.get((workflow, key))
            )
            for queue, (n, fresh) in sorted(queues.items()):
                # A run that began before (a resume) is not held by the rate.
                take = min(n, room.running, (n - fresh) + room.begins)
                claimable[queue] += int(take)
                room = _Room(room.running - take, room.begins - max(take - (n - fresh), 0))
        if limits.concurrency is not None:
            busy = sum(n for (w, _), n in running.items() if w == workflow)
            left = max(limits.concurrency - busy, 0)
            for queue in sorted(claimable):
                claimable[queue] = min(claimable[queue], left)
                left -= claimable[queue]
        for queue in sorted({q for queues in keys.values() for q in queues}):
            total = sum(queues[queue][0] for queues in keys.values() if queue in queues)
            if total > claimable[queue]:
                held[queue][workflow] = total - claimable[queue]
    return dict(held)


@dataclass(frozen=True)
class _Room:
    running: float  # runs the key may still have running
    begins: float  # runs that may still begin in the rate's window


def _key_room(limits: FlowLimits, key: str | None, running: int, begun: int | None) -> _Room:
    """A flow key's room under ``concurrency_per_key`` and the rate; the runs without
    a flow key (``key`` None) have no per-key limit."""
    if key is None:
        return _Room(UNLIMITED, UNLIMITED)
    cap = limits.concurrency_per_key
    return _Room(
        max(cap - running, 0) if cap is not None else UNLIMITED,
        max(limits.rate.limit - (begun or 0), 0) if limits.rate is not None else UNLIMITED,
    )


def _due(limited: dict[str, FlowLimits], at: datetime) -> dict[str, dict]:
    """workflow -> flow key -> queue -> (due runs, of them never begun)."""
    rows = (
        Run.objects.filter(
            workflow__in=list(limited), status__in=CLAIMABLE_STATUSES, due_at__lte=at
        )
        .values_list("workflow", "flow_key", "queue")
        .annotate(n=Count("id"), fresh=Count("id", filter=Q(started_at__isnull=True)))
        .order_by()
    )
    due: dict[str, dict] = defaultdict(lambda: defaultdict(dict))
    for workflow, key, queue, n, fresh in rows:
        due[workflow][key][queue] = (n, fresh)
    return due


def _running(limited: dict[str, FlowLimits]) -> dict[tuple[str, str | None], int]:
    """(workflow, flow key) -> runs a worker holds."""
    rows = (
        Run.objects.filter(HOLDS_WORKER, workflow__in=list(limited))
        .values_list("workflow", "flow_key")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {(workflow, key): n for workflow, key, n in rows}


def _begun(limited: dict[str, FlowLimits], at: datetime) -> dict[tuple[str, str], int]:
    """(workflow, flow key) -> begins in the rate's window, for the rated workflows."""
    windows = Q()
    for name, limits in limited.items():
        if limits.rate is not None:
            windows |= Q(workflow=name, started_at__gt=at - limits.rate.per)
    if not windows:
        return {}
    rows = (
        Run.objects.filter(windows, flow_key__isnull=False)
        .values_list("workflow", "flow_key")
        .annotate(n=Count("id"))
        .order_by()
    )
    return {(workflow, key): n for workflow, key, n in rows}
