"""Every dashboard action is written to the admin's history (``LogEntry``), with
the user who acted and the reason they gave, like an edit in the admin."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.admin.models import CHANGE, LogEntry

from django_durable.models import QueueState, Run, Schedule


def message(action: str, reason: str | None = None) -> str:
    """The change message the object's history page shows."""
    text = f"{action} in the durable workflows dashboard"
    return f"{text}. Reason: {reason}" if reason else f"{text}."


def log_runs(user, run_ids: Iterable, action: str, reason: str | None = None) -> None:
    """One history row per run acted on."""
    runs = Run.objects.filter(id__in=list(run_ids)).only("id", "workflow", "status")
    _log(user, runs, action, reason)


def log_schedule(user, name: str, action: str) -> None:
    _log(user, Schedule.objects.filter(name=name), action, None)


def log_queue(user, name: str, action: str, reason: str | None = None) -> None:
    """On the queue's row (``durable_queue``), which pausing or resuming creates."""
    _log(user, QueueState.objects.filter(name=name), action, reason)


def _log(user, queryset, action: str, reason: str | None) -> None:
    LogEntry.objects.log_actions(
        user_id=user.pk,
        queryset=queryset,
        action_flag=CHANGE,
        change_message=message(action, reason),
    )
