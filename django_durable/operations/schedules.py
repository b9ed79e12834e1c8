"""Cron schedules: ``durable.schedule(...)``, ``schedules = [durable.Cron(...)]``,
``durable.trigger_schedule(name)`` and ``fire_due()``, which workers call.

Each tick fires exactly once however many workers call ``fire_due()``: a
worker locks the due schedule rows (``FOR UPDATE SKIP LOCKED``), starts the
runs and moves ``next_fire_at`` on in the same short transaction, and the move
is a compare-and-set on the tick it fired, so a second worker that saw the same
tick starts nothing (that also covers SQLite, which has no row locks).

A fire starts the workflow with the schedule's key (if any), following the
workflow's ``on_duplicate``. A fire that finds the key taken never raises and
is not a failure: the start records a ``key_duplicate`` activity, as any
duplicate start does, and the fire starts nothing. Ticks missed while no
worker was running are not replayed one by one: the next ``fire_due()`` fires
once and moves on to the next tick after now.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from django.db import IntegrityError

from django_durable import store
from django_durable.exceptions import KeyTaken
from django_durable.models import Schedule
from django_durable.operations import inputs, keys
from django_durable.operations.start import start_run
from django_durable.workflows.cron import check_cron, check_timezone, next_fire
from django_durable.workflows.definition import Cron, Workflow, registry

logger = logging.getLogger("django_durable.operations.schedules")

# Outcomes of a start in which the fire created a run.
STARTED = {"started", "handed_off", "cancel_existing", "run_again"}
# The context value a scheduled run starts with: {"name": schedule, "tick": ISO time}.
SCHEDULE_CONTEXT = "durable.schedule"
BATCH = 20


class _AlreadyFired(Exception):
    """Another node fired this tick first: roll this fire back."""


def default_name(workflow_name: str, cron: str, key: str | None) -> str:
    return f"{workflow_name}:{key}@{cron}" if key else f"{workflow_name}@{cron}"


# --- defining schedules -----------------------------------------------------------


def schedule(
    workflow: type[Workflow] | str,
    cron: str,
    key: str | None = None,
    input: dict[str, Any] | None = None,
    name: str | None = None,
    *,
    timezone: str = "UTC",
) -> Schedule:
    """Create or update the schedule ``name`` (idempotent by name) and return it.

    ``name`` defaults to ``"<workflow>@<cron>"`` (``"<workflow>:<key>@<cron>"``
    with a key). Bad arguments raise before anything is written: ``LookupError``
    (unknown workflow), ``ValueError`` (cron expression, timezone, name),
    ``ValidationError`` (key), ``TypeError`` (input).
    """
    definition = registry.resolve(workflow)
    check_cron(cron)
    check_timezone(timezone)
    key = keys.validate_key(key)
    payload = inputs.validate_input(input)
    name = name if name is not None else default_name(definition.name, cron, key)
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ValueError(f"a schedule name is a string of 1 to 200 characters, got {name!r}")
    return _upsert(name, definition.name, cron, key, payload, timezone, declared=False)


def _upsert(name, workflow_name, cron, key, payload, timezone, *, declared: bool) -> Schedule:
    with store.atomic():
        existing = store.lock_schedule(name, missing_ok=True)
        if existing is None:
            try:
                with store.atomic():
                    return Schedule.objects.create(
                        name=name,
                        workflow=workflow_name,
                        cron=cron,
                        key=key,
                        input=payload,
                        timezone=timezone,
                        declared=declared,
                        next_fire_at=next_fire(cron, timezone, store.now()),
                    )
            except IntegrityError:
                # Another process created it at the same moment (workers syncing).
                existing = store.lock_schedule(name)
        timing_changed = (existing.cron, existing.timezone) != (cron, timezone)
        existing.workflow, existing.key, existing.input = workflow_name, key, payload
        existing.cron, existing.timezone, existing.declared = cron, timezone, declared
        if timing_changed or (existing.enabled and existing.next_fire_at is None):
            existing.next_fire_at = next_fire(cron, timezone, store.now())
        existing.save(
            update_fields=[
                "workflow",
                "key",
                "input",
                "cron",
                "timezone",
                "declared",
                "next_fire_at",
            ]
        )
        return existing


def enable_schedule(name: str) -> None:
    """Let schedule ``name`` fire again, from its next tick after now."""
    with store.atomic():
        sched = store.lock_schedule(name)
        sched.enabled = True
        sched.next_fire_at = next_fire(sched.cron, sched.timezone, store.now())
        sched.save(update_fields=["enabled", "next_fire_at"])


def disable_schedule(name: str) -> None:
    """Stop schedule ``name`` from firing (``trigger_schedule`` still fires it)."""
    if not Schedule.objects.filter(name=name).update(enabled=False):
        raise Schedule.DoesNotExist(f"no schedule is named {name!r}")


def declared_schedules() -> dict[str, tuple[type[Workflow], Cron]]:
    """Every ``schedules = [Cron(...)]`` of the registered workflows, by name."""
    found: dict[str, tuple[type[Workflow], Cron]] = {}
    for workflow in registry.all():
        for cron in workflow.schedules:
            name = cron.name or default_name(workflow.name, cron.cron, cron.key)
            found[name] = (workflow, cron)
    return found


def sync_declared() -> int:
    """Make the schedule rows match the classes: create or update each declared
    schedule, delete declared rows whose declaration is gone. Enabled state is
    kept. Runs after ``migrate`` and at the first ``fire_due()`` of a process."""
    declared = declared_schedules()
    for name, (workflow, cron) in declared.items():
        _upsert(
            name,
            workflow.name,
            cron.cron,
            keys.validate_key(cron.key),
            dict(cron.input or {}),
            cron.timezone,
            declared=True,
        )
    Schedule.objects.filter(declared=True).exclude(name__in=list(declared)).delete()
    return len(declared)


def sync_after_migrate(sender, using="default", plan=None, **kwargs) -> None:
    """``post_migrate``: the declared schedules become rows, on django-durable's
    database, after a ``migrate`` forwards. Not after one that went backwards (the
    tables may be gone, ``migrate django_durable zero``, or older than these models):
    the ``migrate`` forwards that follows syncs them."""
    if using != store.alias() or any(backwards for _migration, backwards in plan or ()):
        return
    if not store.has_table(Schedule._meta.db_table):
        return
    sync_declared()


# --- firing ------------------------------------------------------------------------


_synced = False


def fire_due(limit: int = BATCH) -> int:
    """Fire every schedule whose tick has come; return how many ticks fired.

    Safe to call from many workers at once: each tick fires exactly once.
    """
    global _synced
    if not _synced:
        sync_declared()
        _synced = True
    fired = 0
    while True:
        at = store.now()
        with store.atomic():
            due = store.lock_due_schedules(at, limit)
            for sched in due:
                fired += _fire_tick(sched, at)
        if len(due) < limit:
            return fired


def _fire_tick(sched: Schedule, at) -> int:
    """Fire ``sched``'s due tick and move it on; 0 if another node fired it."""
    tick = sched.next_fire_at
    following = next_fire(sched.cron, sched.timezone, max(at, tick))
    try:
        with store.atomic():
            run_id, failed = _fire(sched, tick)
            if not store.advance_schedule(
                sched, fired_at=at, next_fire_at=following, run_id=run_id, failed=failed
            ):
                raise _AlreadyFired
    except _AlreadyFired:
        return 0
    return 1


def _fire(sched: Schedule, tick) -> tuple[uuid.UUID | None, bool]:
    """Start the schedule's workflow; ``(run id if a run was created, failed)``."""
    try:
        workflow = registry.get(sched.workflow)
    except LookupError:
        logger.error("schedule %s: no workflow is named %r", sched.name, sched.workflow)
        return None, True
    # The run can tell which tick started it: ctx.get("durable.schedule").
    marker: dict[str, Any] = {SCHEDULE_CONTEXT: {"name": sched.name, "tick": tick.isoformat()}}
    try:
        with store.atomic():
            try:
                result = start_run(
                    workflow,
                    dict(sched.input or {}),
                    sched.key,
                    workflow.on_duplicate,
                    context=marker,
                )
            except KeyTaken:
                # Skipped, not failed; caught inside the savepoint so the
                # key_duplicate activity the start recorded is kept.
                return None, False
    except Exception:
        logger.exception("schedule %s failed to start %s", sched.name, sched.workflow)
        return None, True
    return (result.run_id if result.outcome in STARTED else None), False


def trigger_schedule(name: str) -> uuid.UUID | None:
    """Fire schedule ``name`` now, with its key and the workflow's ``on_duplicate``.

    Returns the id of the run the fire created, or ``None`` when it created none
    (the key's holder answered: ``use_existing``, ``error``, ``send_event``,
    ``debounced``); never raises ``KeyTaken``. Its next scheduled tick is unchanged.
    """
    with store.atomic():
        sched = store.lock_schedule(name)
        at = store.now()
        run_id, failed = _fire(sched, at)
        store.record_manual_fire(sched.name, fired_at=at, run_id=run_id, failed=failed)
    return run_id
