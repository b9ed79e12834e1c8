"""Sagas: when a step fails for good, undo the steps that completed, newest first.

A step declares its undo with ``@step(compensate="method")``. When the run fails
for good (its step ran out of retries, or the run passed its timeout), and at
least one completed step has a compensation, the run turns ``compensating``
instead of ``failed``: it keeps its key, cannot be cancelled, and runs those
compensations in reverse order, each recorded as a ``StepAttempt`` of kind
``compensation``. A compensation retries ``compensate_retries`` times (by
default as many as its step's ``retries``) with the step's backoff; between
attempts the run stays compensating and no worker holds it.

The run ends ``compensated`` when every compensation succeeded, or
``compensation_failed`` at the first one that failed for good (the ones after
it are not run: what is left to undo needs a person). ``run.error`` stays the
original error; a failed compensation adds its own under ``error["compensation"]``.
"""

from __future__ import annotations

import logging
from typing import Any

from django_durable import store, telemetry
from django_durable.exceptions import Cancelled
from django_durable.models import Run
from django_durable.operations import finish, replay
from django_durable.operations import state as run_state
from django_durable.operations.state import Suspend
from django_durable.runtime import calling
from django_durable.runtime.context import Context
from django_durable.runtime.errors import describe_error, step_lost_its_connection
from django_durable.workflows.definition import Workflow
from django_durable.workflows.values import check_json

logger = logging.getLogger("django_durable.runtime.compensation")


def pending_for(workflow: type[Workflow], run: Run) -> list[int]:
    """Indexes of the completed steps with a compensation, newest first.

    Steps run in order, so every step before ``run.step_index`` completed; the
    step that failed is not compensated (it did not complete).
    """
    return [i for i in reversed(range(run.step_index)) if workflow.steps[i].compensate]


def lost_step(state: dict) -> int:
    """The compensation a compensating run whose worker was lost was running (the
    first still pending: recovery records its attempt as lost)."""
    return (run_state.compensation_pending(state) or [0])[0]


def begin(
    workflow: type[Workflow],
    run: Run,
    pending: list[int],
    error: dict,
    *,
    step_name: str | None = None,
    started_at=None,
) -> int:
    """Switch a run that failed for good to compensating and undo what it did.

    Returns how many compensations ran. The worker keeps the run: the first
    compensation starts at once.
    """
    if step_name is not None:
        error = {**error, "step": step_name}
    try:
        with store.atomic():
            state = run_state.with_compensation(store.lock_owned_state(run), pending, step_name)
            store.begin_compensating(run, step_name, started_at, error, state)
    except store.LeaseLost:
        return 0
    logger.info(
        "run %s (%s) failed; compensating %d steps",
        run.id,
        run.workflow,
        len(pending),
        extra=telemetry.log_fields(run, step=step_name),
    )
    return compensate(workflow, run)


def compensate(workflow: type[Workflow], run: Run) -> int:
    """Run the remaining compensations of a claimed compensating run, in order."""
    instance = workflow()
    executed = 0
    while True:
        pending = run_state.compensation_pending(run.state)
        if not pending:
            # Nothing left (e.g. recovered just after the last one was recorded).
            return executed
        index = pending[0]
        step = workflow.steps[index]
        started_at = store.now()
        ctx = Context(run, waits=[], starts_runs=False, step=step.name, step_index=index)
        executed += 1
        try:
            output = _call(run, instance, step.compensate, ctx)
        except (Cancelled, store.LeaseLost):
            return executed  # the run is no longer ours
        except Exception as exc:
            if step_lost_its_connection(exc):
                # Not the compensation's failure: still claimed, the worker hands the
                # run back (now, or once the database answers) and it runs again.
                logger.warning(
                    "run %s (%s): the database connection was lost during compensation "
                    "%s: %s; handing it back",
                    run.id,
                    run.workflow,
                    step.compensate,
                    exc,
                    extra=telemetry.log_fields(run, step=step.name),
                )
                store.reset_connection_after_error(drop=True)
                return executed
            _failed(run, index, step, started_at, exc)
            return executed
        try:
            # The next compensation is the first still pending (state.py keeps the order).
            state = run_state.without_compensated(run.state, index)
            store.record_compensation_completed(
                run,
                index,
                step.compensate,
                started_at,
                output,
                ctx.data,
                state=state,
                last=not run_state.compensation_pending(state),
                # What it replaced in the context, with its attempt, for a rerun
                # (operations/replay.py).
                replaced=replay.changes(run.context, ctx.data),
            )
        except store.LeaseLost:
            return executed
        if run.is_finished:
            logger.info(
                "run %s (%s) compensated", run.id, run.workflow, extra=telemetry.log_fields(run)
            )
            _finished(run)
            return executed


def _call(run: Run, instance: Workflow, method_name: str, ctx: Context) -> Any:
    try:
        output = calling.call(run, getattr(instance, method_name), ctx)
    except Suspend:
        raise RuntimeError(
            f"compensation {method_name} tried to wait; compensations cannot sleep, wait "
            "for events or input, or call workflows"
        ) from None
    return check_json(output, f"the return value of compensation {method_name}")


def _failed(run: Run, index: int, step, started_at, exc: Exception) -> None:
    error = {**describe_error(exc), "step": step.name, "method": step.compensate}
    retry_at = None
    if run.attempt <= step.compensate_retries:
        retry_at = store.now() + step.delay_before(run.attempt + 1)
    run_error = {**(run.error or {}), "compensation": error}
    try:
        store.record_compensation_failed(
            run, index, step.compensate, started_at, error, retry_at=retry_at, run_error=run_error
        )
    except store.LeaseLost:
        return
    if retry_at is None:
        logger.warning(
            "run %s (%s): compensation %s failed for good",
            run.id,
            run.workflow,
            step.compensate,
            extra=telemetry.log_fields(run, step=step.name),
        )
        _finished(run)


def _finished(run: Run) -> None:
    finish.run_finished(run)
