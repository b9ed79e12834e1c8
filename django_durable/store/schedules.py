"""Cron schedules: their rows written (created, changed, disabled, the undeclared
deleted) and their due ticks claimed once across workers."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db import IntegrityError
from django.db.models import F

from django_durable.models import Schedule
from django_durable.store.base import atomic

__all__ = [
    "advance_schedule",
    "create_schedule",
    "delete_undeclared_schedules",
    "lock_due_schedules",
    "lock_schedule",
    "record_manual_fire",
    "set_schedule_disabled",
    "update_schedule",
]

# --- writing schedules ------------------------------------------------------------


def create_schedule(**fields: Any) -> Schedule | None:
    """Insert the schedule ``fields`` describe and return it; None when another
    process inserted one of that name at the same moment (workers syncing): the
    insert is in its own savepoint, so the caller's transaction goes on."""
    try:
        with atomic():
            return Schedule.objects.create(**fields)
    except IntegrityError:
        return None


def update_schedule(schedule: Schedule, **changes: Any) -> None:
    """Write ``changes`` to ``schedule`` (and its row): only the fields named."""
    for field, value in changes.items():
        setattr(schedule, field, value)
    schedule.save(update_fields=list(changes))


def set_schedule_disabled(name: str) -> bool:
    """Disable the schedule ``name``; False when there is none."""
    return bool(Schedule.objects.filter(name=name).update(enabled=False))


def delete_undeclared_schedules(declared: list[str]) -> None:
    """Delete the declared schedules whose name is not in ``declared`` (their
    declaration is gone); schedules made with ``schedule()`` stay."""
    Schedule.objects.filter(declared=True).exclude(name__in=declared).delete()


# --- locking and firing -----------------------------------------------------------


def lock_schedule(name: str, *, missing_ok: bool = False) -> Schedule | None:
    """The schedule ``name``, its row locked until the caller's transaction ends (so
    two processes that change it take turns); ``Schedule.DoesNotExist`` when there is
    none, or None with ``missing_ok``."""
    schedules = Schedule.objects.select_for_update()
    if missing_ok:
        return schedules.filter(name=name).first()
    return schedules.get(name=name)


def lock_due_schedules(at: datetime, limit: int) -> list[Schedule]:
    """Enabled schedules due at ``at``, locked until the caller's transaction ends.

    ``SKIP LOCKED``: a schedule another node is firing is skipped, and once that
    node commits, its advanced ``next_fire_at`` no longer matches. SQLite has no
    row locks; ``advance_schedule`` compares and sets instead.
    """
    return list(
        Schedule.objects.select_for_update(skip_locked=True)
        .filter(enabled=True, next_fire_at__isnull=False, next_fire_at__lte=at)
        .order_by("next_fire_at")[:limit]
    )


def advance_schedule(
    schedule: Schedule,
    *,
    fired_at: datetime,
    next_fire_at: datetime | None,
    run_id: uuid.UUID | None,
    failed: bool,
) -> bool:
    """Move a schedule past the tick it fired, only if no one else did (compare and
    set on ``next_fire_at``); False means another node fired that tick."""
    changes: dict[str, Any] = {"next_fire_at": next_fire_at, "last_fired_at": fired_at}
    if run_id is not None:
        changes["last_run_id"] = run_id
    if failed:
        changes["failures"] = F("failures") + 1
    return bool(
        Schedule.objects.filter(
            id=schedule.id, enabled=True, next_fire_at=schedule.next_fire_at
        ).update(**changes)
    )


def record_manual_fire(
    name: str, *, fired_at: datetime, run_id: uuid.UUID | None, failed: bool
) -> None:
    changes: dict[str, Any] = {"last_fired_at": fired_at}
    if run_id is not None:
        changes["last_run_id"] = run_id
    if failed:
        changes["failures"] = F("failures") + 1
    Schedule.objects.filter(name=name).update(**changes)
