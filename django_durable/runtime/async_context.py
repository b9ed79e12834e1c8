"""The ``ctx`` methods an ``async def`` step awaits instead of the blocking ones.

Inside an async step the event loop's thread must not wait on the database
(Django raises ``SynchronousOnlyOperation``). The waits (``sleep``,
``sleep_until``, ``wait_for_event``, ``wait_for_any``, ``wait_for_all``,
``wait_for_input``: ``runtime.waits``) touch no database -- they read what the
run already holds and raise ``Suspend`` -- so an async step calls them as they are.
What does query is awaited here through ``sync_to_async``: under the worker that
runs on the worker thread itself, on its connection (see ``runtime.calling``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from asgiref.sync import sync_to_async
from django.core.exceptions import SynchronousOnlyOperation

__all__ = ["AsyncContextMethods", "refuse_in_event_loop"]


def refuse_in_event_loop(call: str, instead: str) -> None:
    """Raise ``SynchronousOnlyOperation`` naming the awaitable to use, when a blocking
    ``ctx`` method is called on a thread that runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise SynchronousOnlyOperation(
        f"{call} waits on the database and this is an async step: use {instead}"
    )


class AsyncContextMethods:
    """Mixed into ``Context``: each method awaits its blocking twin off the loop."""

    async def aheartbeat(self) -> None:
        """``heartbeat()`` for async steps: renew the lease, raise ``Cancelled`` if the
        run was cancelled."""
        await sync_to_async(self.heartbeat)()

    async def aprogress(
        self, done: float, total: float | None = None, message: str | None = None
    ) -> None:
        """``progress()`` for async steps."""
        await sync_to_async(self.progress)(done, total, message)

    async def acall_workflow(
        self, workflow: Any, input: dict | None = None, *, key: str | None = None
    ) -> Any:
        """``call_workflow()`` for async steps."""
        return await sync_to_async(self.call_workflow)(workflow, input, key=key)

    async def aparallel(self, branches: list, *, mode: str = "fail_fast") -> list[Any]:
        """``parallel()`` for async steps."""
        return await sync_to_async(self.parallel)(branches, mode=mode)
