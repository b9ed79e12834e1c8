"""Leases, events and inputs delivered to runs, handing runs back, and lease recovery."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.db.models import F

from django_durable import state as run_state
from django_durable.models import FINISHED_STATUSES, Event, Run, Status, StepAttempt
from django_durable.store.base import LeaseLost, atomic, notify_due, now, owned
from django_durable.store.compensations import hand_back_compensating, recover_expired_compensations

__all__ = [
    "current_status",
    "deliver",
    "hand_back",
    "recover_expired_leases",
    "renew_lease",
]


def renew_lease(run: Run, lease: timedelta) -> None:
    """Extend the lease of a run this worker owns; ``LeaseLost`` if it no longer does."""
    updated = Run.objects.filter(id=run.id, fence=run.fence, status=run.status).update(
        lease_expires_at=now() + lease
    )
    if not updated:
        raise LeaseLost(run.id)


def current_status(run_id: uuid.UUID) -> tuple[str, int] | None:
    row = Run.objects.filter(id=run_id).values_list("status", "fence").first()
    return tuple(row) if row else None


def deliver(run_id: uuid.UUID, kind: str, name: str, payload: Any, *, keep: bool) -> str:
    """Give an event or input to a run: ``"delivered"`` when it was waiting for it,
    ``"kept"`` when it is kept for a later wait, ``"refused"`` otherwise.

    The run row is locked, so this and ``record_suspended`` never miss each other.
    """
    slot = run_state.event_slot(kind, name)
    with atomic():
        run = (
            Run.objects.select_for_update()
            .only("id", "status", "waiting_for", "state", "queue")
            .get(id=run_id)
        )
        got = run_state.received(run.state)
        if run.status == Status.WAITING and run.waiting_for == slot and slot not in got:
            Run.objects.filter(id=run_id).update(
                status=Status.PENDING,
                due_at=now(),
                waiting_for=None,
                state=run_state.delivered(run.state, slot, payload),
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


def recover_expired_leases() -> list[uuid.UUID]:
    """Return runs whose worker stopped heartbeating to ``pending``, counting the attempt.

    The fence grows at the next claim, so the worker that lost the run cannot
    record over its new owner even if it comes back.
    """
    at = now()
    recovered = recover_expired_compensations()
    with atomic():
        expired = list(
            Run.objects.select_for_update(skip_locked=True)
            .filter(status=Status.RUNNING, lease_expires_at__lt=at)
            .values_list("id", "step_index", "attempt", "workflow", "worker_id")[:500]
        )
        if not expired:
            return recovered
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
    return ids + recovered
