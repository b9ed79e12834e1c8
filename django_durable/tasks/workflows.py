"""The one-step workflow each task function runs as, named ``task:<module path>``.

Its step calls the task function with the run's input. Around the call it sends the
framework's ``task_started`` (each attempt) and ``task_finished`` (once: when the
function returned, or raised on its last attempt; inside the ``except`` block, so
the framework's log line carries the traceback), and it records the attempt when it
begins (``results.begin_attempt``).

A worker that never imported a task's module finds its workflow through the
registry's finder, which imports the module path in the name; a path that no longer
imports raises ``TaskImportError`` (an ``ImportError``, as the framework's backends
raise, and an ``UnknownWorkflow``, as any unknown workflow name is in django-durable).
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

import django_durable as durable
from django_durable.exceptions import NonRetryable, UnknownWorkflow
from django_durable.tasks import results
from django_durable.tasks.framework import (
    Task,
    TaskContext,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from django_durable.tasks.options import options_of
from django_durable.workflows.definition import Workflow, registry, step

if TYPE_CHECKING:
    from django_durable.models import Run

__all__ = [
    "PREFIX",
    "STEP",
    "TaskImportError",
    "as_json",
    "check_arguments",
    "task_of_run",
    "workflow_for",
]

logger = logging.getLogger("django_durable.tasks")

# The generated workflow of a task is named PREFIX + the task's module path.
PREFIX = "task:"
STEP = "run_task"

_workflows: dict[str, type[Workflow]] = {}
_tasks: dict[str, Task] = {}


class TaskImportError(UnknownWorkflow, ImportError):
    """The module path in a ``task:`` workflow's name does not import (the task was
    renamed or removed since the run was enqueued): an ``UnknownWorkflow`` (so a
    ``LookupError``) as any workflow nobody defines, and an ``ImportError`` as the
    Tasks framework's backends raise."""


def as_json(value: Any) -> Any:
    """``value`` as the framework normalises a task's arguments and return value, on
    every backend (tuples become lists, bytes str): its ``TypeError`` ("Unsupported
    type") or ``ValueError`` for what it cannot."""
    return normalize_json(value)


def check_arguments(task: Task, args: tuple, kwargs: dict) -> None:
    """The ``TypeError`` calling the task function with ``args`` and ``kwargs`` would
    raise (too many, missing, unexpected), at enqueue rather than in the worker."""
    signature = inspect.signature(task.func)
    if task.takes_context:  # the first parameter is the context the worker passes
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"task {task.name}: {exc}") from None


def _flow_key_of_arguments(function):
    """A task's flow key function (of its arguments) as its workflow's (of the input)."""
    if function is None:
        return None
    return staticmethod(lambda input: function(*input["args"], **input["kwargs"]))


def workflow_for(task: Task) -> type[Workflow]:
    """The workflow that runs ``task`` (made and registered the first time)."""
    name = PREFIX + task.module_path
    workflow = _workflows.get(name)
    if workflow is None:
        options = options_of(task)
        namespace = {
            "name": name,
            "__module__": __name__,
            "__qualname__": f"TaskWorkflow[{task.module_path}]",
            "__doc__": task.func.__doc__,
            "reuse": options.reuse,
            "on_duplicate": options.on_duplicate,
            "queue": task.queue_name,
            "flow_key": _flow_key_of_arguments(options.flow_key),
            "concurrency_per_key": options.concurrency_per_key,
            "rate_per_key": options.rate_per_key,
            "concurrency": options.concurrency,
            STEP: step(_run_task, retries=options.retries, backoff=options.backoff),
        }
        workflow = type(f"TaskWorkflow[{task.module_path}]", (Workflow,), namespace)
        _workflows[name] = workflow
        # The task as declared (a .using() variant may be validated first; queue and
        # priority come from the run, run_after from its input: task_of_run).
        _tasks.setdefault(name, task if task.run_after is None else replace(task, run_after=None))
    registry.register(workflow)  # again after a test unregistered it: same class, no-op
    return workflow


def _find_task_workflow(name: str) -> None:
    """Registry finder: import the task a ``task:`` workflow name points at."""
    if not name.startswith(PREFIX):
        return
    if name in _workflows:  # made here already, then unregistered (tests do)
        registry.register(_workflows[name])
        return
    # @task runs validate_task, which registers it; a module that imports without
    # defining the task leaves the name unknown: the registry raises LookupError.
    path = name[len(PREFIX) :]
    try:
        import_string(path)
    except ImportError as exc:
        raise TaskImportError(
            f"the task {path!r} of workflow {name!r} does not import: {exc}"
        ) from exc


registry.add_finder(_find_task_workflow, prefix=PREFIX)


def task_of_run(run: Run) -> Task:
    """The task ``run`` runs, as it was enqueued: its queue, priority and run_after.
    ``TaskImportError`` when its module path no longer imports; ``LookupError`` when
    nothing defines it."""
    registry.get(run.workflow)
    declared = _tasks[run.workflow]
    changes = {
        name: value
        for name, value in (
            ("queue_name", run.queue),
            ("priority", run.priority),
            ("run_after", results.run_after_of(run)),
        )
        if getattr(declared, name) != value
    }
    return replace(declared, **changes) if changes else declared


def _send(signal, sender: type, result: TaskResult) -> None:
    """Send ``signal``; a receiver that fails is logged, and neither fails nor repeats
    the task (a durable task runs again only when its own code fails)."""
    for receiver, response in signal.send_robust(sender, task_result=result):
        if isinstance(response, Exception):
            logger.error(
                "task %s: a receiver of the task signal failed: %r",
                result.id,
                receiver,
                exc_info=(type(response), response, response.__traceback__),
            )


def _run_task(self, ctx):
    """The one step of a task's workflow: call the task function with the run's input."""
    run = durable.get_run(ctx.run_id)
    task = task_of_run(run)
    backend = task.get_backend()
    began = results.begin_attempt(run, STEP)
    result = results.result_of(backend.alias, task, run, begun=began)
    sender = type(backend)
    _send(task_started, sender, result)
    args, kwargs = run.input.get("args", []), run.input.get("kwargs", {})
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        value = as_json(value)
    except KeyboardInterrupt:
        results.end_attempt(began)
        raise
    except BaseException as exc:
        results.end_attempt(began)
        if isinstance(exc, NonRetryable) or ctx.attempt > options_of(task).retries:
            error = results.error_of(exc)
            failed = results.finished(result, TaskResultStatus.FAILED, error=error)
            _send(task_finished, sender, failed)
        raise
    results.end_attempt(began)
    succeeded = results.finished(result, TaskResultStatus.SUCCESSFUL, value=value)
    _send(task_finished, sender, succeeded)
    return value
