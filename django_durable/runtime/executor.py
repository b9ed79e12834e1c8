"""Runs one claimed run, step by step. It has no SQL of its own: every write goes
through ``store``, fenced by the claim, and a finished run is handed to
``finish.run_finished`` so its key moves on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django_durable import state as run_state
from django_durable import store
from django_durable.exceptions import Cancelled
from django_durable.models import Run, Status
from django_durable.operations import children, finish, parents
from django_durable.runtime import calling, compensation
from django_durable.runtime.errors import describe_error
from django_durable.workflows.context import (
    Context,
    Suspend,
    check_json,
)
from django_durable.workflows.definition import Workflow, registry

logger = logging.getLogger("django_durable.runtime.executor")


def _resume_waits(run: Run) -> list[Any]:
    """The values of the current step's passed waits (``state.resume``)."""
    waits, run.state = run_state.resume(run.state)
    return waits


def execute(run: Run, *, should_stop: Callable[[], bool] | None = None) -> int:
    """Run the claimed ``run`` until it finishes, suspends or fails; return steps executed.

    ``should_stop`` is asked before each step: when it says yes (the worker is
    shutting down) the run is left as it is, still claimed, for the worker to hand back.
    """
    try:
        workflow = registry.get(run.workflow)
    except LookupError as exc:
        return _fail_outside_steps(run, describe_error(exc))

    if run.status == Status.COMPENSATING:
        return compensation.compensate(workflow, run)
    instance: Workflow = workflow()
    waits = _resume_waits(run)
    executed = 0
    while run.step_index < len(workflow.steps):
        if should_stop is not None and should_stop():
            return executed
        if run.timeout_at is not None and store.now() >= run.timeout_at:
            timeout_error = {
                "type": "Timeout",
                "message": f"the run passed its timeout ({workflow.timeout})",
            }
            if to_undo := compensation.pending_for(workflow, run):
                return executed + compensation.begin(workflow, run, to_undo, timeout_error)
            return executed + _fail_outside_steps(run, timeout_error)
        step = workflow.steps[run.step_index]
        ctx = Context(run, waits=waits, children=children)
        started_at = store.now()
        executed += 1
        try:
            with children.current_step(ctx):
                output = calling.call(run, step, instance, ctx)
            check_json(output, f"the return value of step {step.name}")
        except Suspend as wait:
            try:
                store.record_suspended(run, step.name, started_at, ctx.data, waits, wait)
            except store.LeaseLost:
                return executed
            if wait.kind == "children":
                parents.after_suspend(run.id)
            return executed
        except Cancelled:
            _record_cancelled(run, step.name, started_at)
            return executed
        except store.LeaseLost:
            return executed
        except Exception as exc:
            error = describe_error(exc)
            retry_at = None
            if run.attempt <= step.retries:
                retry_at = store.now() + step.delay_before(run.attempt + 1)
            elif to_undo := compensation.pending_for(workflow, run):
                return executed + compensation.begin(
                    workflow, run, to_undo, error, step_name=step.name, started_at=started_at
                )
            try:
                store.record_step_failed(run, step.name, started_at, error, retry_at=retry_at)
            except store.LeaseLost:
                return executed
            if retry_at is None:
                logger.info("run %s (%s) failed at step %s", run.id, run.workflow, step.name)
                _finished(run)
            else:
                logger.info(
                    "run %s (%s) step %s failed, attempt %d at %s",
                    run.id,
                    run.workflow,
                    step.name,
                    run.attempt,
                    retry_at,
                )
            return executed

        run.context = ctx.data
        waits = []
        last = run.step_index == len(workflow.steps) - 1
        try:
            store.record_step_completed(run, step.name, started_at, output, last=last)
        except store.LeaseLost:
            return executed
    logger.debug("run %s (%s) completed", run.id, run.workflow)
    _finished(run)
    return executed


def _record_cancelled(run: Run, step_name: str, started_at) -> None:
    """The step noticed the cancel at a heartbeat: note the attempt, run no later step."""
    status = store.current_status(run.id)
    if status and status[0] == Status.CANCELLED:
        store.record_attempt_cancelled(run, step_name, started_at)


def _fail_outside_steps(run: Run, error: dict) -> int:
    try:
        store.record_run_failed(run, error)
    except store.LeaseLost:
        return 0
    _finished(run)
    return 0


def _finished(run: Run) -> None:
    finish.run_finished(run)
