"""Wakes idle workers when a run becomes due, with PostgreSQL LISTEN/NOTIFY.

``store.notify_due`` sends ``NOTIFY <channel>, '<queue>'`` inside the
transaction that made a run due, so it goes out when that transaction commits.
The notifier listens on a dedicated connection and calls ``on_wake`` for the
queues its worker serves. It is only an optimisation: the worker polls at
``DURABLE["POLL_INTERVAL"]`` whatever happens here, so a lost connection costs
latency, never a run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from django_durable import store

logger = logging.getLogger("django_durable.runtime.worker")

# How long one wait for notifications lasts before the stop flag is looked at.
LISTEN_SLICE = 0.5
MAX_RECONNECT_DELAY = 30.0


class Notifier(threading.Thread):
    """A daemon thread that LISTENs and calls ``on_wake`` for each relevant NOTIFY."""

    def __init__(
        self,
        *,
        channel: str,
        queues: Sequence[str] | None,
        on_wake: Callable[[], None],
        stop: threading.Event,
        alias: str = "default",
    ):
        super().__init__(name="durable-notifier", daemon=True)
        self.channel = channel
        self.queues = set(queues) if queues else None
        self.on_wake = on_wake
        self.stop = stop
        self.alias = alias
        # Set while a LISTEN is in place (tests and logs use it).
        self.listening = threading.Event()

    def run(self) -> None:
        delay = 1.0
        while not self.stop.is_set():
            try:
                listener = store.open_listener(self.channel, self.alias)
            except Exception as exc:  # any failure: poll meanwhile, retry later
                logger.warning("LISTEN failed (%s); polling only, retrying in %.0fs", exc, delay)
                self.stop.wait(delay)
                delay = min(delay * 2, MAX_RECONNECT_DELAY)
                continue
            delay = 1.0
            try:
                self._listen(listener)
            except Exception as exc:
                logger.warning("the LISTEN connection failed (%s); reconnecting", exc)
            finally:
                self.listening.clear()
                listener.close()

    def _listen(self, listener) -> None:
        self.listening.set()
        logger.info("listening for NOTIFY on channel %r", self.channel)
        # A run may have become due while nobody listened: look once now.
        self.on_wake()
        while not self.stop.is_set():
            for notice in listener.notifies(timeout=LISTEN_SLICE):
                if self.queues is None or notice.payload in self.queues:
                    self.on_wake()
                if self.stop.is_set():
                    return
