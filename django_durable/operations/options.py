"""The scheduling options of a start (``run_after``, ``priority``, ``queue``), checked
before anything is written and turned into the new run's columns."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from django_durable import store

# ``durable_run.priority`` is a 32-bit integer.
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1
MAX_QUEUE_LENGTH = 100

__all__ = ["check_priority", "check_queue", "run_fields"]


def check_priority(priority: object, where: str = "priority") -> int:
    """An ``int`` in the 32-bit range: ``TypeError`` or ``ValueError`` otherwise."""
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise TypeError(f"{where} must be an int, got {type(priority).__name__}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"{where} must be between {MIN_PRIORITY} and {MAX_PRIORITY}")
    return priority


def check_queue(queue: object, where: str = "queue") -> str:
    """A non-empty ``str`` of at most 100 characters."""
    if not isinstance(queue, str):
        raise TypeError(f"{where} must be a str, got {type(queue).__name__}")
    if not queue or len(queue) > MAX_QUEUE_LENGTH:
        raise ValueError(f"{where} must be 1 to {MAX_QUEUE_LENGTH} characters, got {queue!r}")
    return queue


def due_at(run_after: object) -> datetime | None:
    """When a run started with ``run_after`` becomes due (None: now)."""
    if run_after is None:
        return None
    if isinstance(run_after, timedelta):
        return store.now() + run_after
    if isinstance(run_after, datetime):
        if timezone.is_naive(run_after):
            raise TypeError("run_after must be an aware datetime (a naive one has no time zone)")
        return run_after
    raise TypeError(
        f"run_after must be an aware datetime or a timedelta, got {type(run_after).__name__}"
    )


def run_fields(
    workflow, *, run_after: object = None, priority: object = None, queue: object = None
) -> dict[str, Any]:
    """The new run's columns these options set (none of them: ``{}``)."""
    fields: dict[str, Any] = {}
    if priority is not None:
        fields["priority"] = check_priority(priority)
    if queue is not None:
        fields["queue"] = check_queue(queue)
    due = due_at(run_after)
    if due is not None:
        fields["due_at"] = due
        fields["timeout_at"] = due + workflow.timeout if workflow.timeout else None
    return fields
