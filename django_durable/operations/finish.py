"""The one path every ending of a run takes: ``run_finished``.

However a run ends (its last step, a failure, a timeout, a compensation, a
cancel, a cancel cascaded from its parent, a ``cancel_existing`` start), the
same things happen, in this order: the ``run_finished`` signal (and telemetry)
after commit; the run waiting behind its key goes on; its parent is woken; the
children it left going are cancelled, each of them finishing through this path
too. The worker's sweep calls ``promote_waiting`` again for a finish whose
hand-on was interrupted by a crash.
"""

from __future__ import annotations

import logging
import uuid

from django_durable import signals, store, telemetry
from django_durable.models import FINISHED_STATUSES, Activity, Run, Status
from django_durable.operations import keys, parents
from django_durable.operations import state as run_state
from django_durable.workflows.definition import registry

logger = logging.getLogger("django_durable")


def workflow_class(name: str):
    try:
        return registry.get(name)
    except LookupError:
        return None


def announce_finished(run: Run) -> None:
    store.send_after_commit(
        signals.run_finished,
        workflow_class(run.workflow),
        run_id=run.id,
        workflow=run.workflow,
        key=run.key,
        status=run.status,
    )


def run_finished(run: Run, *, promote: bool = True) -> None:
    """Announce a finished run, let the run waiting behind its key go on, wake its
    parent and cancel the children it left going.

    ``promote=False``: a ``cancel_existing`` start replaced the run, and the run
    waiting behind the key now waits behind the replacement.
    """
    announce_finished(run)
    if getattr(run, "wrote_streams", False):
        # Its streams ended: their readers stop now, not at their next look.
        store.notify_streams(str(run.id))
    if promote and run.key is not None:
        promote_waiting(run.workflow, run.key)
    if run.parent_id is not None:
        parents.wake_if_ready(run.parent_id)
    # Only a run that started children records them (a run that never did costs
    # no query here, unless it was cancelled); the ones a failed call forgot have
    # all finished.
    if run_state.has_children(run.state) or run.status == Status.CANCELLED:
        orphans = store.active_children(run.id)
        if orphans:
            cancel_runs(orphans, f"its parent run ended {run.status}")


def cancel_runs(ids, reason: str) -> list[uuid.UUID]:
    """Cancel those of ``ids`` still going (compensating ones finish first); each
    cancelled run finishes through ``run_finished``, so its own children follow."""
    error = {"type": "Cancelled", "message": reason, "reason": reason}
    cancelled = [run_id for run_id in ids if store.cancel_run(run_id, error)]
    for run_id in cancelled:
        run_finished(Run.objects.get(id=run_id))
    return cancelled


@store.retry_deadlocks
def promote_waiting(workflow_name: str, key: str) -> None:
    """If a ``run_again`` run waits behind a key whose holder has finished, move it on.

    It takes the key when the holder's ``reuse`` lets the key go, is cancelled
    when ``reuse`` keeps it, and waits behind a newer holder that took the key
    in between.
    """
    # Most keys have no run waiting behind them: one read without a lock says so,
    # and the finish costs one round trip. It cannot miss a waiting run: a run_again
    # start locks the holder and checks it is still going before it inserts one, so
    # the holder's finish (an UPDATE of that row, before this) waited for that start
    # to commit, and this read sees what it committed.
    if store.get_waiting_behind(workflow_name, key) is None:
        return
    with store.atomic():
        # The store's lock order: the holder first, then the run waiting behind it.
        holder = store.get_holder(workflow_name, key, lock=True)
        waiting = store.get_waiting_behind(workflow_name, key, lock=True)
        if waiting is None:
            return
        if holder is not None and holder.status not in FINISHED_STATUSES:
            if waiting.runs_after_id != holder.id:
                store.wait_behind(waiting.id, holder.id)
            return
        workflow = workflow_class(workflow_name)
        reuse = workflow.reuse if workflow else "after_close"
        if holder is not None and not keys.reuse_frees(reuse, holder.status):
            store.cancel_run(
                waiting.id,
                {
                    "type": "KeyKept",
                    "message": (
                        f"run {holder.id} ended {holder.status} and reuse={reuse!r} keeps "
                        "the key, so the run waiting behind it does not run"
                    ),
                    "holder_id": str(holder.id),
                },
            )
            return
        if holder is not None:
            store.release_key(holder.id, statuses=[holder.status])
        timeout = workflow.timeout if workflow else None
        if not store.take_key_and_run(waiting.id, timeout=timeout):
            # A start took the free key first: wait behind that run instead.
            newer = store.get_holder(workflow_name, key)
            if newer is not None:
                store.wait_behind(waiting.id, newer.id)
            return
        store.record_activity(
            Activity.Kind.KEY_HANDED_OFF,
            run_id=waiting.id,
            workflow=workflow_name,
            key=key,
            details={
                "from_run_id": str(holder.id) if holder else None,
                "to_run_id": str(waiting.id),
            },
        )
        store.notify_due(waiting.queue)
        store.send_after_commit(
            signals.key_handoff,
            workflow,
            from_run_id=holder.id if holder else None,
            to_run_id=waiting.id,
            workflow=workflow_name,
            key=key,
        )
    logger.info(
        "run %s took key %r of %s",
        waiting.id,
        key,
        workflow_name,
        extra=telemetry.log_fields(waiting),
    )


def sweep_waiting() -> int:
    """Move on every run waiting behind a finished or vanished holder."""
    stuck = store.waiting_behind_finished()
    for workflow_name, key in stuck:
        promote_waiting(workflow_name, key)
    parents.sweep()
    return len(stuck)
