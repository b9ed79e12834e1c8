"""A task's ``TaskResult``, read from its run and the run's attempts.

An attempt of a task is recorded when it begins (a ``running`` attempt row, written
by the task's step before it calls the function) and again when it ends (the
executor's row, as for any step; the ``running`` row is then removed). So a RUNNING
task shows its attempt, its worker and when the attempt began, as the framework's
reference backends do.
"""

from __future__ import annotations

import builtins
import re
import traceback
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from django_durable import exceptions
from django_durable.tasks.framework import Task, TaskError, TaskResult, TaskResultStatus

if TYPE_CHECKING:
    from django_durable.models import Run, StepAttempt

__all__ = ["RUN_AFTER", "Attempt", "begin_attempt", "end_attempt", "result_of", "task_status"]

# Run status -> task status. A run between attempts is pending: ready again.
_STATUSES = {
    "pending": TaskResultStatus.READY,
    "waiting": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "compensating": TaskResultStatus.RUNNING,
    "completed": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
    "compensated": TaskResultStatus.FAILED,
    "compensation_failed": TaskResultStatus.FAILED,
}

# The run's input key that keeps the task's run_after (an ISO 8601 time), so that
# get_result() gives back the Task as it was enqueued.
RUN_AFTER = "run_after"

# StepAttempt.Outcome.RUNNING and .Kind.STEP. The models are looked up when used: this
# package is imported with the TASKS setting, even in a project that forgot the app
# (DurableBackend.check() then says so).
RUNNING = "running"
STEP_KIND = "step"


def _attempt_model() -> type[StepAttempt]:
    return apps.get_model("django_durable", "StepAttempt")


def task_status(run_status: str) -> TaskResultStatus:
    """The ``TaskResultStatus`` a run in ``run_status`` reports."""
    return _STATUSES[run_status]


def run_after_of(run: Run) -> datetime | None:
    text = (run.input or {}).get(RUN_AFTER)
    return parse_datetime(text) if isinstance(text, str) else None


@dataclass(frozen=True)
class Attempt:
    worker_id: str
    started_at: datetime
    error: dict | None


def _exception_path(error: dict) -> str:
    """The dotted path of the exception class an attempt's ``error`` names: a
    builtin, one of django-durable's, or the module the traceback's last line gives
    (``myapp.errors.PaymentDeclined: ...``)."""
    name = error.get("type")
    if name and hasattr(builtins, name):
        return f"builtins.{name}"
    if name and hasattr(exceptions, name):
        return f"{exceptions.__name__}.{name}"
    lines = (error.get("traceback") or "").rstrip().splitlines()
    if name and lines:
        found = re.match(rf"([\w.]+\.{re.escape(name)})(:|$)", lines[-1])
        if found:
            return found.group(1)
    return name or "builtins.Exception"


def task_error(error: dict) -> TaskError:
    return TaskError(
        exception_class_path=_exception_path(error),
        traceback=error.get("traceback") or error.get("message", ""),
    )


def error_of(exc: BaseException) -> TaskError:
    """The ``TaskError`` of an exception a task raised just now."""
    kind = type(exc)
    return TaskError(
        exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
        traceback="".join(traceback.format_exception(exc)),
    )


def _attempts(run: Run, status: TaskResultStatus, begun: StepAttempt | None) -> list[Attempt]:
    """The run's attempts, oldest first; the one in progress last, while it runs
    (``begun``: its first record, just written by this process)."""
    if begun is not None and run.attempt == 1 and not run.recoveries:
        return [Attempt(begun.worker_id or "", begun.started_at, None)]  # the only one
    rows = run.attempts.filter(kind=STEP_KIND).order_by("id")
    finished: list[Attempt] = []
    begun: Attempt | None = None
    for worker, started, error, outcome, number in rows.values_list(
        "worker_id", "started_at", "error", "status", "attempt"
    ):
        attempt = Attempt(worker or "", started, error)
        if outcome != RUNNING:
            finished.append(attempt)
        elif number == run.attempt:
            begun = attempt  # an older one is left by a worker that died
    if status != TaskResultStatus.RUNNING:
        return finished
    if begun is None:
        # The attempt's row is between its two records (or the run is being claimed):
        # it began no earlier than the run started and the last attempt ended.
        began = max([run.started_at or run.created_at, *(a.started_at for a in finished)])
        begun = Attempt(run.worker_id or "", began, None)
    return [*finished, begun]


def result_of(
    backend_alias: str,
    task: Task,
    run: Run,
    *,
    fresh: bool = False,
    begun: StepAttempt | None = None,
) -> TaskResult:
    """The task result of ``run`` (``fresh``: just started, it has no attempts yet;
    ``begun``: the first record of the attempt this process is running)."""
    status = task_status(run.status)
    attempts = [] if fresh else _attempts(run, status, begun)
    errors = [task_error(a.error) for a in attempts if a.error]
    if status == TaskResultStatus.FAILED and not errors and run.error:
        errors.append(task_error(run.error))  # cancelled, or failed outside its step
    result = TaskResult(
        task=task,
        id=str(run.id),
        status=status,
        enqueued_at=run.created_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        last_attempted_at=attempts[-1].started_at if attempts else None,
        args=run.input.get("args", []),
        kwargs=run.input.get("kwargs", {}),
        backend=backend_alias,
        errors=errors,
        worker_ids=[a.worker_id for a in attempts],
    )
    if status == TaskResultStatus.SUCCESSFUL:
        set_return_value(result, run.result)
    return result


def set_return_value(result: TaskResult, value: Any) -> None:
    # The return value has no constructor argument; the framework's own backends set
    # this field the same way (it is one of TASK_REFRESH_ATTRS).
    object.__setattr__(result, "_return_value", value)


def finished(
    result: TaskResult,
    status: TaskResultStatus,
    *,
    value: Any = None,
    error: TaskError | None = None,
) -> TaskResult:
    """A copy of ``result`` (of the attempt in progress) as it ends now, with ``status``
    and the function's return ``value`` or the ``error`` it raised."""
    errors = [*result.errors, error] if error is not None else result.errors
    ended = replace(result, status=status, finished_at=timezone.now(), errors=errors)
    if status == TaskResultStatus.SUCCESSFUL:
        set_return_value(ended, value)
    return ended


# --- the attempt's first record ---------------------------------------------------


def begin_attempt(run: Run, step_name: str) -> StepAttempt:
    """Record that this attempt began: a ``running`` row, replaced by the executor's
    when it ends. A row a dead worker left behind is removed first."""
    attempts = _attempt_model().objects
    if run.attempt > 1 or run.recoveries:
        attempts.filter(run_id=run.id, status=RUNNING).delete()
    return attempts.create(
        run_id=run.id,
        kind=STEP_KIND,
        step=step_name,
        step_index=run.step_index,
        attempt=run.attempt,
        status=RUNNING,
        worker_id=run.worker_id,
        started_at=timezone.now(),
        finished_at=None,
    )


def end_attempt(row: StepAttempt) -> None:
    """The attempt ended: the executor records it; the first record goes."""
    _attempt_model().objects.filter(id=row.id, status=RUNNING).delete()
