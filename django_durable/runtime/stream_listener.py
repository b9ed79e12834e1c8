"""One LISTEN connection per process wakes every waiting stream reader (docs/streams.md).

A write to a stream sends ``NOTIFY <NOTIFY_CHANNEL>_streams, '<run id>:<name>'`` at its
commit; a finish of a run that wrote streams sends ``'<run id>'`` (every stream of the
run ended). The process's one ``StreamListener`` (a ``Notifier``: the same LISTEN
connection, reconnection and self-check as the worker's, on the streams' channel)
wakes the readers waiting for that stream: a ``threading.Event`` for a sync reader, an
``asyncio.Event`` set on its own loop for an async one. A waiting reader holds no
database connection and no thread of its own (async); the NOTIFY carries no item:
the woken reader reads what it has not seen, so nothing depends on a NOTIFY arriving.

Readers wait with a deadline whatever happens here: ``recheck_after()`` is
``POLL_INTERVAL`` until the listener's own check NOTIFY arrived (and always on
SQLite: no LISTEN), ``RECHECK`` once it did.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from django.db import connections

from django_durable import conf, store
from django_durable.runtime.notifier import CHECK_PREFIX, Notifier

__all__ = ["RECHECK", "Waiter", "listener", "recheck_after", "stop_listener"]

# How long a reader waits without a NOTIFY before it looks again, while the listener
# works: what a lost NOTIFY (a reconnect) or an ended stream without one costs at most.
RECHECK = 5.0


class Waiter:
    """One reader's doorbell: registered for a (run, stream), rung by the listener. A
    sync reader's is a ``threading.Event``; an async reader's lives on its loop: a
    flag and, while the reader waits, one future (no task per wait: a thousand readers
    of a stream woken by each write would make a thousand).

    An async reader may give ``on_ring``: the async waiters of a loop rung together
    with the same ``key`` (what they read next) are handed to
    ``on_ring(key, waiters)``, which sets them (``set``) when it likes, with what it
    read for them and for which key (``runtime.stream_reader``: one read for all,
    before they wake)."""

    __slots__ = (
        "loop", "event", "_rung", "_future", "key", "on_ring", "fetched",
        "_deadline", "_timer", "_timer_at",
    )  # fmt: skip

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop | None = None,
        on_ring: Callable[[Any, list[Waiter]], None] | None = None,
    ):
        self.loop = loop
        self.event: threading.Event | None = threading.Event() if loop is None else None
        self._rung = False
        self._future: asyncio.Future | None = None
        self.key: Any = None
        self.on_ring = on_ring
        self.fetched: Any = None
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0

    def clear(self) -> None:
        if self.event is not None:
            self.event.clear()
        else:
            self._rung = False
            self.fetched = None

    def set(self, fetched: Any = None) -> None:
        """Ring an async waiter (on its loop), with what was read for it, if anything."""
        self._rung = True
        self.fetched = fetched
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    async def wait(self, timeout: float | None) -> None:
        """Until rung (now, if it was since ``clear``) or ``timeout`` seconds passed
        (async waiters)."""
        if self._rung:
            return
        loop = self.loop
        self._deadline = None if timeout is None else loop.time() + timeout
        # The timer of an earlier wait is kept while it is due no later than this
        # deadline (when it fires early, it sets itself again for the deadline): a
        # reader woken at each write arms no new timer each time (a thousand readers
        # would push and cancel a thousand heap entries per write).
        if self._deadline is not None and (self._timer is None or self._timer_at > self._deadline):
            self._arm(self._deadline)
        future = self._future = loop.create_future()
        try:
            await future
        finally:
            self._future = None

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = self.loop.call_at(at, self._expire)

    def _expire(self) -> None:
        self._timer = None
        future, deadline = self._future, self._deadline
        if future is None or future.done() or deadline is None:
            return  # not waiting: the next wait arms a timer
        if self.loop.time() + 0.001 < deadline:
            self._arm(deadline)  # armed by an earlier wait: not due yet
        else:
            future.set_result(None)

    def close(self) -> None:
        """The reader is done: drop its timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def ring(waiters: list[Waiter]) -> None:
    """Ring ``waiters``: a sync reader's event at once, the async readers of each event
    loop together, in one callback on that loop (one wake-up of the loop for a
    thousand readers of a stream, not one each)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Waiter]] = {}
    for waiter in waiters:
        if waiter.loop is None:
            waiter.event.set()
        else:
            by_loop.setdefault(waiter.loop, []).append(waiter)
    for loop, rung in by_loop.items():
        # A closed loop (RuntimeError): its readers are gone.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_set_all, rung)


def _set_all(waiters: list[Waiter]) -> None:
    groups: dict[tuple, list[Waiter]] = {}
    for waiter in waiters:
        if waiter.on_ring is None:
            waiter.set()
        else:
            groups.setdefault((waiter.on_ring, waiter.key), []).append(waiter)
    for (on_ring, key), rung in groups.items():
        on_ring(key, rung)


class StreamListener(Notifier):
    """The process's LISTEN on the streams' channel, dispatching to waiters."""

    def __init__(self, alias: str):
        super().__init__(
            channel=store.stream_channel(),
            queues=None,
            on_wake=self.ring_all,
            stop=threading.Event(),
            alias=alias,
        )
        self.name = "durable-stream-listener"
        self._lock = threading.Lock()
        self._waiters: dict[str, dict[str, set[Waiter]]] = defaultdict(lambda: defaultdict(set))

    def add(self, run_id: uuid.UUID, name: str, waiter: Waiter) -> None:
        with self._lock:
            self._waiters[str(run_id)][name].add(waiter)

    def remove(self, run_id: uuid.UUID, name: str, waiter: Waiter) -> None:
        with self._lock:
            streams = self._waiters.get(str(run_id))
            if streams is None:
                return
            waiters = streams.get(name)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del streams[name]
            if not streams:
                del self._waiters[str(run_id)]

    def waiting(self) -> int:
        with self._lock:
            return sum(len(w) for streams in self._waiters.values() for w in streams.values())

    def send_check(self, payload: str) -> None:
        # The check goes on the streams' channel, as a write's NOTIFY does.
        try:
            store.notify_streams(payload)
        finally:
            connections.close_all()

    def concerns(self, payload: str) -> bool:
        if not payload.startswith(CHECK_PREFIX):
            run_id, _, name = payload.partition(":")
            with self._lock:
                streams = self._waiters.get(run_id)
                if streams is None:
                    return False
                if name:
                    rung = list(streams.get(name, ()))
                else:  # the run finished: each of its streams ended
                    rung = [waiter for waiters in streams.values() for waiter in waiters]
            ring(rung)
        return False  # nothing for Notifier.on_wake: the waiters were rung here

    def ring_all(self) -> None:
        """(Re)connected: a NOTIFY may have been missed meanwhile; every reader looks."""
        with self._lock:
            rung = [w for streams in self._waiters.values() for ws in streams.values() for w in ws]
        ring(rung)


_listener: StreamListener | None = None
_starting = threading.Lock()


def listener() -> StreamListener | None:
    """The process's listener, started at the first reader that waits; None where
    nobody listens (SQLite, or ``DURABLE["LISTEN_DATABASE"]`` None): readers poll."""
    global _listener
    alias = conf.get("LISTEN_DATABASE")
    if alias is None or not store.engine(connections[alias]).LISTENS:
        return None
    with _starting:
        if _listener is None or not _listener.is_alive():
            _listener = StreamListener(alias)
            _listener.start()
        return _listener


def stop_listener(timeout: float = 5.0) -> None:
    """Stop the process's listener and close its connection (the next waiting reader
    starts another): for tests, and a process that drops its database."""
    global _listener
    with _starting:
        stopping, _listener = _listener, None
    if stopping is not None:
        stopping.stop.set()
        stopping.join(timeout)


def recheck_after(active: StreamListener | None) -> float:
    """How long a reader waits before it looks again without a NOTIFY."""
    poll = conf.get("POLL_INTERVAL").total_seconds()
    if active is not None and active.verified and active.listening.is_set():
        return max(RECHECK, poll)
    return poll
