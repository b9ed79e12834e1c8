"""``durable.read_stream`` and ``durable.aread_stream``: a stream's items as they are
written (docs/streams.md).

A reader reads what it has not seen (``after``), then waits for the process's
listener to ring (``runtime.stream_listener``; SQLite: ``POLL_INTERVAL``) and reads
again. It registers before its first read and clears its doorbell before each read,
so a write committed between a read and the wait still wakes it. It ends when the
stream is ended (closed, or its run finished) and it yielded every item, or after
``timeout`` seconds without a new item.

Connections: a sync reader reads on its thread's connection (a test sees its own
transaction) and closes it before it waits, unless a transaction is open on it. An
async reader reads on one of ``READ_THREADS`` threads shared by every async reader of
the process, each keeping its connection: a thousand waiting clients of an ASGI
process hold those connections and the listener's, no more, and no thread each.
When the listener rings the async readers of a stream, one read for all those at
the same offset begins at once, and each wakes once, with its answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from asgiref.sync import sync_to_async
from django.db import DatabaseError, InterfaceError, OperationalError

from django_durable import store
from django_durable.models import Run
from django_durable.operations.streams import check_after, check_stream_name
from django_durable.runtime.stream_listener import (
    StreamListener,
    Waiter,
    listener,
    recheck_after,
)

__all__ = [
    "READ_BATCH",
    "READ_THREADS",
    "StreamItem",
    "aread_stream",
    "astream_ended",
    "read_stream",
    "stream_ended",
]

# Items read per query.
READ_BATCH = 500
# The threads async readers read on (each keeps one database connection).
READ_THREADS = 2

_reads = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="durable-stream-read")

T = TypeVar("T")

logger = logging.getLogger("django_durable.streams")

# What a read raises while the database is out of reach (a restart, a failover): a
# waiting reader reads again after POLL_INTERVAL until its deadline, as a worker keeps
# polling, and misses nothing (it reads after the offset it yielded last).
OUTAGE = (OperationalError, InterfaceError)


class StreamItem(NamedTuple):
    """One item of a stream: ``kind`` is ``"value"`` or ``"reset"`` (a new execution of
    the step starts over; ``value`` None), ``written_at`` an aware datetime."""

    offset: int
    kind: str
    value: Any
    step: str
    attempt: int
    written_at: datetime


def _checked(run_id, name, after, timeout) -> tuple[uuid.UUID, str, int, float | None]:
    name = check_stream_name(name)
    after = check_after(after)
    if timeout is not None:
        if not isinstance(timeout, int | float) or isinstance(timeout, bool):
            raise TypeError(f"timeout is a number of seconds or None, got {timeout!r}")
        if timeout < 0:
            raise ValueError(f"timeout is >= 0, got {timeout}")
    if not isinstance(run_id, uuid.UUID):
        try:
            run_id = uuid.UUID(str(run_id))
        except ValueError:
            raise Run.DoesNotExist(f"no run {run_id}") from None
    return run_id, name, -1 if after is None else after, timeout


def _fetch(run_id: uuid.UUID, name: str, after: int) -> tuple[list[StreamItem], bool, bool]:
    """The items after ``after``, whether the stream ended with them (every item read),
    and whether a full batch came back (read again before waiting)."""
    rows, position = store.read_stream(run_id, name, after, READ_BATCH)
    items = [StreamItem(*row) for row in rows]
    if len(items) == READ_BATCH:
        return items, False, True
    last = items[-1].offset if items else after
    ended = position is None or (position.ended and position.items <= last + 1)
    return items, ended, False


class _Cursor:
    """Where a reader is: the last offset it yielded, and the time it gives up."""

    def __init__(self, run_id: uuid.UUID, name: str, after: int, timeout: float | None):
        self.run_id, self.name, self.after, self.timeout = run_id, name, after, timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.more = False

    def take(self, fetched: tuple[list[StreamItem], bool, bool]) -> tuple[list[StreamItem], bool]:
        items, ended, self.more = fetched
        if items:
            self.after = items[-1].offset
            if self.timeout is not None:
                self.deadline = time.monotonic() + self.timeout
        return items, ended

    def read(self) -> tuple[list[StreamItem], bool]:
        return self.take(_fetch(self.run_id, self.name, self.after))

    def pause(self, active: StreamListener | None) -> float | None:
        """How long to wait before reading again: until the next look without a
        NOTIFY (``recheck_after``), or less if the reader's deadline comes first;
        None once it has passed (the reader gives up)."""
        remaining = None if self.deadline is None else self.deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return None
        pause = recheck_after(active)
        return pause if remaining is None else min(pause, remaining)

    def retry_after(self, exc: Exception) -> float:
        """How long to wait before reading again after ``exc`` (an ``OUTAGE``); raises
        it once the reader's deadline has passed."""
        pause = self.pause(None)
        if pause is None:
            raise exc
        logger.info(
            "reading stream %r of run %s failed (%s); reading again", self.name, self.run_id, exc
        )
        return pause


class _Read:
    """One read in flight on an event loop, shared by the async readers that ask the
    same question (run, stream, after); ``started`` once its thread began it."""

    __slots__ = ("future", "started")

    def __init__(self) -> None:
        self.started = False


# The latest read of each (loop, run, stream, after) in flight.
_shared: dict[tuple, _Read] = {}


def _start_read(run_id: uuid.UUID, name: str, after: int, *, fresh: bool) -> asyncio.Future:
    """The read of the items after ``after`` (``_fetch``'s answer, as a future on this
    loop), shared with whoever asks the same until it is answered. ``fresh``: it
    must begin from now on (a NOTIFY came in: a read already under way may have begun
    before that write's commit), so a read not yet begun is joined, not one under way.
    """
    loop = asyncio.get_running_loop()
    key = (loop, run_id, name, after)
    shared = _shared.get(key)
    if shared is not None and not (fresh and shared.started):
        return shared.future
    read = _shared[key] = _Read()

    def begin() -> tuple[list[StreamItem], bool, bool]:
        read.started = True
        return _fetch(run_id, name, after)

    read.future = asyncio.ensure_future(_off_loop(begin))

    def done(_) -> None:
        if _shared.get(key) is read:
            del _shared[key]

    read.future.add_done_callback(done)
    return read.future


async def _shared_fetch(run_id: uuid.UUID, name: str, after: int):
    return await asyncio.shield(_start_read(run_id, name, after, fresh=False))


def _read_for_rung(key: tuple[str, str, int], waiters: list[Waiter]) -> None:
    """The listener rang these async readers of one stream, all to read after the same
    offset (``key``): one read for them all, begun now, and each is woken once it is
    answered, with its answer, rather than a thousand readers each waking to join one
    read and waking again when it is answered."""
    run, name, after = key
    read = _start_read(uuid.UUID(run), name, after, fresh=True)

    def answered(_) -> None:
        if not read.cancelled():
            read.exception()  # retrieved: each reader that takes it raises it itself
        for waiter in waiters:
            waiter.set((key, read))

    read.add_done_callback(answered)


def stream_ended(run_id: uuid.UUID, name: str, after: int) -> bool:
    """Is the stream ended (closed, or its run finished or gone) with no item after
    ``after``?"""
    position = store.stream_position(run_id, name)
    return position is None or (position.ended and position.items <= after + 1)


async def astream_ended(run_id: uuid.UUID, name: str, after: int) -> bool:
    """``stream_ended`` for async code (on a read thread)."""
    return await _off_loop(lambda: stream_ended(run_id, name, after))


def _exists(run_id: uuid.UUID, name: str) -> None:
    if store.stream_position(run_id, name) is None:
        raise Run.DoesNotExist(f"no run {run_id}")


def read_stream(
    run_id: uuid.UUID | str,
    name: str = "default",
    *,
    after: int | None = None,
    timeout: float | None = None,
) -> Iterator[StreamItem]:
    """The stream's items with an offset above ``after`` (None: from the first), oldest
    first, then each new one as it is written; it ends when the stream is closed (or
    its run finished) and every item was yielded, or after ``timeout`` seconds with no
    new item (0: what is there now; None: no limit). ``Run.DoesNotExist`` for an
    unknown run, at the call."""
    run_id, name, after, timeout = _checked(run_id, name, after, timeout)
    _exists(run_id, name)
    return _read(_Cursor(run_id, name, after, timeout))


def _read(cursor: _Cursor) -> Iterator[StreamItem]:
    active = listener() if cursor.timeout != 0 else None
    waiter = Waiter()
    if active is not None:
        active.add(cursor.run_id, cursor.name, waiter)
    try:
        while True:
            waiter.clear()
            try:
                items, ended = cursor.read()
            except OUTAGE as exc:
                if store.db().in_atomic_block:
                    raise  # the caller's transaction is lost with its connection
                store.db().close()
                waiter.event.wait(cursor.retry_after(exc))
                continue
            yield from items
            if ended:
                return
            if cursor.more:
                continue
            pause = cursor.pause(active)
            if pause is None:
                return
            _release_connection()
            waiter.event.wait(pause)
    finally:
        if active is not None:
            active.remove(cursor.run_id, cursor.name, waiter)


def _release_connection() -> None:
    """Give the thread's connection back while waiting, unless a transaction holds it."""
    connection = store.db()
    if connection.connection is not None and connection.get_autocommit():
        connection.close()


def _pooled(fn: Callable[[], T]) -> T:
    """Run ``fn`` on a read thread, on that thread's connection, kept from read to read
    whatever ``CONN_MAX_AGE`` says (a new connection per read would cost more than the
    read); a read that failed drops it, and the next one connects again."""
    try:
        return fn()
    except DatabaseError:
        store.db().close()
        raise


async def _off_loop(fn: Callable[[], T]) -> T:
    return await sync_to_async(_pooled, thread_sensitive=False, executor=_reads)(fn)


async def aread_stream(
    run_id: uuid.UUID | str,
    name: str = "default",
    *,
    after: int | None = None,
    timeout: float | None = None,
) -> AsyncIterator[StreamItem]:
    """``read_stream`` for async code: an async iterator that holds no thread and no
    database connection while it waits. ``Run.DoesNotExist`` at the first item."""
    run_id, name, after, timeout = _checked(run_id, name, after, timeout)
    await _off_loop(lambda: _exists(run_id, name))
    cursor = _Cursor(run_id, name, after, timeout)
    active = await _off_loop(listener) if timeout != 0 else None
    waiter = Waiter(asyncio.get_running_loop(), on_ring=_read_for_rung)
    run = str(run_id)  # in the waiter's key: a str hashes and compares in C, a UUID not
    waiter.key = (run, name, cursor.after)
    if active is not None:
        active.add(run_id, name, waiter)
    try:
        while True:
            # What was read for this reader when it was rung: a read begun after the
            # ring, used if it read after the offset this reader is at now (the ring
            # may have come while the reader was yielding an earlier answer).
            rung = waiter.fetched
            read = rung[1] if rung is not None and rung[0] == (run, name, cursor.after) else None
            waiter.clear()
            try:
                if read is not None:
                    fetched = read.result()
                else:
                    fetched = await _shared_fetch(run_id, name, cursor.after)
            except OUTAGE as exc:  # _pooled dropped the read thread's connection
                await waiter.wait(cursor.retry_after(exc))
                continue
            items, ended = cursor.take(fetched)
            for item in items:
                yield item
            if ended:
                return
            if cursor.more:
                continue
            pause = cursor.pause(active)
            if pause is None:
                return
            waiter.key = (run, name, cursor.after)
            await waiter.wait(pause)
    finally:
        waiter.close()
        if active is not None:
            active.remove(run_id, name, waiter)
