"""What the worker says, in sentences a person reads in a log: how a run failed
(the step, the attempt, the exception's type and message), what the worker serves,
and what a ``--burst`` worker left due when it stopped, with why."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django_durable import conf, store

if TYPE_CHECKING:
    from django_durable.runtime.worker import Worker

__all__ = ["burst_left", "error_said", "outcome", "served", "step_failed"]

# Shown by name in a start-up line; beyond it, counted.
NAMES_SHOWN = 20
# The names of the Django Tasks backend's workflows begin with it (tasks/workflows.py).
TASK_PREFIX = "task:"


def error_said(error: Any) -> str:
    """``"ValueError: card declined"``: a run's or an attempt's error, type and message."""
    if isinstance(error, dict):
        kind, message = error.get("type"), error.get("message")
        if kind and message:
            return f"{kind}: {message}"
        return str(kind or message or error)
    return str(error)


def step_failed(step: str, attempt: int, attempts: int, error: Any) -> str:
    """``"failed in step 'charge' (attempt 3 of 3): ValueError: card declined"``;
    a step that gave up before its last attempt (``NonRetryable``, ``give_up_on``, an
    input's ``on_timeout="fail"``) says it was not retried."""
    which = f"attempt {attempt} of {attempts}" if attempt >= attempts else f"attempt {attempt}"
    if attempt < attempts:
        which += ", not retried"
    return f"failed in step {step!r} ({which}): {error_said(error)}"


def outcome(run, outcome: str, steps: int, took: float) -> str:
    """How a claim of ``run`` ended: ``"completed after 2 step(s) in 0.012s"``; a
    failed run says where and why (``step_failed``), not "failed after 1 step(s)"."""
    said = getattr(run, "failure_said", None) if outcome == "failed" else None
    if said:
        return f"{said}; {steps} step(s) run in {took:.3f}s"
    return f"{outcome} after {steps} step(s) in {took:.3f}s"


def served(served: tuple[list[str], list[str]] | None, registered: Sequence[Any]) -> str:
    """What a worker claims (``registry.served()``), said truthfully: every workflow
    (a finder may import any name: ``registered``, the workflow classes defined, are
    named), the ones it has the code of, or none."""
    if served is None:
        registered = sorted(getattr(w, "name", w) for w in registered)
        names = _names(registered)
        return (
            f"serves every workflow: the {len(registered)} defined here ({names}) and any "
            "other name a finder imports"
        )
    names, prefixes = served
    found = ", ".join(prefix + "*" for prefix in prefixes)
    if not names and not prefixes:
        return (
            "serves no workflow: none is defined in this process (workflows are found in "
            "the workflows.py module of each app in INSTALLED_APPS); runs wait for a worker "
            "that has their code"
        )
    if not names:
        return (
            f"serves no workflow defined in its code, only those found by name: {found} "
            "(workflows are found in the workflows.py module of each app in INSTALLED_APPS)"
        )
    listed = _names(names)
    listed = f"the workflow {listed}" if len(names) == 1 else f"the {len(names)} workflows {listed}"
    if prefixes:
        listed += " and " + " and ".join(_prefix_said(prefix) for prefix in prefixes)
    return f"serves {listed} (runs of other workflows wait for a worker that has their code)"


def _prefix_said(prefix: str) -> str:
    """``every Django task`` for the Tasks backend's workflows (``task:``), else
    ``every workflow whose name starts with 'x'``."""
    if prefix == TASK_PREFIX:
        return "every Django task"
    return f"every workflow whose name starts with {prefix!r}"


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "") if names else "none"


def burst_left(worker: Worker) -> str:
    """Why a ``--burst`` worker that found nothing to claim stops: nothing is due (and
    when the next run is), or what is due and why it may not claim it."""
    due = store.due_now_by_workflow()
    if not due:
        return "nothing is due, stopping (burst)" + _next_due(worker)
    paused = store.paused_queues()
    limits = conf.queue_limits()
    running = (
        {name: counts["running"] for name, counts in store.queue_counts()[0].items()}
        if limits
        else {}
    )
    reasons = [
        f"{count} due run(s) of {workflow} in queue {queue}: "
        + _why(worker, queue, workflow, paused, limits, running)
        for queue, workflow, count in due
        if not worker.queues or queue in worker.queues
    ]
    elsewhere: dict[str, int] = {}
    for queue, _workflow, count in due:
        if worker.queues and queue not in worker.queues:
            elsewhere[queue] = elsewhere.get(queue, 0) + count
    reasons += [
        f"{count} due run(s) in queue {queue}, which this worker does not serve (--queues)"
        for queue, count in elsewhere.items()
    ]
    return "nothing it may claim is due, stopping (burst); left: " + "; ".join(reasons)


def _why(worker, queue: str, workflow: str, paused, limits, running) -> str:
    if queue in paused:
        return f"the queue is paused (python manage.py durable resume {queue})"
    if not _knows(worker, workflow):
        return (
            "this worker does not have the code of this workflow (not in its "
            "workflows.py modules; a worker started before it was added needs a restart)"
        )
    limit = limits.get(queue)
    if limit is not None and running.get(queue, 0) >= limit:
        return (
            f"the queue is at its concurrency limit ({running.get(queue, 0)} of {limit} "
            'running, DURABLE["QUEUES"])'
        )
    return "another worker claimed them, or they became due as this one stopped"


def _knows(worker, workflow: str) -> bool:
    if worker.workflows is None:
        return True
    return workflow in worker.workflows or any(workflow.startswith(p) for p in worker.prefixes)


def _next_due(worker) -> str:
    at = store.next_due_at(worker.queues)
    if at is None:
        return ""
    when = at.isoformat(timespec="seconds")
    return f"; the next run is due at {when} (a sleep, a retry's backoff, a delayed start...)"
