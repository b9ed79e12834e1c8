"""Calling a step or a compensation, plain or ``async def``, with its logs kept.

The executor and the compensation runner call user code only through ``call()``:
it captures what the call logs (``steplogs``) onto ``run.attempt_logs`` for the
attempt the store records next, makes the run's trace the current one (so spans
the step opens land in it: ``telemetry.in_run_trace``), and awaits what an
``async def`` returns.

How an async step runs: through asgiref's ``async_to_sync``, the way Django runs
an async view under WSGI. The worker thread that claimed the run stays the step's
synchronous thread, and the coroutine runs on an event loop made for the attempt
(in a helper thread, closed when the attempt ends). Every thread-sensitive call
the step makes -- Django's async ORM (``aget``, ``asave``...), ``sync_to_async``,
``ctx.aheartbeat()`` -- runs back on the worker thread, on the same database
connection a sync step would use, so transactions, fences and the connection's
lifetime are the same for both kinds of step. A loop kept per worker thread was
the alternative; its database calls would all queue on asgiref's one
process-wide thread and connection instead.

Cancellation: the worker's heartbeat thread flags a run it no longer owns
(``run.lease_lost``); while an async step runs, a supervisor on its loop looks
at the flag every ``CANCEL_POLL`` seconds, cancels the step's task and raises
``Cancelled`` -- a step waiting in ``asyncio.sleep`` stops without calling
``aheartbeat``. ``timeout`` (seconds) cancels it the same way and raises
``AttemptTimedOut``. A sync step can only be stopped at its next ``ctx.heartbeat()``.
A step that catches ``asyncio.CancelledError`` and carries on keeps its worker
thread until it returns; its result is not recorded.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import async_to_sync

from django_durable import store, telemetry
from django_durable.exceptions import Cancelled
from django_durable.models import Run
from django_durable.runtime import steplogs

__all__ = ["CANCEL_POLL", "AttemptTimedOut", "call"]

# How often the supervisor of an async step looks at the cancel flag (seconds).
CANCEL_POLL = 0.05


class AttemptTimedOut(TimeoutError):
    """An async step ran past the ``timeout`` given to ``call()``: its task was
    cancelled and its result will never be recorded. (Its own class, so a
    ``TimeoutError`` the step raises itself is not mistaken for it.)"""


def call(run: Run, fn: Callable[..., Any], *args: Any, timeout: float | None = None) -> Any:
    """Call ``fn(*args)`` as the current attempt of ``run`` and return its result.

    An awaitable result (an ``async def`` step or compensation) is awaited on an
    event loop of its own; what the call logged is left on ``run.attempt_logs``
    whatever the outcome, and what it raised (``Suspend``, ``Cancelled``, an
    error) is raised as it is.
    """
    with steplogs.capture() as captured, telemetry.in_run_trace(run):
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                result = async_to_sync(_supervise)(run, result, timeout)
            return result
        finally:
            run.attempt_logs = captured.close()
            # A stream write inside the step's own transaction opened a second connection.
            store.release_side_connection()


async def _supervise(run: Run, awaitable: Awaitable[Any], timeout: float | None) -> Any:
    """Await the step as a task, cancelling it when the run is lost or times out."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(awaitable)
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        wait = CANCEL_POLL
        if deadline is not None:
            wait = max(0.0, min(wait, deadline - loop.time()))
        done, _ = await asyncio.wait({task}, timeout=wait)
        if done:
            try:
                return task.result()
            except asyncio.CancelledError:
                # The step cancelled itself (or a task it awaited): a failed attempt,
                # not the end of the worker thread.
                raise RuntimeError("the async step's task was cancelled") from None
        if getattr(run, "lease_lost", False):
            await _cancel(task)
            raise Cancelled(f"run {run.id} was cancelled or is no longer owned")
        if deadline is not None and loop.time() >= deadline:
            await _cancel(task)
            raise AttemptTimedOut(f"the async step ran longer than {timeout:g}s")


async def _cancel(task: asyncio.Future) -> None:
    """Cancel the step's task and let it unwind (its ``finally`` blocks run); a step
    that swallows the cancellation keeps the worker thread until it returns."""
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: what it raised while unwinding is not reported twice
