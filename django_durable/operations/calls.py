"""What every public call says when it cannot work, instead of the database's words.

- **From async code.** Django refuses database work in a thread that runs an event
  loop (``SynchronousOnlyOperation``, "You cannot call this from an async context"),
  which says nothing of what to call instead. ``@public_call("astart")`` turns that
  refusal, raised by the call's first statement before anything is written, into
  ``durable.CalledFromAsync``, which names the async twin to await. The refusal is
  caught, not predicted: a project that sets ``DJANGO_ALLOW_ASYNC_UNSAFE`` keeps
  what Django allows it.
- **Before ``migrate``.** A statement that fails where django-durable's migrations
  are not applied raises ``durable.NotMigrated``, naming ``python manage.py
  migrate``. The migrations are looked at only after a failure (``store.schema``),
  so the happy path pays for a ``try`` only. ``not_migrated()`` is the same question
  for the worker, the dashboard and the command line, asked before they start.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.core.exceptions import SynchronousOnlyOperation
from django.db import DatabaseError, OperationalError, ProgrammingError

from django_durable import store
from django_durable.exceptions import CalledFromAsync, NotMigrated

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["not_migrated", "public_call"]

RUN_MIGRATE = "python manage.py migrate"


def not_migrated(alias: str | None = None) -> NotMigrated | None:
    """``NotMigrated`` saying what is missing when django-durable's migrations are not
    all applied on its database; None when they are (or the database can't say)."""
    alias = alias or store.alias()
    missing = store.unapplied_migrations(alias)
    if not missing:
        return None
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if missing[3:] else "")
    return NotMigrated(
        f"django-durable's tables are not migrated on database {alias!r} "
        f"({len(missing)} migration(s) not applied: {shown}). "
        f"Run `{RUN_MIGRATE}` first."
    )


def _names_the_schema(exc: DatabaseError) -> bool:
    """A table, column or function the statement needs is missing: PostgreSQL's
    undefined_table / undefined_column / undefined_function (a ``ProgrammingError``),
    SQLite's "no such table" / "no such column" / "has no column named". Not a lost
    connection: the migrations are not looked at then (that would connect again)."""
    if isinstance(exc, ProgrammingError):
        return True
    text = str(exc)
    return isinstance(exc, OperationalError) and ("no such" in text or "has no column" in text)


def public_call(twin: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """A public call: name ``durable.<twin>`` when it is refused in async code, and
    ``migrate`` when it fails on a database that was not migrated."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        name = fn.__name__

        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except SynchronousOnlyOperation as exc:
                # A call inside another (start() calls start_detailed()): the outer
                # one is what the caller wrote, so its name is the one said.
                cause = exc.__cause__ if isinstance(exc, CalledFromAsync) else exc
                raise CalledFromAsync(
                    f"durable.{name}() was called from async code (an async view, or "
                    "anything running in an event loop), where Django allows no "
                    f"database work: use `await durable.{twin}(...)`, which takes the "
                    "same arguments."
                ) from cause
            except DatabaseError as exc:
                if not _names_the_schema(exc) or (problem := not_migrated()) is None:
                    raise
                raise problem from exc

        return call

    return decorate
