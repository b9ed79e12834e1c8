"""A backend for Django's Tasks framework: ``@task`` functions run as durable runs.

``TASKS = {"default": {"BACKEND": "django_durable.tasks.DurableBackend"}}``
(Django 6's ``django.tasks``; on Django 5.2 the ``django-tasks`` backport).

Each task function gets a generated one-step workflow named ``task:<module path>``,
so a task keeps everything a workflow has: a lease and recovery when a worker
dies, the dashboard, and keys. ``enqueue()`` starts a run of it (the run's id is
the ``TaskResult.id``); ``get_result()`` reads the run back. A worker that never
imported the task's module finds the workflow by importing the module path in
its name, so tasks may live anywhere importable.

``durable_task(key=..., reuse=..., on_duplicate=..., retries=...)`` under ``@task``
gives a task a key derived from its arguments (docs/tasks.md).
"""

from __future__ import annotations

import builtins
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured, ObjectDoesNotExist, ValidationError
from django.utils import timezone
from django.utils.module_loading import import_string

try:
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued
except ImportError:  # Django 5.2: the backport package
    try:
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued
    except ImportError as exc:
        raise ImproperlyConfigured(
            "django_durable.tasks needs Django's Tasks framework: Django 6's django.tasks, "
            "or on Django 5.2 the backport (pip install 'django-durable-workflows[tasks]')."
        ) from exc

import django_durable as durable
from django_durable.tasks import framework  # noqa: F401
from django_durable import exceptions
from django_durable.workflows.definition import (
    REUSE_POLICIES,
    Workflow,
    registry,
    step,
    validate_on_duplicate,
)
from django_durable.workflows.durations import as_timedelta

__all__ = ["PREFIX", "DurableBackend", "TaskOptions", "durable_task", "task_status"]

# The generated workflow of a task is named PREFIX + the task's module path.
PREFIX = "task:"

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


def task_status(run_status: str) -> TaskResultStatus:
    """The ``TaskResultStatus`` a run in ``run_status`` reports."""
    return _STATUSES[run_status]


@dataclass(frozen=True)
class TaskOptions:
    """What ``durable_task`` declared on a task function."""

    key: Callable[..., str | None] | None = None
    reuse: str = "after_close"
    on_duplicate: Any = "use_existing"
    retries: int = 0
    backoff: timedelta = timedelta(seconds=1)


OPTIONS_ATTRIBUTE = "durable_task_options"


def durable_task(
    fn: Callable | None = None,
    /,
    *,
    key: Callable[..., str | None] | None = None,
    reuse: str = "after_close",
    on_duplicate: Any = "use_existing",
    retries: int = 0,
    backoff: timedelta | float = timedelta(seconds=1),
):
    """Declare a task function's key and retries; put it *under* ``@task``::

        @task
        @durable_task(key=lambda article_id: f"article:{article_id}", reuse="after_failure")
        def process_article(article_id): ...

    ``key`` is called with the task's arguments at ``enqueue()`` and returns the key
    (``None``: no key for this call). ``reuse`` and ``on_duplicate`` are the
    workflow rules (docs/keys.md). Bad options raise ``ImproperlyConfigured``.
    """
    where = "durable_task"
    if key is not None and not callable(key):
        raise ImproperlyConfigured(f"{where}: key must be a callable, got {key!r}")
    if reuse not in REUSE_POLICIES:
        raise ImproperlyConfigured(
            f"{where}: reuse must be one of {', '.join(map(repr, REUSE_POLICIES))}, got {reuse!r}"
        )
    try:
        on_duplicate = validate_on_duplicate(on_duplicate, where)
        backoff = as_timedelta(backoff, f"{where}: backoff")
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(str(exc)) from None
    if on_duplicate == "run_again" and reuse == "never":
        raise ImproperlyConfigured(
            f"{where}: on_duplicate='run_again' needs a reuse other than 'never'"
        )
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ImproperlyConfigured(f"{where}: retries must be a whole number >= 0, got {retries!r}")
    options = TaskOptions(key, reuse, on_duplicate, retries, backoff)

    def mark(function: Callable) -> Callable:
        if isinstance(function, Task):
            raise ImproperlyConfigured(
                f"{where} goes under @task (it marks the function, not the Task)"
            )
        setattr(function, OPTIONS_ATTRIBUTE, options)
        return function

    return mark(fn) if fn is not None else mark


# --- the generated workflows ------------------------------------------------------

_workflows: dict[str, type[Workflow]] = {}
_tasks: dict[str, Task] = {}


def _run_task(self, ctx):
    """The one step of a task's workflow: call the task function with the run's input."""
    task = _tasks[self.name]
    args, kwargs = ctx.input.get("args", []), ctx.input.get("kwargs", {})
    if task.takes_context:
        run = durable.get_run(ctx.run_id)
        result = task.get_backend()._result(task, run)
        # This attempt is recorded when it ends; the context counts it already.
        missing = ctx.attempt - len(result.worker_ids)
        if missing > 0:
            workers = result.worker_ids + [run.worker_id or ""] * missing
            result = replace(result, status=TaskResultStatus.RUNNING, worker_ids=workers)
        return task.call(TaskContext(task_result=result), *args, **kwargs)
    return task.call(*args, **kwargs)


def workflow_for(task: Task) -> type[Workflow]:
    """The workflow that runs ``task`` (made and registered the first time)."""
    name = PREFIX + task.module_path
    workflow = _workflows.get(name)
    if workflow is None:
        options = getattr(task.func, OPTIONS_ATTRIBUTE, None) or TaskOptions()
        namespace = {
            "name": name,
            "__module__": __name__,
            "__qualname__": f"TaskWorkflow[{task.module_path}]",
            "__doc__": task.func.__doc__,
            "reuse": options.reuse,
            "on_duplicate": options.on_duplicate,
            "queue": task.queue_name,
            "run_task": step(_run_task, retries=options.retries, backoff=options.backoff),
        }
        workflow = type(f"TaskWorkflow[{task.module_path}]", (Workflow,), namespace)
        _workflows[name] = workflow
        _tasks.setdefault(name, task)
    registry.register(workflow)  # again after a test unregistered it: same class, no-op
    return workflow


def _find_task_workflow(name: str) -> None:
    """Registry finder: import the task a ``task:`` workflow name points at."""
    if not name.startswith(PREFIX):
        return
    if name in _workflows:  # made here already, then unregistered (tests do)
        registry.register(_workflows[name])
        return
    # @task runs validate_task, which registers it; if nothing is there, the registry
    # raises LookupError for the name.
    with contextlib.suppress(ImportError):
        import_string(name[len(PREFIX) :])


registry.add_finder(_find_task_workflow, prefix=PREFIX)


def _json(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a durable task's {what} must be JSON-serialisable: {exc}") from None


def _exception_path(name: str | None) -> str:
    if name and hasattr(builtins, name):
        return f"builtins.{name}"
    if name and hasattr(exceptions, name):
        return f"{exceptions.__name__}.{name}"
    return name or "builtins.Exception"


class DurableBackend(BaseTaskBackend):
    """Runs each enqueued task as a durable run that ``durable_worker`` executes."""

    supports_async_task = True
    supports_get_result = True

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        if "QUEUES" not in params:
            self.queues = set()  # any queue: durable workers serve whatever they are told

    supports_defer = True
    supports_priority = True

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        # Registered when the task is defined, so a worker that imports the task's
        # module (the registry's finder does) knows its workflow.
        workflow_for(task)

    def enqueue(self, task: Task, args, kwargs) -> TaskResult:
        """Start a run of the task's workflow; a duplicate key returns the holder's result."""
        self.validate_task(task)
        workflow = workflow_for(task)
        options = getattr(task.func, OPTIONS_ATTRIBUTE, None) or TaskOptions()
        payload = {"args": _json(list(args), "arguments"), "kwargs": _json(dict(kwargs), "kwargs")}
        start_options: dict[str, Any] = {}
        if options.key is not None:
            start_options["key"] = options.key(*args, **kwargs)
        if task.run_after is not None:
            start_options["run_after"] = task.run_after
        start_options["priority"] = task.priority
        if task.queue_name != workflow.queue:
            start_options["queue"] = task.queue_name
        started = durable.start_detailed(workflow, payload, **start_options)
        if started.outcome != "started":
            return self.get_result(str(started.run_id))
        result = TaskResult(
            task=task,
            id=str(started.run_id),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task result of run ``result_id``: its status, return value and errors."""
        try:
            run = durable.get_run(result_id)
        except (ObjectDoesNotExist, ValidationError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        if not run.workflow.startswith(PREFIX):
            raise TaskResultDoesNotExist(f"run {result_id} is not a task")
        try:
            registry.get(run.workflow)
        except LookupError:
            raise TaskResultDoesNotExist(f"the task of run {result_id} is not defined") from None
        task = _tasks[run.workflow]
        if run.queue != task.queue_name:
            task = task.using(queue_name=run.queue)
        if getattr(run, "priority", task.priority) != task.priority:
            task = task.using(priority=run.priority)
        return self._result(task, run)

    def _result(self, task: Task, run) -> TaskResult:
        attempts = list(run.attempts.order_by("id").values_list("worker_id", "started_at", "error"))
        errors = [
            TaskError(
                exception_class_path=_exception_path(error.get("type")),
                traceback=error.get("traceback") or error.get("message", ""),
            )
            for _worker, _at, error in attempts
            if error
        ]
        status = task_status(run.status)
        if status == TaskResultStatus.FAILED and not errors and run.error:
            errors.append(
                TaskError(
                    exception_class_path=_exception_path(run.error.get("type")),
                    traceback=run.error.get("traceback") or run.error.get("message", ""),
                )
            )
        result = TaskResult(
            task=task,
            id=str(run.id),
            status=status,
            enqueued_at=run.created_at,
            started_at=run.started_at,
            finished_at=run.finished_at,
            last_attempted_at=attempts[-1][1] if attempts else None,
            args=run.input.get("args", []),
            kwargs=run.input.get("kwargs", {}),
            backend=self.alias,
            errors=errors,
            worker_ids=[worker or "" for worker, _at, _error in attempts],
        )
        if status == TaskResultStatus.SUCCESSFUL:
            # The return value has no constructor argument; the framework's own
            # backends set this field the same way (it is one of TASK_REFRESH_ATTRS).
            object.__setattr__(result, "_return_value", run.result)
        return result
