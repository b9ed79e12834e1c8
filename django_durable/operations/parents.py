"""Waking a parent run that waits for its children (``waiting_for="children"``).

A child that finishes wakes its parent through ``finish.run_finished``; the
worker's sweep wakes the ones a crash left asleep, and parents awaiting runs
that are not their children (a keyed call answered by an existing holder).
"""

from __future__ import annotations

import uuid

from django_durable import store
from django_durable.models import FINISHED_STATUSES, Status
from django_durable.operations import state as run_state


def verdict(ids: list[uuid.UUID], outcomes: dict, mode: str) -> str:
    """``completed``, ``failed`` or ``wait`` for the awaited runs and ``mode``."""
    statuses = [outcomes[i][0] if i in outcomes else "deleted" for i in ids]
    done = [s for s in statuses if s in FINISHED_STATUSES or s == "deleted"]
    failed = [s for s in done if s != Status.COMPLETED]
    if failed and (mode == "fail_fast" or len(done) == len(ids)):
        return "failed"
    if len(done) == len(ids):
        return "completed"
    return "wait"


def wake_if_ready(parent_id: uuid.UUID) -> bool:
    """Wake a parent waiting for children when what it waits for has happened."""
    state = store.waiting_parent_state(parent_id)
    if state is None:
        return False
    awaiting = run_state.awaiting(state)
    ids = [uuid.UUID(i) for i in awaiting.get("ids") or []]
    outcome = verdict(ids, store.run_outcomes(ids), awaiting.get("mode", "complete_all"))
    if outcome == "wait":
        return False
    return store.wake_parent(parent_id)


def after_suspend(run_id: uuid.UUID) -> None:
    """A child may have finished between the parent's look and its suspend: look again."""
    wake_if_ready(run_id)


def sweep() -> int:
    """Wake every parent whose children are done (a wake lost to a crash, or a
    parent awaiting runs that are not its children)."""
    woken = 0
    for parent_id, _state in store.waiting_parents():
        woken += wake_if_ready(parent_id)
    return woken
