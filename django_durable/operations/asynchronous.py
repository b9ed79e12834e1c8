"""The async face of the public API: ``astart``, ``aget_run``, ``acancel``...

Every operation talks to the database through Django's ORM, which is synchronous,
so each ``a*`` function runs its synchronous twin with asgiref's
``sync_to_async(thread_sensitive=True)``, the way Django itself runs ORM work for
async code: all of them share the one thread that owns the request's connection,
so an async view never opens a connection per call and never touches the
database from the event loop.

Each awaited call is its own unit of work: it commits (or raises) before it
returns. ``transaction.atomic()`` can't wrap an ``await`` (it belongs to a thread,
and the event loop isn't it); to start a run together with other writes, put
them in one synchronous function and await that with ``sync_to_async``
(docs/async.md).

``start_many`` and ``explain`` are looked up on the package at call time, so
these wrappers follow whatever ``django_durable`` exports.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from asgiref.sync import sync_to_async

from django_durable.models import Run
from django_durable.operations import batch, runs
from django_durable.operations import explain as explaining
from django_durable.operations import rerun as rerunning
from django_durable.operations import start as starting
from django_durable.workflows.definition import OnDuplicate, Workflow

__all__ = [
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
]


def _in_sync_thread(fn):
    return sync_to_async(fn, thread_sensitive=True)


async def astart(
    workflow: type[Workflow] | str,
    input: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    on_duplicate: OnDuplicate | None = None,
    run_after: datetime | timedelta | None = None,
    priority: int | None = None,
    queue: str | None = None,
    flow_key: str | None = None,
) -> uuid.UUID:
    """``start()`` for async code; the same arguments."""
    return await _in_sync_thread(starting.start)(
        workflow,
        input,
        key=key,
        on_duplicate=on_duplicate,
        run_after=run_after,
        priority=priority,
        queue=queue,
        flow_key=flow_key,
    )


async def astart_detailed(
    workflow: type[Workflow] | str,
    input: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    on_duplicate: OnDuplicate | None = None,
    run_after: datetime | timedelta | None = None,
    priority: int | None = None,
    queue: str | None = None,
    flow_key: str | None = None,
) -> starting.StartResult:
    """``start_detailed()`` for async code."""
    return await _in_sync_thread(starting.start_detailed)(
        workflow,
        input,
        key=key,
        on_duplicate=on_duplicate,
        run_after=run_after,
        priority=priority,
        queue=queue,
        flow_key=flow_key,
    )


async def astart_many(
    workflow: type[Workflow] | str,
    items: Iterable[tuple[dict[str, Any] | None, str | None]],
    *,
    on_duplicate: OnDuplicate | None = None,
) -> list[starting.StartResult]:
    """``start_many()`` for async code. ``items`` is read in the sync thread too."""
    return await _in_sync_thread(batch.start_many)(workflow, items, on_duplicate=on_duplicate)


async def aexplain(
    workflow: type[Workflow] | str,
    input: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    on_duplicate: OnDuplicate | None = None,
) -> explaining.Explanation:
    """``explain()`` for async code: what a start would do now, writing nothing."""
    return await _in_sync_thread(explaining.explain)(
        workflow, input, key=key, on_duplicate=on_duplicate
    )


async def aretry(run_id: uuid.UUID | str) -> uuid.UUID:
    """``retry()`` for async code."""
    return await _in_sync_thread(runs.retry)(run_id)


async def arerun(
    run_id: uuid.UUID | str, *, from_step: str | None = None, input: Any = rerunning.SAME_INPUT
) -> uuid.UUID:
    """``rerun()`` for async code."""
    return await _in_sync_thread(rerunning.rerun)(run_id, from_step=from_step, input=input)


async def arelease_key(run_id: uuid.UUID | str, by: str | None = None) -> None:
    """``release_key()`` for async code."""
    await _in_sync_thread(runs.release_key)(run_id, by=by)


async def acancel(run_id: uuid.UUID | str, reason: str | None = None) -> None:
    """``cancel()`` for async code."""
    await _in_sync_thread(runs.cancel)(run_id, reason=reason)


async def asend_event(
    run_id: uuid.UUID | str, name: str, payload: Any = None, buffer: bool = False
) -> None:
    """``send_event()`` for async code."""
    await _in_sync_thread(runs.send_event)(run_id, name, payload, buffer=buffer)


async def aprovide_input(run_id: uuid.UUID | str, name: str, value: Any) -> None:
    """``provide_input()`` for async code."""
    await _in_sync_thread(runs.provide_input)(run_id, name, value)


async def aget_run(run_id: uuid.UUID | str) -> Run:
    """``get_run()`` for async code; ``Run.DoesNotExist`` if there is none."""
    return await _in_sync_thread(runs.get_run)(run_id)
