"""django-durable: durable workflows for Django, started at most once per key.

The public API; everything else is internal.
"""

from .definition import Cron, Debounce, Workflow, step
from .durations import days, hours, minutes, seconds
from .exceptions import (
    AlreadyFinished,
    Cancelled,
    ChildFailed,
    DurableError,
    KeyContended,
    KeyTaken,
    NoKey,
    NotCancellable,
    NotFailed,
    NotFinished,
    NotWaiting,
    ParallelFailed,
)

__all__ = [
    "AlreadyFinished",
    "Cancelled",
    "ChildFailed",
    "Cron",
    "Debounce",
    "DurableError",
    "KeyContended",
    "KeyTaken",
    "NoKey",
    "NotCancellable",
    "NotFailed",
    "NotFinished",
    "NotWaiting",
    "ParallelFailed",
    "StartResult",
    "Workflow",
    "cancel",
    "days",
    "disable_schedule",
    "enable_schedule",
    "get_run",
    "hours",
    "list_executions",
    "minutes",
    "parallel",
    "provide_input",
    "prune",
    "release_key",
    "rerun",
    "retry",
    "schedule",
    "seconds",
    "send_event",
    "start",
    "start_detailed",
    "step",
    "trigger_schedule",
]

# The operations need the models, so they load once Django's apps are ready.
_SERVICES = {
    "StartResult",
    "cancel",
    "get_run",
    "list_executions",
    "provide_input",
    "prune",
    "release_key",
    "rerun",
    "retry",
    "send_event",
    "start",
    "start_detailed",
}


# Schedules (scheduler.py) and parallel branches (children.py), loaded the same way.
_SCHEDULER = {"schedule", "trigger_schedule", "enable_schedule", "disable_schedule"}


def __getattr__(name):
    if name in _SERVICES:
        from . import services

        return getattr(services, name)
    if name in _SCHEDULER:
        from . import scheduler

        return getattr(scheduler, name)
    if name == "parallel":
        from .children import parallel

        return parallel
    raise AttributeError(f"module 'django_durable' has no attribute {name!r}")
