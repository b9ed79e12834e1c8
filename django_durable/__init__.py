"""django-durable: durable workflows for Django, started at most once per key.

The public API; everything else is internal.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from django_durable.exceptions import (
    AlreadyFinished,
    Cancelled,
    ChildFailed,
    DefinitionChanged,
    DurableError,
    KeyContended,
    KeyTaken,
    NoKey,
    NonRetryable,
    NotCancellable,
    NotFailed,
    NotFinished,
    NotWaiting,
    ParallelFailed,
    RunTimedOut,
    StepTimeout,
    WaitTimeout,
)
from django_durable.workflows.definition import (
    Cron,
    Debounce,
    Workflow,
    step,
)
from django_durable.workflows.durations import (
    days,
    hours,
    minutes,
    seconds,
)

__all__ = [
    "AlreadyFinished",
    "Cancelled",
    "ChildFailed",
    "DefinitionChanged",
    "Cron",
    "Debounce",
    "DurableError",
    "KeyContended",
    "KeyTaken",
    "NoKey",
    "NonRetryable",
    "NotCancellable",
    "NotFailed",
    "NotFinished",
    "NotWaiting",
    "Explanation",
    "ParallelFailed",
    "RunTimedOut",
    "StartResult",
    "StepTimeout",
    "WaitTimeout",
    "Workflow",
    "acancel",
    "aexplain",
    "aget_run",
    "alist_pending_inputs",
    "aprovide_input",
    "arelease_key",
    "arerun",
    "aretry",
    "asend_event",
    "astart",
    "astart_detailed",
    "astart_many",
    "cancel",
    "days",
    "disable_schedule",
    "enable_schedule",
    "explain",
    "get_run",
    "hours",
    "list_executions",
    "list_pending_inputs",
    "minutes",
    "parallel",
    "pause_queue",
    "provide_input",
    "prune",
    "queue_stats",
    "release_key",
    "rerun",
    "resume_queue",
    "retry",
    "schedule",
    "seconds",
    "send_event",
    "start",
    "start_detailed",
    "start_many",
    "step",
    "trigger_schedule",
]

# The operations need the models, so they load when first used, once Django's apps
# are ready; type checkers see them imported here.
if TYPE_CHECKING:
    from django_durable.operations.asynchronous import (
        acancel,
        aexplain,
        aget_run,
        aprovide_input,
        arelease_key,
        arerun,
        aretry,
        asend_event,
        astart,
        astart_detailed,
        astart_many,
    )
    from django_durable.operations.batch import start_many
    from django_durable.operations.children import parallel
    from django_durable.operations.explain import Explanation, explain
    from django_durable.operations.prune import prune
    from django_durable.operations.queues import pause_queue, queue_stats, resume_queue
    from django_durable.operations.runs import (
        cancel,
        get_run,
        list_executions,
        provide_input,
        release_key,
        rerun,
        retry,
        send_event,
    )
    from django_durable.operations.schedules import (
        disable_schedule,
        enable_schedule,
        schedule,
        trigger_schedule,
    )
    from django_durable.operations.start import StartResult, start, start_detailed
    from django_durable.operations.waits import alist_pending_inputs, list_pending_inputs

_LAZY = {
    **dict.fromkeys(
        [
            "acancel",
            "aexplain",
            "aget_run",
            "aprovide_input",
            "arelease_key",
            "arerun",
            "aretry",
            "asend_event",
            "astart",
            "astart_detailed",
            "astart_many",
        ],
        "django_durable.operations.asynchronous",
    ),
    "start_many": "django_durable.operations.batch",
    **dict.fromkeys(["Explanation", "explain"], "django_durable.operations.explain"),
    **dict.fromkeys(
        ["pause_queue", "queue_stats", "resume_queue"], "django_durable.operations.queues"
    ),
    "parallel": "django_durable.operations.children",
    "prune": "django_durable.operations.prune",
    **dict.fromkeys(
        [
            "cancel",
            "get_run",
            "list_executions",
            "provide_input",
            "release_key",
            "rerun",
            "retry",
            "send_event",
        ],
        "django_durable.operations.runs",
    ),
    **dict.fromkeys(
        ["disable_schedule", "enable_schedule", "schedule", "trigger_schedule"],
        "django_durable.operations.schedules",
    ),
    **dict.fromkeys(["StartResult", "start", "start_detailed"], "django_durable.operations.start"),
    **dict.fromkeys(
        ["alist_pending_inputs", "list_pending_inputs"], "django_durable.operations.waits"
    ),
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_durable' has no attribute {name!r}")
    return getattr(import_module(module), name)
