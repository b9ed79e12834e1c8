"""``ctx.stream(name)``'s writer: what a step publishes while it runs (docs/streams.md).

Each ``write`` is one statement committed on its own (``operations.streams`` checks,
the store writes), so a reader sees the item at once and keeps it whatever the step
does next. An ``async def`` step awaits ``awrite``/``aclose``: they run the same call
through ``sync_to_async`` (on the worker's thread, its connection), never on the loop.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

from django_durable.operations import streams
from django_durable.runtime.async_context import refuse_in_event_loop

__all__ = ["StreamWriter"]


class StreamWriter:
    """Writes the items of one stream of the step's run."""

    def __init__(self, run, step: str, step_index: int, name: str, *, join: bool = False):
        self._run = run
        self._join = join
        self._step = step
        self._step_index = step_index
        self.name = name

    def write(self, value: Any) -> None:
        """Append ``value`` (JSON, at most ``DURABLE["MAX_STREAM_ITEM_BYTES"]``) to the
        stream, durable and visible to readers when this returns. ``TypeError`` /
        ``ValueError`` for a bad value or a full stream, ``durable.StreamClosed`` once
        the stream is closed."""
        refuse_in_event_loop("writer.write()", "await writer.awrite(value)")
        streams.write(self._run, self._step, self._step_index, self.name, value, join=self._join)

    def close(self) -> None:
        """End the stream: its readers stop once they have every item; a later write
        raises ``durable.StreamClosed``."""
        refuse_in_event_loop("writer.close()", "await writer.aclose()")
        streams.close(self._run.id, self.name, join=self._join)

    async def awrite(self, value: Any) -> None:
        """``write()`` for async steps."""
        await sync_to_async(self.write)(value)

    async def aclose(self) -> None:
        """``close()`` for async steps."""
        await sync_to_async(self.close)()

    def __repr__(self) -> str:
        return f"<StreamWriter {self.name!r} of run {self._run.id}>"
