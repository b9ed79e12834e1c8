"""django-durable: durable workflows for Django, started at most once per key.

The public API; everything else is internal.
"""

from .definition import Cron, Debounce, Workflow, step
from .durations import days, hours, minutes, seconds
from .exceptions import (
    AlreadyFinished,
    Cancelled,
    DurableError,
    KeyContended,
    KeyTaken,
    NoKey,
    NotCancellable,
    NotFailed,
    NotFinished,
    NotWaiting,
)

__all__ = [
    "AlreadyFinished",
    "Cancelled",
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
    "StartResult",
    "Workflow",
    "cancel",
    "days",
    "get_run",
    "hours",
    "list_executions",
    "minutes",
    "provide_input",
    "prune",
    "release_key",
    "rerun",
    "retry",
    "seconds",
    "send_event",
    "start",
    "start_detailed",
    "step",
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


def __getattr__(name):
    if name in _SERVICES:
        from . import services

        return getattr(services, name)
    raise AttributeError(f"module 'django_durable' has no attribute {name!r}")
