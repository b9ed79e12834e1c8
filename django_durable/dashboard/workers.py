"""The workers page: live worker processes, their queues and the runs they hold,
and the overview's warnings when a queue has due runs that no live worker takes,
or pending runs of a workflow that no live worker knows (new workflow code that
the workers have not loaded: they need a restart).

A worker is live while its heartbeat is younger than the lease (after that its
runs are recovered by the others). Every query reads an index: the runs held
come from the lease index (running and compensating runs), the due runs of a
queue from the claim index, one ``EXISTS`` per queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count
from django.utils.timezone import now

from django_durable import health, stats
from django_durable.conf import durable_settings
from django_durable.dashboard.site import render_page
from django_durable.health import WORKERS_KEPT
from django_durable.models import CLAIMABLE_STATUSES, HELD_STATUSES, Run, Status, WorkerNode
from django_durable.workflows.definition import registry

SHOWN = 200


@dataclass
class Node:
    worker: WorkerNode
    live: bool
    held: int
    queues: list[str] = field(default_factory=list)  # empty: every queue
    # live, stopping (finishing its steps), stopped (a clean stop) or gone (its
    # heartbeat stopped: killed, crashed or cut off from the database).
    state: str = "live"
    # Runs it finished within stats.WORKER_WINDOW: completed, and failed.
    completed: int = 0
    failed: int = 0


def live_since() -> datetime:
    return now() - durable_settings()["LEASE"]


def nodes() -> list[Node]:
    """The workers that heartbeated within ``WORKERS_KEPT`` (a day), latest first:
    live ones and those that stopped or vanished since."""
    since = live_since()
    stopped_since = now() - 2 * durable_settings()["HEARTBEAT_INTERVAL"]
    kept = now() - WORKERS_KEPT
    rows = list(WorkerNode.objects.filter(heartbeat_at__gte=kept).order_by("-heartbeat_at")[:SHOWN])
    held = dict(
        Run.objects.filter(status__in=HELD_STATUSES, worker_id__in=[w.id for w in rows])
        .order_by()
        .values("worker_id")
        .annotate(n=Count("*"))
        .values_list("worker_id", "n")
    )
    done = stats.worker_counts([w.id for w in rows])
    return [
        Node(
            w,
            w.heartbeat_at >= since and not w.stopping,
            held.get(w.id, 0),
            list(w.queues or []),
            _state(w, since, stopped_since),
            done.get(w.id, {}).get("completed", 0),
            done.get(w.id, {}).get("failed", 0),
        )
        for w in rows
    ]


def _state(worker: WorkerNode, live_since: datetime, stopped_since: datetime) -> str:
    """A stopping worker heartbeats while it finishes its steps; one whose last
    heartbeat is older than two heartbeats has stopped (its row stays for a day)."""
    if worker.stopping:
        return "stopping" if worker.heartbeat_at >= stopped_since else "stopped"
    return "live" if worker.heartbeat_at >= live_since else "gone"


def live_workers() -> list[WorkerNode]:
    """The live workers (at most SHOWN), for the overview's two banners (one query)."""
    return list(WorkerNode.objects.filter(heartbeat_at__gte=live_since(), stopping=False)[:SHOWN])


def unserved_queues(alive: list[WorkerNode] | None = None) -> list[str]:
    """Queues with a run due now and no live worker taking them."""
    live = [w.queues for w in (live_workers() if alive is None else alive)]
    if any(not queues for queues in live):
        return []  # a worker of every queue is live
    served = {q for queues in live for q in queues}
    at = now()
    defined = {w.queue for w in registry.all()}
    return sorted(
        queue
        for queue in defined - served
        if Run.objects.filter(
            queue=queue, status__in=CLAIMABLE_STATUSES, due_at__isnull=False, due_at__lte=at
        ).exists()
    )


# Pending runs read per workflow no live worker knows (the banner says "1000+").
COUNTED = 1000


@dataclass
class Unknown:
    """Pending runs of a workflow that no live worker of their queue knows."""

    workflow: str
    runs: int
    more: bool  # more than COUNTED
    queues: list[str]


def unknown_workflows(alive: list[WorkerNode] | None = None) -> list[Unknown]:
    """Workflows of this process (its registry) with pending runs that no live worker
    of their queue knows. A few index reads per workflow that some live worker does
    not know, none when every live worker knows every workflow."""
    alive = live_workers() if alive is None else alive
    if not alive or all(w.workflows is None for w in alive):
        return []
    found = []
    for definition in sorted(registry.all(), key=lambda d: d.name):
        if all(health.knows(w, definition.name) for w in alive):
            continue
        queues = list(
            Run.objects.filter(workflow=definition.name, status=Status.PENDING)
            .order_by()
            .values_list("queue", flat=True)[: COUNTED + 1]
        )
        stuck = [q for q in queues if health.unknown_to_live_workers(definition.name, q, alive)]
        if stuck:
            n = min(len(stuck), COUNTED)
            found.append(Unknown(definition.name, n, len(queues) > COUNTED, sorted(set(stuck))))
    return found


def unknown_to_live_workers(run: Run) -> bool:
    """Whether ``run`` waits for a worker that knows its workflow (pending, and the
    live workers of its queue do not know it)."""
    if run.status != Status.PENDING:
        return False
    return health.unknown_to_live_workers(run.workflow, run.queue, live_workers())


def _window(window: timedelta) -> tuple[str, str]:
    """("hour", "1 h") for an hour, ("24 hours", "24 h") for a day."""
    hours = round(window.total_seconds() / 3600)
    return ("hour" if hours == 1 else f"{hours} hours", f"{hours} h")


def workers_page(request, run_admin):
    context = {
        "nodes": nodes(),
        "unserved": unserved_queues(),
        "lease": durable_settings()["LEASE"],
        "kept_hours": round(WORKERS_KEPT.total_seconds() / 3600),
        "counted": _window(stats.WORKER_WINDOW),
    }
    return render_page(
        request,
        run_admin,
        "django_durable/workers.html",
        "Workers",
        context,
        live="django_durable/_workers_live.html",
    )
