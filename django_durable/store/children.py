"""Parents and children: recording child runs and waking parents."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from django_durable.models import Run, Status
from django_durable.store.base import (
    LeaseLost,
    notify_due,
    now,
    owned,
)

__all__ = [
    "lock_owned_state",
    "run_outcomes",
    "save_owned_state",
    "waiting_parent_state",
    "waiting_parents",
    "wake_parent",
]

# --- children -------------------------------------------------------------------


def lock_owned_state(run: Run) -> dict:
    """The state of a run this worker owns, its row locked until the transaction ends
    (so children are started and recorded by one owner, once)."""
    row = owned(run).select_for_update().values_list("state", flat=True).first()
    if row is None and not owned(run).exists():
        raise LeaseLost(run.id)
    return dict(row or {})


def save_owned_state(run: Run, state: dict) -> None:
    if not owned(run).update(state=state):
        raise LeaseLost(run.id)
    run.state = state


def run_outcomes(ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, tuple[str, Any, Any, Any]]:
    """``{id: (status, result, error, parent_id)}`` of the given runs (missing ones
    are left out)."""
    rows = Run.objects.filter(id__in=list(ids)).values_list(
        "id", "status", "result", "error", "parent_id"
    )
    return {row[0]: tuple(row[1:]) for row in rows}


def waiting_parents(limit: int = 500) -> list[tuple[uuid.UUID, dict]]:
    """Runs suspended until their children (or awaited runs) finish."""
    return list(
        Run.objects.filter(status=Status.WAITING, waiting_for="children")
        .order_by("id")
        .values_list("id", "state")[:limit]
    )


def waiting_parent_state(run_id: uuid.UUID) -> dict | None:
    row = (
        Run.objects.filter(id=run_id, status=Status.WAITING, waiting_for="children")
        .values_list("state", flat=True)
        .first()
    )
    return None if row is None else dict(row or {})


def wake_parent(run_id: uuid.UUID) -> bool:
    """Make a run waiting for children due now; False if it wasn't waiting for them."""
    row = Run.objects.filter(id=run_id).values_list("queue", flat=True).first()
    woken = bool(
        Run.objects.filter(id=run_id, status=Status.WAITING, waiting_for="children").update(
            status=Status.PENDING, due_at=now(), waiting_for=None
        )
    )
    if woken:
        notify_due(row)
    return woken
