"""``durable_task``: a task's key, duplicate policy and retries, declared under ``@task``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from django_durable.tasks.framework import Task
from django_durable.workflows.definition import REUSE_POLICIES, validate_on_duplicate
from django_durable.workflows.durations import as_timedelta
from django_durable.workflows.flow import Rate, flow_problem

__all__ = ["OPTIONS_ATTRIBUTE", "TaskOptions", "durable_task", "options_of"]


@dataclass(frozen=True)
class TaskOptions:
    """What ``durable_task`` declared on a task function."""

    key: Callable[..., str | None] | None = None
    reuse: str = "after_close"
    on_duplicate: Any = "use_existing"
    retries: int = 0
    backoff: timedelta = timedelta(seconds=1)
    # Flow control by key (docs/flow-control.md): the flow key from the task's
    # arguments, and the limits of Workflow's attributes of the same names.
    flow_key: Callable[..., str | None] | None = None
    concurrency_per_key: int | None = None
    rate_per_key: Rate | None = None
    concurrency: int | None = None


OPTIONS_ATTRIBUTE = "durable_task_options"


def options_of(task: Task) -> TaskOptions:
    return getattr(task.func, OPTIONS_ATTRIBUTE, None) or TaskOptions()


def durable_task(
    fn: Callable | None = None,
    /,
    *,
    key: Callable[..., str | None] | None = None,
    reuse: str = "after_close",
    on_duplicate: Any = "use_existing",
    retries: int = 0,
    backoff: timedelta | float = timedelta(seconds=1),
    flow_key: Callable[..., str | None] | None = None,
    concurrency_per_key: int | None = None,
    rate_per_key: Rate | None = None,
    concurrency: int | None = None,
):
    """Declare a task function's key and retries; put it *under* ``@task``::

        @task
        @durable_task(key=lambda article_id: f"article:{article_id}", reuse="after_failure")
        def process_article(article_id): ...

    ``key`` is called with the task's arguments at ``enqueue()`` and returns the key
    (``None``: no key for this call). ``reuse`` and ``on_duplicate`` are the
    workflow rules (docs/keys.md). ``flow_key`` (called with the task's arguments),
    ``concurrency_per_key``, ``rate_per_key`` and ``concurrency`` are flow control's
    (docs/flow-control.md). Bad options raise ``ImproperlyConfigured``.
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
    flow = SimpleNamespace(
        flow_key=flow_key,
        concurrency_per_key=concurrency_per_key,
        rate_per_key=rate_per_key,
        concurrency=concurrency,
    )
    problem = flow_problem(flow)
    if problem:
        raise ImproperlyConfigured(f"{where}: {problem}")
    options = TaskOptions(key, reuse, on_duplicate, retries, backoff, **vars(flow))

    def mark(function: Callable) -> Callable:
        if isinstance(function, Task):
            raise ImproperlyConfigured(
                f"{where} goes under @task (it marks the function, not the Task)"
            )
        setattr(function, OPTIONS_ATTRIBUTE, options)
        return function

    return mark(fn) if fn is not None else mark
