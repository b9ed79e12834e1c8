"""A backend for Django's Tasks framework: ``@task`` functions run as durable runs.

``TASKS = {"default": {"BACKEND": "django_durable.tasks.DurableBackend"}}``
(Django 6's ``django.tasks``; on Django 5.2 the ``django-tasks`` backport).

Each task function gets a generated one-step workflow named ``task:<module path>``
(``workflows.py``), so a task keeps everything a workflow has: a lease and recovery
when a worker dies, the dashboard, and keys. ``enqueue()`` starts a run of it (the
run's id is the ``TaskResult.id``); ``get_result()`` reads the run back
(``results.py``). ``durable_task(key=..., reuse=..., on_duplicate=..., retries=...)``
under ``@task`` gives a task a key derived from its arguments (``options.py``,
docs/tasks.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import ObjectDoesNotExist, ValidationError

import django_durable as durable
from django_durable.tasks import framework
from django_durable.tasks.framework import (
    BaseTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from django_durable.tasks.options import OPTIONS_ATTRIBUTE, TaskOptions, durable_task, options_of
from django_durable.tasks.results import RUN_AFTER, result_of, task_status
from django_durable.tasks.workflows import (
    PREFIX,
    TaskImportError,
    as_json,
    check_arguments,
    task_of_run,
    workflow_for,
)

__all__ = [
    "OPTIONS_ATTRIBUTE",
    "PREFIX",
    "DurableBackend",
    "TaskImportError",
    "TaskOptions",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "durable_task",
    "framework",
    "task_status",
]

# The system check's id for a DurableBackend without the app (reserved in checks.py).
APP_MISSING = "django_durable.E017"


class DurableBackend(BaseTaskBackend):
    """Runs each enqueued task as a durable run that ``durable_worker`` executes."""

    supports_async_task = True
    supports_get_result = True
    supports_defer = True
    supports_priority = True

    def __init__(self, alias: str, params: dict) -> None:
        super().__init__(alias, params)
        if "QUEUES" not in params:
            self.queues = set()  # any queue: durable workers serve whatever they are told

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        # Registered when the task is defined, so a worker that imports the task's
        # module (the registry's finder does) knows its workflow.
        workflow_for(task)

    def enqueue(self, task: Task, args, kwargs) -> TaskResult:
        """Start a run of the task's workflow; a duplicate key returns the holder's result.

        Refused before anything is written: arguments the task function does not take
        (the ``TypeError`` a call would raise), arguments the framework's
        ``normalize_json`` refuses, and an input ``start()`` refuses (a dict key that
        is not a str, over ``DURABLE["MAX_VALUE_BYTES"]``)."""
        self.validate_task(task)
        check_arguments(task, args, kwargs)
        workflow = workflow_for(task)
        options = options_of(task)
        payload = {"args": as_json(list(args)), "kwargs": as_json(dict(kwargs))}
        start_options: dict[str, Any] = {"priority": task.priority}
        if options.key is not None:
            start_options["key"] = options.key(*args, **kwargs)
        if task.run_after is not None:
            start_options["run_after"] = task.run_after
            payload[RUN_AFTER] = task.run_after.isoformat()  # for get_result()'s task
        if task.queue_name != workflow.queue:
            start_options["queue"] = task.queue_name
        started = durable.start_detailed(workflow, payload, **start_options)
        if started.outcome != "started":
            return self.get_result(str(started.run_id))
        # Read back, so that this result is the one get_result() gives (enqueued_at is
        # the run's created_at, not a second clock reading).
        result = result_of(self.alias, task, durable.get_run(started.run_id), fresh=True)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task result of run ``result_id``: its status, return value and errors.

        ``TaskResultDoesNotExist`` for an id that is no task's run; ``ImportError``
        (``TaskImportError``) when the run's task path no longer imports, as the
        framework's backends raise."""
        try:
            run = durable.get_run(result_id)
        except (ObjectDoesNotExist, ValidationError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        if not run.workflow.startswith(PREFIX):
            raise TaskResultDoesNotExist(f"run {result_id} is not a task")
        try:
            task = task_of_run(run)
        except TaskImportError:
            raise
        except LookupError:
            raise TaskResultDoesNotExist(f"the task of run {result_id} is not defined") from None
        return result_of(self.alias, task, run)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """The framework's checks, and django_durable.E017: the app is not installed."""
        yield from super().check(**kwargs)
        if not apps.is_installed("django_durable"):
            yield checks.Error(
                f"{type(self).__name__} is configured in TASKS[{self.alias!r}], but "
                "django_durable is not in INSTALLED_APPS: its runs have no tables to go "
                "to and no worker would find them.",
                hint="Add 'django_durable' to INSTALLED_APPS, then run migrate.",
                id=APP_MISSING,
            )
