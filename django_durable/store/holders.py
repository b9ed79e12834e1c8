"""A key's holder and the run waiting behind it: finding them, and the conditional
writes that move a key between runs; and acting on runs (cancel, resume)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.db import IntegrityError

from django_durable.models import Run, Status
from django_durable.store.base import atomic, now

__all__ = [
    "active_children",
    "cancel_run",
    "get_holder",
    "get_waiting_behind",
    "lock_run",
    "move_waiting_behind",
    "release_key",
    "replace_holder",
    "resume_failed",
    "take_key",
    "take_key_and_run",
    "update_pending_input",
    "update_waiting_input",
    "wait_behind",
    "waiting_behind_finished",
]

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
        with atomic():
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


def update_pending_input(run_id: uuid.UUID, input: dict, *, keep: int, **fields: Any) -> bool:
    """Give a run that no worker has picked up a newer input (debounce, run_again),
    folded into its inputs (``folded``: at most ``keep``)."""
    with atomic():
        runs = Run.objects.filter(id=run_id, status=Status.PENDING, started_at__isnull=True)
        found = runs.select_for_update().values_list("input", "inputs").first()
        if found is None:
            return False
        return bool(runs.update(input=input, inputs=folded(*found, input, keep), **fields))


def folded(first: dict, inputs: list | None, input: dict, keep: int) -> list:
    """A run's ``inputs`` once ``input`` replaced its input ``first``: oldest first, the
    newest ``keep`` of them (``inputs`` NULL: nothing was folded before)."""
    return [*(inputs if inputs is not None else [first]), input][-keep:]


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


def update_waiting_input(run_id: uuid.UUID, input: dict, *, keep: int) -> None:
    """The run waiting behind a key (locked by the caller) takes a newer input, folded
    into its inputs like ``update_pending_input``'s."""
    runs = Run.objects.filter(id=run_id, status=Status.PENDING, holds_key=False)
    found = runs.values_list("input", "inputs").first()
    if found is not None:
        runs.update(input=input, inputs=folded(*found, input, keep))


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
        with atomic():
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


# --- acting on runs -------------------------------------------------------------


def lock_run(run_id: uuid.UUID, *fields: str) -> Run:
    """The run (only ``fields``, when named), its row locked until the caller's
    transaction ends, for an operation that decides from what it reads (retry, release
    its key, deliver an event: a suspension locks the row too, so the two never miss
    each other); ``Run.DoesNotExist`` when there is no such run."""
    runs = Run.objects.select_for_update()
    return (runs.only(*fields) if fields else runs).get(id=run_id)


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


def resume_failed(
    run_id: uuid.UUID, *, timeout: timedelta | None = None, state: dict | None = None
) -> bool:
    """A failed run becomes due again at the step that failed, with a fresh attempt
    count, no lost workers counted, no error, and a fresh deadline ``timeout`` from now;
    ``state``: its ``Run.state`` from now on (unchanged when None)."""
    at = now()
    changes: dict = {"timeout_at": at + timeout} if timeout is not None else {}
    if state is not None:
        changes["state"] = state
    return bool(
        Run.objects.filter(id=run_id, status=Status.FAILED).update(
            status=Status.PENDING,
            attempt=1,
            recoveries=0,
            due_at=at,
            error=None,
            finished_at=None,
            worker_id=None,
            lease_expires_at=None,
            **changes,
        )
    )
