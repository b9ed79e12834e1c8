"""Helpers for tests of projects that use django-durable (docs/testing.md).

- ``drain()`` runs, in the test's process, what is due until nothing is; with
  ``run_timers=True`` it also runs what is due later, moving the runs' timers
  forward instead of waiting for them.
- ``runs_of()`` and the ``assert_*`` helpers look at what was started and how it
  ended, with a message that says what was found instead.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db.models import QuerySet

from django_durable import conf, store
from django_durable.models import Run, Status
from django_durable.operations import finish as lifecycle
from django_durable.operations import flow
from django_durable.runtime import executor
from django_durable.workflows.definition import Workflow, registry

__all__ = [
    "assert_completed",
    "assert_failed",
    "assert_not_started",
    "assert_started",
    "drain",
    "runs_of",
]

_ANY: Any = object()  # "not given", where None is a value worth asserting


def drain(
    max_seconds: float = 10,
    *,
    run_timers: bool = False,
    queues: Sequence[str] | None = None,
) -> int:
    """Run, in this process, everything that is due now until nothing is due; return
    how many steps ran. Stops after ``max_seconds`` even if work remains.

    Without ``run_timers``, what is due later (sleeps, backoffs between retries,
    debounce periods, delayed starts, waits' timeouts) is left for later. With
    ``run_timers=True``, once nothing is due the runs' timers move forward to the
    earliest one (``store.advance_timers``: every planned time of the unfinished
    runs moves earlier by the same span, as if the clock had jumped), and draining
    goes on, timer after timer in due order, until no run has a timer left.
    Recorded times (``created_at``, the attempts') stay the real ones.

    ``queues``: drain only these queues (a timer of any queue may move when the
    clock jumps). Paused queues, queue limits and flow limits are honoured, as a
    worker does (with ``run_timers=True`` the end of a rate's window is a timer too);
    schedules are not fired (``durable.trigger_schedule()`` fires one).
    """
    deadline = time.monotonic() + max_seconds
    worker_id = f"drain-{os.getpid()}-{threading.get_ident()}"
    lease = conf.get("LEASE")
    served = list(queues) if queues is not None else None
    steps = 0
    shift = timedelta(0)  # how far the timers jumped: the rates' clock moves with them
    retried = False
    while time.monotonic() < deadline:
        lifecycle.sweep_waiting()
        runs = store.claim(
            worker_id=worker_id,
            queues=served,
            limit=1,
            lease=lease,
            flow_limits=flow.shifted_limits(shift),
        )
        if not runs:
            jumped = _jump_to_next_timer(served, shift) if run_timers else None
            if jumped is not None:
                shift += jumped
                continue
            if run_timers and not retried:
                # A rate's window may have slid past its oldest begin between the
                # claim that found nothing and the look for the next timer (which
                # then sees no rate holding a run back): one more claim says.
                retried = True
                continue
            break
        retried = False
        for run in runs:
            steps += executor.execute(run)
    return steps


def _jump_to_next_timer(queues: list[str] | None, shift: timedelta) -> timedelta | None:
    """Make the earliest timer of ``queues`` due now, the end of a rate's window among
    them (flow control: a due run its flow key's rate holds back); return how far the
    clock jumped, None when there is no timer (or the earliest is due already and
    still not claimable: a queue or a flow key at its limit)."""
    at = store.now()
    due = store.next_due_at(queues)
    targets = [due] if due is not None and due > at else []
    window_end = flow.next_rate_window_end(shift)
    if window_end is not None and window_end > at:
        targets.append(window_end)
    if not targets:
        return None
    to = min(targets)
    store.advance_timers(to)
    return to - at


def runs_of(workflow: type[Workflow] | str, status: str | None = None) -> QuerySet[Run]:
    """The runs of ``workflow`` (a class or its name), oldest first; only those with
    ``status`` when given (``"completed"``, ``durable.models.Status.FAILED``...)."""
    runs = Run.objects.filter(workflow=_name(workflow))
    if status is not None:
        runs = runs.filter(status=status)
    return runs.order_by("created_at", "id")


def assert_started(
    workflow: type[Workflow] | str,
    *,
    key: str | None = None,
    input: dict[str, Any] | None = None,
    count: int | None = None,
) -> Run:
    """Assert that ``workflow`` was started (with ``key``, with exactly ``input`` when
    given): at least once, or exactly ``count`` times. Returns the newest such run.

    A start that a key answered with an existing run starts nothing, so
    ``count=1`` after two starts with one key checks the key did its job.
    """
    if count is not None and (not isinstance(count, int) or count < 1):
        raise ValueError(f"count is 1 or more (assert_not_started checks for none), got {count!r}")
    name = _name(workflow)
    candidates = runs_of(name)
    if key is not None:
        candidates = candidates.filter(key=key)
    found = [run for run in candidates if input is None or run.input == input]
    if not found or (count is not None and len(found) != count):
        wanted = "at least once" if count is None else f"{count} time(s)"
        what = "".join(
            f" with {label}={value!r}" for label, value in (("key", key), ("input", input))
            if value is not None
        )  # fmt: skip
        raise AssertionError(
            f"expected {name} to be started{what} {wanted}, found {len(found)}; "
            f"its runs: {_describe(runs_of(name))}"
        )
    return found[-1]


def assert_not_started(workflow: type[Workflow] | str, *, key: str | None = None) -> None:
    """Assert that ``workflow`` has no run (with ``key``, when given)."""
    runs = runs_of(workflow)
    if key is not None:
        runs = runs.filter(key=key)
    if runs.exists():
        raise AssertionError(f"expected no run of {_name(workflow)}, found {_describe(runs)}")


def assert_completed(run_id: uuid.UUID | str, *, result: Any = _ANY) -> Run:
    """Assert that the run completed (and returned ``result``, when given); the message
    says how it ended otherwise, with its error. Returns the run."""
    run = Run.objects.get(id=run_id)
    if run.status != Status.COMPLETED:
        raise AssertionError(f"run {run.id} ({run.workflow}) {_state(run)}, not completed")
    if result is not _ANY and run.result != result:
        raise AssertionError(
            f"run {run.id} ({run.workflow}) completed with {run.result!r}, not {result!r}"
        )
    return run


def assert_failed(run_id: uuid.UUID | str, *, error: str | None = None) -> Run:
    """Assert that the run failed (with ``error`` in its error, when given). Returns the
    run."""
    run = Run.objects.get(id=run_id)
    if run.status != Status.FAILED:
        raise AssertionError(f"run {run.id} ({run.workflow}) {_state(run)}, not failed")
    if error is not None and error not in _error_text(run):
        raise AssertionError(
            f"run {run.id} ({run.workflow}) failed with {_error_text(run)!r}, "
            f"which does not contain {error!r}"
        )
    return run


def _name(workflow: type[Workflow] | str) -> str:
    if isinstance(workflow, str):
        return workflow
    return registry.resolve(workflow).name


def _error_text(run: Run) -> str:
    if run.error is None:
        return ""
    return run.error if isinstance(run.error, str) else json.dumps(run.error)


def _state(run: Run) -> str:
    """How a run stands, for a failed assertion: its status, its error, and for a run
    that waits on a timer, that ``run_timers=True`` would run it now."""
    said = f"is {run.status}"
    if run.error:
        said += f" (error: {_error_text(run)})"
    if run.due_at is not None and run.due_at > store.now():
        said += f"; due at {run.due_at.isoformat()}: drain(run_timers=True) runs it now"
    elif run.status == Status.WAITING and run.waiting_for:
        said += f"; waiting for {run.waiting_for}"
    return said


def _describe(runs: QuerySet[Run]) -> str:
    listed = [
        f"{run.id} key={run.key!r} status={run.status} input={run.input!r}" for run in runs[:10]
    ]
    return "; ".join(listed) if listed else "none"
