"""Leases, events and inputs delivered to runs, handing runs back, and lease recovery."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

from django.db.models import F, QuerySet

from django_durable.models import HELD_STATUSES, Event, Run, Status, StepAttempt
from django_durable.store.base import LeaseLost, atomic, db_now, notify_due, now, owned
from django_durable.store.compensations import hand_back_compensating, recover_expired_compensations

__all__ = [
    "Recovery",
    "current_status",
    "keep_event",
    "record_delivery",
    "hand_back",
    "hand_back_lost",
    "claims_unknown_to",
    "recover_expired_leases",
    "renew_lease",
    "waiting_for_input",
]


def renew_lease(run: Run, lease: timedelta) -> None:
    """Extend the lease of a run this worker owns; ``LeaseLost`` if it no longer does."""
    updated = Run.objects.filter(id=run.id, fence=run.fence, status=run.status).update(
        lease_expires_at=db_now() + lease
    )
    if not updated:
        raise LeaseLost(run.id)


def current_status(run_id: uuid.UUID) -> tuple[str, int] | None:
    row = Run.objects.filter(id=run_id).values_list("status", "fence").first()
    return tuple(row) if row else None


def record_delivery(
    run: Run,
    kind: str,
    name: str,
    payload: Any,
    *,
    state: dict,
    waiting_for: str | None,
    wake: bool,
) -> None:
    """Write a delivery the caller decided (``lock_run`` first, in its transaction):
    the waiting run's new ``state``; with ``wake`` the run is due now and an idle
    worker is woken, otherwise it keeps waiting, for ``waiting_for``; and the event's
    row, delivered now. Conditional on the run still waiting."""
    at = now()
    if wake:
        changes: dict[str, Any] = {"status": Status.PENDING, "due_at": at, "waiting_for": None}
    else:
        changes = {"waiting_for": waiting_for}
    Run.objects.filter(id=run.id, status=Status.WAITING).update(state=state, **changes)
    Event.objects.create(
        run_id=run.id, kind=kind, name=name, payload=payload, created_at=at, delivered_at=at
    )
    if wake:
        notify_due(run.queue)  # wake an idle worker for the resumed run


def keep_event(run_id: uuid.UUID, kind: str, name: str, payload: Any) -> None:
    """Keep an event no wait takes yet (``buffer``): undelivered, for a later wait."""
    Event.objects.create(run_id=run_id, kind=kind, name=name, payload=payload, created_at=now())


def waiting_for_input(workflows: list[str], limit: int) -> QuerySet[Run]:
    """Runs of ``workflows`` waiting for an input, oldest first, at most ``limit``
    (a lazy, sliced QuerySet: its plan can be read with ``explain()``).

    Read through ``durable_run_workflow_status`` (workflow, status): one index range
    per workflow named, holding only its waiting runs, filtered on ``waiting_for``.
    """
    return (
        Run.objects.filter(
            workflow__in=workflows, status=Status.WAITING, waiting_for__startswith="input:"
        )
        .only("id", "workflow", "state", "created_at")
        .order_by("created_at", "id")[:limit]
    )


def claims_unknown_to(worker_id: str, known: Sequence[uuid.UUID]) -> list[Run]:
    """The runs the database says ``worker_id`` holds and the worker does not know of
    (``known``: those it does): a claim committed while its connection was lost, before
    the answer came back."""
    return list(
        Run.objects.filter(worker_id=worker_id, status__in=HELD_STATUSES).exclude(id__in=known)
    )


def hand_back(run: Run) -> bool:
    """Return a claimed run to ``pending`` so another worker takes it (shutdown)."""
    if run.status == Status.COMPENSATING:
        return hand_back_compensating(run)
    return bool(
        owned(run).update(
            status=Status.PENDING, worker_id=None, lease_expires_at=None, due_at=now()
        )
    )


# --- recovery -------------------------------------------------------------------


class Recovery(NamedTuple):
    """What a recovery did: the runs back to ``pending``, and the runs that failed
    because their worker was lost more than ``MAX_RECOVERIES`` times (each still to
    be finished: its key, its parent)."""

    resumed: list[uuid.UUID]
    failed: list[Run]

    @property
    def ids(self) -> list[uuid.UUID]:
        return [*self.resumed, *(run.id for run in self.failed)]


# What a recovery reads of a run: enough to count it, fail it and finish it.
RECOVERED_FIELDS = (
    "id",
    "workflow",
    "key",
    "parent_id",
    "state",
    "step_index",
    "attempt",
    "worker_id",
    "recoveries",
    "step_names",
)


def step_label(run: Run) -> str:
    """The name of the step the run is in (as recorded at its start), or ``#index``."""
    names = run.step_names or []
    if run.step_index < len(names):
        return names[run.step_index]
    return f"#{run.step_index}"


def lost_error(recoveries: int, why: str) -> dict[str, Any]:
    return {
        "type": "WorkerLost",
        "message": (
            f"its worker was lost {recoveries} times (the last time: {why}); "
            'more than DURABLE["MAX_RECOVERIES"] allows, so it does not run again'
        ),
        "recoveries": recoveries,
    }


def recover_expired_leases(
    max_recoveries: int, *, compensation_step: Callable[[dict], int]
) -> Recovery:
    """Return runs whose worker stopped heartbeating (by the database's clock) to
    ``pending``, counting the attempt and the recovery; a run lost more than
    ``max_recoveries`` times fails instead (it may be what kills its workers).
    Compensating runs stay compensating (``recover_expired_compensations``, with
    ``compensation_step``: the undo step a compensating run's state was in).

    The fence grows at the next claim, so the worker that lost the run cannot
    record over its new owner even if it comes back.
    """
    at = now()
    resumed = recover_expired_compensations(compensation_step)
    failed: list[Run] = []
    with atomic():
        expired = list(
            Run.objects.select_for_update(skip_locked=True)
            .filter(status=Status.RUNNING, lease_expires_at__lt=db_now())
            .only(*RECOVERED_FIELDS)[:500]
        )
        if not expired:
            return Recovery(resumed, failed)
        again = [run.id for run in expired if run.recoveries < max_recoveries]
        if again:
            Run.objects.filter(id__in=again, status=Status.RUNNING).update(
                status=Status.PENDING,
                worker_id=None,
                lease_expires_at=None,
                attempt=F("attempt") + 1,
                recoveries=F("recoveries") + 1,
                due_at=at,
            )
        for run in expired:
            if run.recoveries >= max_recoveries:
                run.status = Status.FAILED
                run.recoveries += 1
                run.error = lost_error(
                    run.recoveries, f"worker {run.worker_id} stopped heartbeating"
                )
                Run.objects.filter(id=run.id, status=Status.RUNNING).update(
                    status=Status.FAILED,
                    error=run.error,
                    recoveries=run.recoveries,
                    finished_at=at,
                    due_at=None,
                    lease_expires_at=None,
                )
                failed.append(run)
        StepAttempt.objects.bulk_create(
            StepAttempt(
                run_id=run.id,
                step=step_label(run),
                step_index=run.step_index,
                attempt=run.attempt,
                status=StepAttempt.Outcome.LOST,
                error={
                    "type": "LeaseExpired",
                    "message": f"worker {run.worker_id} stopped heartbeating",
                },
                worker_id=run.worker_id,
                started_at=at,
                finished_at=at,
            )
            for run in expired
        )
    return Recovery([*resumed, *again], failed)


def hand_back_lost(run: Run, why: str) -> None:
    """The worker lost its database connection during a step (an outage, a failover, a
    terminated backend: the infrastructure, not the step): hand the run back to
    ``pending`` with the attempt recorded as lost. Not a recovery: ``recoveries``
    counts lost workers (``MAX_RECOVERIES``), and this worker is alive. Fenced by
    the claim: ``LeaseLost`` when the run is no longer this worker's."""
    at = now()
    changes: dict[str, Any] = {
        "status": Status.PENDING,
        "due_at": at,
        "attempt": run.attempt + 1,
        "worker_id": None,
        "lease_expires_at": None,
    }
    with atomic():
        if not owned(run).update(**changes):
            raise LeaseLost(run.id)
        StepAttempt.objects.create(
            run_id=run.id,
            step=step_label(run),
            step_index=run.step_index,
            attempt=run.attempt,
            status=StepAttempt.Outcome.LOST,
            error={"type": "ConnectionLost", "message": why},
            worker_id=run.worker_id,
            started_at=at,
            finished_at=at,
        )
    for name, value in changes.items():
        setattr(run, name, value)
