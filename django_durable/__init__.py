"""django-durable: durable workflows for Django, started at most once per key.

The public API; everything else is internal.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from django_durable.exceptions import (
    AlreadyFinished,
    CalledFromAsync,
    Cancelled,
    ChildFailed,
    DefinitionChanged,
    DurableError,
    InvalidKey,
    InvalidKeyType,
    KeyContended,
    KeyTaken,
    NoKey,
    NonRetryable,
    NotCancellable,
    NotFailed,
    NotFinished,
    NotMigrated,
    NotWaiting,
    ParallelFailed,
    RunTimedOut,
    StepTimeout,
    StreamClosed,
    UnknownWorkflow,
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
from django_durable.workflows.flow import Rate

__all__ = [
    "AlreadyFinished",
    "CalledFromAsync",
    "Cancelled",
    "ChildFailed",
    "Context",
    "DefinitionChanged",
    "Cron",
    "Debounce",
    "DurableError",
    "InvalidKey",
    "InvalidKeyType",
    "KeyContended",
    "KeyTaken",
    "NoKey",
    "NonRetryable",
    "NotCancellable",
    "NotFailed",
    "NotFinished",
    "NotMigrated",
    "NotWaiting",
    "Explanation",
    "ParallelFailed",
    "Rate",
    "RunTimedOut",
    "StartResult",
    "StepTimeout",
    "StreamClosed",
    "StreamItem",
    "UnknownWorkflow",
    "WaitTimeout",
    "Workflow",
    "acancel",
    "aexplain",
    "aexplain_run",
    "aflow_stats",
    "aget_run",
    "alist_pending_inputs",
    "aprovide_input",
    "aread_stream",
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
    "explain_run",
    "flow_stats",
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
    "read_stream",
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
    "stream_response",
    "trigger_schedule",
]

# Why the operations are imported twice, statically and lazily:
#
# ``INSTALLED_APPS = ["django_durable", ...]`` makes Django import this package
# while it populates the app registry, before any models module may load. Every
# operation reaches ``django_durable.models`` (``Run`` and the store's statements
# are defined at module level), and defining a model before the registry is ready
# raises ``AppRegistryNotReady``. So at run time the operations load on first use,
# through ``__getattr__`` below, once the apps are ready; importing the package
# stays cheap (exceptions, ``Workflow``, ``@step`` and durations only).
#
# Type checkers (mypy, pyright) read the ``TYPE_CHECKING`` block instead: they see
# these explicit imports, so ``durable.start`` has the real signature of
# ``operations.start.start``, not the ``__getattr__`` fallback.
# tests/test_types.py checks that this block, ``_LAZY`` and ``__all__`` name the
# same things, and that importing the package loads no models module.
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
    from django_durable.operations.flow_reports import (
        aexplain_run,
        aflow_stats,
        explain_run,
        flow_stats,
    )
    from django_durable.operations.prune import prune
    from django_durable.operations.queues import pause_queue, queue_stats, resume_queue
    from django_durable.operations.rerun import rerun
    from django_durable.operations.runs import (
        cancel,
        get_run,
        list_executions,
        provide_input,
        release_key,
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
    from django_durable.runtime.context import Context
    from django_durable.runtime.stream_reader import StreamItem, aread_stream, read_stream
    from django_durable.sse import stream_response

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
        ["aexplain_run", "aflow_stats", "explain_run", "flow_stats"],
        "django_durable.operations.flow_reports",
    ),
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
            "retry",
            "send_event",
        ],
        "django_durable.operations.runs",
    ),
    "rerun": "django_durable.operations.rerun",
    **dict.fromkeys(
        ["disable_schedule", "enable_schedule", "schedule", "trigger_schedule"],
        "django_durable.operations.schedules",
    ),
    **dict.fromkeys(["StartResult", "start", "start_detailed"], "django_durable.operations.start"),
    **dict.fromkeys(
        ["alist_pending_inputs", "list_pending_inputs"], "django_durable.operations.waits"
    ),
    "Context": "django_durable.runtime.context",
    **dict.fromkeys(
        ["StreamItem", "aread_stream", "read_stream"], "django_durable.runtime.stream_reader"
    ),
    "stream_response": "django_durable.sse",
}


if not TYPE_CHECKING:  # type checkers see the imports above, and no fallback

    def __getattr__(name: str) -> object:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'django_durable' has no attribute {name!r}")
        value = getattr(import_module(module), name)
        globals()[name] = value  # later lookups find it without coming here
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})
