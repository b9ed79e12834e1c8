"""Where a wait meets its event or input, from both sides: a delivery to a waiting run
(``deliver``: ``send_event``, ``provide_input``, a duplicate start's ``send_event``)
and a run suspending in a wait (``suspend``: the executor's). Both decide here, from
the run's state (``state.py``), and the store writes what they decided.

Each takes the run's row lock first (``store.lock_run``,
``store.lock_owned_state``), in one transaction with its writes, so an event sent at
the moment a run suspends is either seen by the suspension (kept, then delivered at
once) or finds the run waiting: the two never miss each other.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django_durable import store
from django_durable.models import FINISHED_STATUSES, Run, Status
from django_durable.operations import state as run_state

__all__ = ["deliver", "suspend"]


def deliver(
    run_id: uuid.UUID,
    kind: str,
    name: str,
    payload: Any,
    *,
    keep: bool,
    check: Callable[[dict, Any], None] | None = None,
) -> str:
    """Give an event or input to a run: ``"delivered"`` when it was waiting for it,
    ``"kept"`` when it is kept for a later wait, ``"refused"`` otherwise.

    A delivery that completes the wait (its event or input; one of a
    ``wait_for_any``'s events; the last missing one of a ``wait_for_all``'s) makes
    the run due; one that leaves a ``wait_for_all`` short keeps the payload in the
    run's state and the run waiting. ``check(pending_wait, payload)`` is called
    before anything is written when the run waits for it (``provide_input`` checks
    the input's kind there); what it raises leaves everything as it was.
    """
    slot = run_state.event_slot(kind, name)
    with store.atomic():
        run = store.lock_run(run_id, "id", "status", "waiting_for", "state", "queue")
        if run.status == Status.WAITING and slot in run_state.awaited_slots(run.state):
            if check is not None:
                check(run_state.pending_wait(run.state), payload)
            state = run_state.delivered(run.state, slot, payload)
            wake = run_state.satisfied(state)
            label = None if wake else run_state.waiting_label(state)
            store.record_delivery(
                run, kind, name, payload, state=state, waiting_for=label, wake=wake
            )
            return "delivered"
        if keep and run.status not in FINISHED_STATUSES:
            store.keep_event(run_id, kind, name, payload)
            return "kept"
        return "refused"


@store.retry_deadlocks
def suspend(
    run: Run,
    step_name: str,
    started_at: datetime,
    context: dict,
    waits: list,
    wait,
    *,
    partial: dict | None = None,
) -> None:
    """Suspend the run in ``wait`` (after passing ``waits``) and free the worker.

    Kept events answer the wait: the newest of each name it waits for
    (``wait_for_any``: the newest of them all). When they are all it needs, the run
    is due at once; otherwise it waits, due at the wait's timeout or the run's,
    whichever comes first. ``partial``: what the step changed in the context so far
    (``replay.step_changes``). ``LeaseLost`` when the run is no longer this
    worker's (nothing written).
    """
    at = store.now()
    with store.atomic():
        locked = store.lock_owned_state(run)
        kept = _kept_events(run, wait, run_state.received(locked))
        payloads = {slot: payload for slot, (_id, payload) in kept.items()}
        state = run_state.suspended(locked, waits, wait, payloads, at)
        if partial is not None:
            state = run_state.with_partial(state, partial)
        if run_state.satisfied(state):
            status, due, label = Status.PENDING, at, None
        else:
            due = wait.until
            if run.timeout_at is not None and (due is None or run.timeout_at < due):
                due = run.timeout_at
            status, label = Status.WAITING, run_state.waiting_label(state)
        store.record_suspension(
            run,
            step_name,
            started_at,
            status=status,
            due_at=due,
            waiting_for=label,
            state=state,
            context=context,
            delivered=[event_id for event_id, _payload in kept.values()],
            at=at,
        )


def _kept_events(run: Run, wait, got: dict) -> dict[str, tuple[int, Any]]:
    """The kept (``buffer=True``) events that answer ``wait``, by slot, as ``(id,
    payload)``: the newest per name, one query per name not yet received (a wait
    names a few events)."""
    if wait.kind == "event":
        names = [wait.name]
    elif wait.kind in ("any", "all"):
        names = list(wait.names)
    else:
        return {}
    found: dict[str, tuple[int, Any]] = {}
    for name in names:
        slot = run_state.event_slot("event", name)
        if slot in got:
            continue
        event = store.kept_event(run.id, name)
        if event is not None:
            found[slot] = event
    if wait.kind == "any" and len(found) > 1:
        newest = max(found, key=lambda slot: found[slot][0])
        found = {newest: found[newest]}
    return found
