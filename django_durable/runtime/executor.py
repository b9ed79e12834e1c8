"""Runs one claimed run, step by step. It has no SQL of its own: every write goes
through ``store``, fenced by the claim, and a finished run is handed to
``finish.run_finished`` so its key moves on.

What ends an attempt, and what follows (docs/production.md, "Running safely"):

- the step returns and its outcome is recorded: the run goes on;
- the step raises anything (``BaseException`` included: ``SystemExit`` from a
  library is the step's failure, not the worker's), or its outcome cannot be
  recorded (a result or context value that is not JSON, that a database refuses,
  or that is over ``DURABLE["MAX_VALUE_BYTES"]``): a failed attempt, which
  follows ``retries`` (``NonRetryable`` and ``give_up_on`` skip them);
- the step passed its ``timeout`` or the run's deadline: a failed attempt
  (``StepTimeout``) or a timed-out run; whatever the step returned is dropped;
- the database connection was lost (or landed on a standby): not the step's
  failure; the run is handed back (``store.hand_back_lost``) now, or by the worker
  as soon as the database answers again; an outage does not count against
  ``DURABLE["MAX_RECOVERIES"]``;
- the worker is shutting down and the step was interrupted: the run is handed
  back by the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from django.db import DatabaseError

from django_durable import conf, store, telemetry
from django_durable.exceptions import (
    Cancelled,
    DefinitionChanged,
    NonRetryable,
    RunTimedOut,
    StepTimeout,
)
from django_durable.models import Run, Status
from django_durable.operations import children, deliveries, finish, parents, replay
from django_durable.operations import state as run_state
from django_durable.operations.state import Suspend
from django_durable.runtime import calling, compensation, telling
from django_durable.runtime.context import Context
from django_durable.runtime.errors import (
    describe_error,
    is_connection_fault,
    step_lost_its_connection,
)
from django_durable.workflows.definition import StepDef, Workflow, registry
from django_durable.workflows.values import check_json, check_size

logger = logging.getLogger("django_durable.runtime.executor")


def _resume_waits(run: Run) -> list[Any]:
    """The values of the current step's passed waits (``state.resume``)."""
    waits, run.state = run_state.resume(run.state)
    return waits


def definition_mismatch(workflow: type[Workflow], run: Run) -> str | None:
    """Why the run may not run the definition's step at its ``step_index``, or None.

    A run records the names of its steps when it starts. While it is within them,
    the step the definition has at that position must bear the recorded name;
    past them (steps added at the end since) any step may run.
    """
    recorded = run.step_names or []
    index = run.step_index
    if index >= len(recorded):
        return None
    expected = recorded[index]
    if index < len(workflow.steps) and workflow.steps[index].name == expected:
        return None
    found = workflow.steps[index].name if index < len(workflow.steps) else "no step"
    return (
        f"the run is at step {index + 1} ({expected!r}), but the deployed definition of "
        f"{workflow.name} has {found!r} there; it was started with "
        f"{', '.join(recorded)}. Deploy a definition with {expected!r} at that "
        "position and retry() the run (docs/changing-workflows.md)"
    )


class LastStep(NamedTuple):
    """A run's last step completed, its record not written yet: handed to a worker's
    recorder (``execute(..., completions=...)``), which writes it with others in one
    statement (``record_last_steps``). ``previous_context`` and ``previous_state`` are
    the context and state before the step, restored if the record fails."""

    completion: store.Completion
    previous_context: dict
    previous_state: dict | None = None


def execute(
    run: Run,
    *,
    should_stop: Callable[[], bool] | None = None,
    completions: Callable[[LastStep], None] | None = None,
) -> int:
    """Run the claimed ``run`` until it finishes, suspends or fails; return steps executed.

    ``should_stop`` is asked before each step: when it says yes (the worker is
    shutting down) the run is left as it is, still claimed, for the worker to hand back.
    ``completions`` takes the completed last step instead of recording it here
    (``record_last_step``): the worker's recorder writes it and finishes the run, so
    this thread goes on to its next run at once.
    """
    try:
        workflow = registry.get(run.workflow)
    except LookupError as exc:
        return _fail_outside_steps(run, describe_error(exc))

    if run.status == Status.COMPENSATING:
        return compensation.compensate(workflow, run)
    instance: Workflow = workflow()
    # An input wait with on_timeout="fail" that ended without its value (``state``).
    unanswered = run_state.unanswered_input(run.state)
    waits = _resume_waits(run)
    executed = 0
    while run.step_index < len(workflow.steps) or definition_mismatch(workflow, run):
        if should_stop is not None and should_stop():
            return executed
        if run.timeout_at is not None and store.now() >= run.timeout_at:
            return executed + _timed_out(workflow, run)
        mismatch = definition_mismatch(workflow, run)
        if mismatch is not None:
            error = {"type": DefinitionChanged.__name__, "message": mismatch}
            return executed + _fail_outside_steps(run, error)
        step = workflow.steps[run.step_index]
        if unanswered is not None:
            return executed + _input_timed_out(workflow, run, step, unanswered)
        executed += 1
        outcome = _attempt(workflow, instance, run, step, waits, should_stop, completions)
        if outcome is not None:
            return executed + outcome
        waits = []
    logger.debug("run %s (%s) completed", run.id, run.workflow, extra=telemetry.log_fields(run))
    _finished(run)
    return executed


def _attempt(
    workflow, instance, run: Run, step: StepDef, waits, should_stop, completions=None
) -> int | None:
    """One attempt of ``step``; None when the run goes on to its next step, otherwise
    what ``execute`` adds to the steps it executed (the run stopped here)."""
    ctx = Context(run, waits=waits, step=step.name, step_index=run.step_index)
    started_at = store.now()
    run.deadline = _deadline(run, step, started_at)
    try:
        with children.current_step(ctx):
            output = calling.call(run, step, instance, ctx)
    except Suspend as wait:
        if (late := _late(run, step, started_at)) is not None:
            return _failed(workflow, run, step, started_at, late)
        try:
            _check_recordable(ctx.data, None, step)
            # What the step changed so far, kept for a rerun from it (operations/replay.py).
            partial = replay.step_changes(run.state, run.context, ctx.data)
            deliveries.suspend(run, step.name, started_at, ctx.data, waits, wait, partial=partial)
        except store.LeaseLost:
            return 0
        except Exception as exc:
            return _unrecordable(workflow, run, step, started_at, exc)
        if wait.kind == "children":
            parents.after_suspend(run.id)
        return 0
    except RunTimedOut:
        late = _late(run, step, started_at) or StepTimeout("the step was stopped")
        return _failed(workflow, run, step, started_at, late)
    except Cancelled:
        _record_cancelled(run, step.name, started_at)
        return 0
    except store.LeaseLost:
        return 0
    except BaseException as exc:
        if step_lost_its_connection(exc):
            return _connection_lost(run, step, exc)
        if not isinstance(exc, Exception) and should_stop is not None and should_stop():
            raise  # the worker is stopping: it hands the run back
        return _failed(workflow, run, step, started_at, exc)
    finally:
        run.deadline = None

    if (late := _late(run, step, started_at)) is not None:
        return _failed(workflow, run, step, started_at, late)  # its result is dropped
    last = run.step_index == len(workflow.steps) - 1
    previous, previous_state = run.context, run.state
    try:
        _check_recordable(ctx.data, output, step)
        run.context = ctx.data
        # What the step replaced in the context, written once with its attempt, for a
        # rerun from a step (operations/replay.py).
        replaced = replay.step_changes(previous_state, previous, ctx.data)
        run.state = run_state.step_completed(previous_state)
        if not last:
            store.record_step_completed(
                run,
                step.name,
                started_at,
                output,
                last=False,
                state=_after_step(run),
                replaced=replaced,
            )
    except store.LeaseLost:
        return 0
    except Exception as exc:
        run.context, run.state = previous, previous_state
        return _unrecordable(workflow, run, step, started_at, exc)
    if not last:
        return None  # the next step
    attempt = store.completed_attempt(run, step.name, started_at, output, replaced)
    completion = store.Completion(run, attempt, output, _after_step(run))
    last_step = LastStep(completion, previous, previous_state)
    # Recorded here, or by the worker's recorder with others: either way the run
    # is then finished by record_last_step(s).
    (completions or record_last_step)(last_step)
    return 0


def record_last_steps(last_steps: list[LastStep]) -> None:
    """Record completed last steps handed over by ``execute`` and finish their runs:
    several in one statement (``store.record_last_steps``); one alone, or each after
    that statement failed, with ``record_last_step``, so that each meets what its own
    record would have met."""
    if len(last_steps) > 1:
        try:
            completed = store.record_last_steps([last.completion for last in last_steps])
        except DatabaseError:
            store.reset_connection_after_error()
        else:
            for run in completed:
                _guarded(run, _finished, run)
            return
    for last in last_steps:
        _guarded(last.completion.run, record_last_step, last)


def _after_step(run: Run) -> dict:
    """What a step's end (completed or failed) leaves of the run's state."""
    return run_state.between_steps(run.state)


def _guarded(run: Run, fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)`` for one run of a batch: what it raises is logged, and the batch's
    other runs go on (in a slot, the worker logs it the same way)."""
    try:
        fn(*args)
    except Exception as exc:
        if not is_connection_fault(exc):
            logger.exception("run %s (%s): finishing it failed", run.id, run.workflow)
            store.reset_connection_after_error()
            return
        # Recorded, not finished: the maintenance's sweep moves its key on later.
        logger.warning(
            "run %s (%s): finishing it failed (its database connection was lost: %s)",
            run.id,
            run.workflow,
            exc,
        )
        store.reset_connection_after_error(drop=True)


def record_last_step(last: LastStep) -> None:
    """Record one completed last step (``_attempt``'s, or one a worker's recorder
    writes alone) and finish the run; a record refused is the step's failed attempt
    (``_unrecordable``), a run no longer owned is left alone."""
    completion, previous, previous_state = last
    run = completion.run
    try:
        store.record_completion(completion)
    except store.LeaseLost:
        return
    except Exception as exc:
        run.context = previous
        if previous_state is not None:
            run.state = previous_state
        workflow = registry.get(run.workflow)
        step = workflow.steps[run.step_index]
        _unrecordable(workflow, run, step, completion.attempt.started_at, exc)
        return
    logger.debug("run %s (%s) completed", run.id, run.workflow, extra=telemetry.log_fields(run))
    _finished(run)


def _deadline(run: Run, step: StepDef, started_at: datetime) -> datetime | None:
    """When this attempt must stop: the step's timeout or the run's, the earlier."""
    ends = [run.timeout_at] if run.timeout_at is not None else []
    if step.timeout is not None:
        ends.append(started_at + step.timeout)
    return min(ends) if ends else None


def _late(run: Run, step: StepDef, started_at: datetime) -> BaseException | None:
    """``StepTimeout`` / ``RunTimedOut`` when the attempt ended past its deadline."""
    at = store.now()
    if run.timeout_at is not None and at >= run.timeout_at:
        return RunTimedOut(f"the run passed its timeout while step {step.name} ran")
    if step.timeout is not None and at >= started_at + step.timeout:
        return StepTimeout(f"step {step.name} ran longer than its timeout ({step.timeout})")
    return None


def _check_recordable(context: dict, output: Any, step: StepDef) -> None:
    limit = conf.get("MAX_VALUE_BYTES")
    check_json(output, f"the return value of step {step.name}")
    check_size(output, f"the return value of step {step.name}", limit)
    check_json(context, "the run's context")
    check_size(context, "the run's context", limit)


def _unrecordable(workflow, run: Run, step: StepDef, started_at, exc: Exception) -> int:
    """The step's outcome could not be recorded: a failed attempt, unless the
    connection was lost (then the run is handed back)."""
    if is_connection_fault(exc):
        return _connection_lost(run, step, exc)
    if isinstance(exc, DatabaseError):
        store.reset_connection_after_error()
    logger.warning(
        "run %s (%s): the outcome of step %s could not be recorded: %s",
        run.id,
        run.workflow,
        step.name,
        exc,
        extra=telemetry.log_fields(run, step=step.name),
    )
    error = describe_error(exc)
    error["message"] = f"the outcome of step {step.name} could not be recorded: {error['message']}"
    return _failed(workflow, run, step, started_at, exc, error=error)


def _connection_lost(run: Run, step: StepDef, exc: BaseException) -> int:
    """The database went away during the step: not the step's failure."""
    why = f"the database connection was lost during step {step.name}: {exc}"
    logger.warning(
        "run %s (%s): %s; handing it back",
        run.id,
        run.workflow,
        why,
        extra=telemetry.log_fields(run, step=step.name),
    )
    store.reset_connection_after_error(drop=True)
    # Kept on the run until the hand-back is written: while the database is still out
    # of reach (a restart, a failover), the worker writes it as soon as it answers
    # (``hand_back``), fenced by the claim like every other write of the run.
    run.connection_lost = why
    try:
        hand_back_lost(run)
    except DatabaseError as again:
        if not is_connection_fault(again):
            raise
        store.reset_connection_after_error(drop=True)
    return 0


def hand_back(run: Run) -> bool:
    """Give back a run the worker still holds (it stops, or gives up on the run), with
    a lost attempt when its connection was lost during a step, and wake the workers
    for it. False when the run is no longer this worker's; a connection fault is the
    caller's (it tries again)."""
    if getattr(run, "connection_lost", None) is not None:
        return hand_back_lost(run)  # it wakes them
    if not store.hand_back(run):
        return False
    store.notify_runs_due([run.id])
    return True


def hand_back_lost(run: Run) -> bool:
    """Hand back a run whose connection was lost during a step (``connection_lost``):
    a hand-back, not a recovery (``MAX_RECOVERIES`` counts lost workers); False when
    there is none to hand back."""
    why = getattr(run, "connection_lost", None)
    if why is None:
        return False
    try:
        store.hand_back_lost(run, why)
    except store.LeaseLost:
        run.connection_lost = None
        return False
    run.connection_lost = None
    telemetry.handed_back(run)
    store.notify_runs_due([run.id])
    return True


def _failed(workflow, run: Run, step: StepDef, started_at, exc: BaseException, *, error=None):
    """Record a failed attempt: retry it later, compensate, or fail the run."""
    error = error or describe_error(exc)
    retry_at = None
    if isinstance(exc, RunTimedOut):  # the run is out of time: no attempt follows
        error = {"type": "Timeout", "message": str(exc), "step": step.name}
    elif run.attempt <= step.retries and not _gives_up(step, exc):
        retry_at = store.now() + step.delay_before(run.attempt + 1)
        if run.timeout_at is not None and retry_at > run.timeout_at:
            retry_at = run.timeout_at  # then it fails timed out, at its deadline
    if retry_at is None and (to_undo := compensation.pending_for(workflow, run)):
        return compensation.begin(
            workflow, run, to_undo, error, step_name=step.name, started_at=started_at
        )
    attempt = run.attempt
    try:
        store.record_step_failed(
            run, step.name, started_at, error, retry_at=retry_at, state=_after_step(run)
        )
    except store.LeaseLost:
        return 0
    if retry_at is None:
        # The traceback once per run, with the failure (the attempts before: at DEBUG).
        run.failure_said = telling.step_failed(step.name, attempt, step.retries + 1, error)
        logger.error(
            "run %s (%s) %s",
            run.id,
            run.workflow,
            run.failure_said,
            exc_info=exc if workflow.log_failure_traceback else None,
            extra=telemetry.log_fields(run, step=step.name),
        )
        _finished(run)
    else:
        when = "due now" if retry_at <= store.now() else f"at {retry_at.isoformat()}"
        fields = telemetry.log_fields(run, step=step.name)
        logger.warning(
            "run %s (%s) step %r failed (attempt %d of %d): %s; attempt %d %s",
            run.id,
            run.workflow,
            step.name,
            attempt,
            step.retries + 1,
            telling.error_said(error),
            run.attempt,
            when,
            extra=fields,
        )
        logger.debug(
            "run %s (%s) step %r attempt %d traceback",
            run.id,
            run.workflow,
            step.name,
            attempt,
            exc_info=exc,
            extra=fields,
        )
    return 0


def _gives_up(step: StepDef, exc: BaseException) -> bool:
    return isinstance(exc, NonRetryable) or step.gives_up_on(exc)


def _timed_out(workflow, run: Run) -> int:
    error = {"type": "Timeout", "message": f"the run passed its timeout ({workflow.timeout})"}
    if to_undo := compensation.pending_for(workflow, run):
        return compensation.begin(workflow, run, to_undo, error)
    return _fail_outside_steps(run, error)


def _input_timed_out(workflow, run: Run, step: StepDef, unanswered: dict) -> int:
    """``wait_for_input(on_timeout="fail")`` timed out: the step fails for good (no
    retry), without running again; compensations run as for any failure."""
    message = (
        f"the input {unanswered['name']!r} timed out: nobody provided it by "
        f"{unanswered['timeout_at']} (on_timeout='fail')"
    )
    error = {"type": "WaitTimeout", "message": message}
    return _failed(workflow, run, step, store.now(), NonRetryable(message), error=error)


def _record_cancelled(run: Run, step_name: str, started_at) -> None:
    """The step noticed the cancel at a heartbeat: note the attempt, run no later step."""
    status = store.current_status(run.id)
    if status and status[0] == Status.CANCELLED:
        store.record_attempt_cancelled(run, step_name, started_at)


def _fail_outside_steps(run: Run, error: dict) -> int:
    """Fail the run between steps (its timeout passed, its definition changed or
    vanished), saying why."""
    try:
        store.record_run_failed(run, error)
    except store.LeaseLost:
        return 0
    run.failure_said = f"failed: {telling.error_said(error)}"
    logger.error(
        "run %s (%s) %s", run.id, run.workflow, run.failure_said, extra=telemetry.log_fields(run)
    )
    _finished(run)
    return 0


def _finished(run: Run) -> None:
    finish.run_finished(run)
