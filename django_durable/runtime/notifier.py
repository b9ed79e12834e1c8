"""Wakes idle workers when a run becomes due, with PostgreSQL LISTEN/NOTIFY.

``store.notify_due`` sends ``NOTIFY <channel>, '<queue>'`` inside the
transaction that made a run due, so it goes out when that transaction commits.
The notifier listens on a dedicated connection and calls ``on_wake`` for the
queues its worker serves. It is only an optimisation: the worker polls at
``DURABLE["POLL_INTERVAL"]`` whatever happens here, so a lost connection costs
latency, never a run.

A LISTEN that succeeds proves nothing: through a pooler in transaction mode
the LISTEN lands on a server session the pooler hands to other clients, and
nothing ever arrives, without an error. So once it listens, the notifier sends
itself a NOTIFY the way any producer does (``store.notify_due`` on Django's
connection) and says "listening" only when that one arrives. When it does not
arrive within ``verify_timeout`` seconds it logs a warning naming
``DURABLE["LISTEN_DATABASE"]`` and the worker goes on polling; ``verified``
tells which happened (``doctor`` and the tests read it).

A stopping worker must not wait for the LISTEN's next slice: the notifier waits with
``select`` on the LISTEN's socket and on a socket of its own that ``interrupt()``
writes to, so it ends as soon as the worker stops.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from django.db import connections

from django_durable import conf, store

logger = logging.getLogger("django_durable.runtime.worker")

# How long one wait for notifications lasts before the stop flag is looked at.
LISTEN_SLICE = 0.5
MAX_RECONNECT_DELAY = 30.0
# How long the notifier waits for its own check NOTIFY before it warns.
VERIFY_TIMEOUT = 5.0
# Payloads of check NOTIFYs start with this; no worker wakes for them.
CHECK_PREFIX = "django_durable.listen-check:"


def send_check(payload: str) -> None:
    """NOTIFY ``payload`` on the channel as a producer would, then give the connection back
    (the notifier thread has no other use for one of Django's connections)."""
    try:
        store.notify_due(payload)
    finally:
        connections.close_all()


def listen_works(
    *, alias: str | None = None, channel: str | None = None, timeout: float = VERIFY_TIMEOUT
) -> bool:
    """True when a NOTIFY sent through Django's connection reaches a LISTEN on ``alias``
    (default ``DURABLE["LISTEN_DATABASE"]``) within ``timeout`` seconds."""
    alias = alias or conf.get("LISTEN_DATABASE")
    channel = channel or conf.get("NOTIFY_CHANNEL")
    payload = f"{CHECK_PREFIX}{uuid.uuid4().hex}"
    listener = store.open_listener(channel, alias)
    try:
        send_check(payload)
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            for notice in listener.notifies(timeout=min(remaining, LISTEN_SLICE)):
                if notice.payload == payload:
                    return True
        return False
    finally:
        listener.close()


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
        verify_timeout: float = VERIFY_TIMEOUT,
    ):
        super().__init__(name="durable-notifier", daemon=True)
        self.channel = channel
        self.queues = set(queues) if queues else None
        self.on_wake = on_wake
        self.stop = stop
        self.alias = alias
        self.verify_timeout = verify_timeout
        # Set while a LISTEN is in place, delivering or not.
        self.listening = threading.Event()
        # None until known; True once this notifier's own NOTIFY arrived through its
        # LISTEN, False when it did not arrive within verify_timeout.
        self.verified: bool | None = None
        # Set as soon as ``verified`` is True or False.
        self.checked = threading.Event()
        # While ``run`` runs: ``interrupt()`` writes to ``_waker``; a wait for
        # notifications also watches ``_woken``.
        self._woken: socket.socket | None = None
        self._waker: socket.socket | None = None

    def interrupt(self) -> None:
        """End the current wait for notifications now (the worker is stopping: the
        stop flag is set first). Safe in a signal handler: one non-blocking send."""
        waker = self._waker
        if waker is None:
            return  # not running yet: it looks at the stop flag before it waits
        # OSError: the buffer is full (a wake-up is pending anyway) or it is closed.
        with contextlib.suppress(OSError):
            waker.send(b"\0")

    def run(self) -> None:
        self._woken, self._waker = socket.socketpair()
        self._woken.setblocking(False)
        self._waker.setblocking(False)
        try:
            self._run()
        finally:
            self._woken.close()
            self._waker.close()

    def _run(self) -> None:
        delay = 1.0
        warned = False  # a WARNING once per outage; the retries that follow are INFO
        while not self.stop.is_set():
            try:
                listener = store.open_listener(self.channel, self.alias)
            except Exception as exc:  # any failure: poll meanwhile, retry later
                log = logger.info if warned else logger.warning
                log("LISTEN failed (%s); polling only, retrying in %.0fs", exc, delay)
                warned = True
                self.stop.wait(delay)
                delay = min(delay * 2, MAX_RECONNECT_DELAY)
                continue
            warned = False
            try:
                self._listen(listener)
            except Exception as exc:
                logger.warning(
                    "the LISTEN connection or its check failed (%s); polling only, "
                    "reconnecting in %.0fs",
                    exc,
                    delay,
                )
                warned = True
            finally:
                self.listening.clear()
                listener.close()
            self.stop.wait(delay)
            delay = 1.0 if self.verified else min(delay * 2, MAX_RECONNECT_DELAY)

    def _listen(self, listener) -> None:
        self.listening.set()
        check = f"{CHECK_PREFIX}{uuid.uuid4().hex}"
        sent = time.monotonic()
        self.send_check(check)
        pending, warned = True, False  # our check has not arrived; nobody was told yet
        # A run may have become due while nobody listened: look once now.
        self.on_wake()
        while not self.stop.is_set():
            for notice in self._notices(listener):
                if notice.payload == check:
                    pending = False
                    self._arrived(time.monotonic() - sent, late=warned)
                elif self.concerns(notice.payload):
                    self.on_wake()
                if self.stop.is_set():
                    return
            if pending and not warned and time.monotonic() - sent > self.verify_timeout:
                warned = True
                self._missing()

    def _notices(self, listener) -> list:
        """The notifications that arrive within ``LISTEN_SLICE`` seconds; none, at
        once, when ``interrupt()`` is called."""
        readable, _, _ = select.select([listener.fileno(), self._woken], [], [], LISTEN_SLICE)
        if self._woken in readable:
            with contextlib.suppress(BlockingIOError):
                while self._woken.recv(64):
                    pass
            if self.stop.is_set():
                return []
        # Also after a timeout: what arrived during the LISTEN itself waits in psycopg.
        return list(listener.notifies(timeout=0))

    def send_check(self, payload: str) -> None:
        """Send this notifier's own check NOTIFY (on the workers' channel)."""
        send_check(payload)

    def concerns(self, payload: str) -> bool:
        """Does a NOTIFY with this payload call for a claim? (Another worker's check does not.)"""
        if payload.startswith(CHECK_PREFIX):
            return False
        return self.queues is None or payload in self.queues

    def _arrived(self, seconds: float, *, late: bool) -> None:
        self.verified = True
        self.checked.set()
        logger.info(
            "listening for NOTIFY on channel %r through DATABASES[%r]: its check arrived "
            "in %.0f ms%s",
            self.channel,
            self.alias,
            seconds * 1000,
            " (late: until now the worker only polled)" if late else "",
        )

    def _missing(self) -> None:
        self.verified = False
        self.checked.set()
        logger.warning(
            "LISTEN on channel %r through DATABASES[%r] (DURABLE['LISTEN_DATABASE']) "
            "received no NOTIFY within %.0fs of its own check: the worker polls every "
            "POLL_INTERVAL instead. A LISTEN through a pooler in transaction mode (PgBouncer's "
            "default on many hosts) never delivers; point DURABLE['LISTEN_DATABASE'] at an "
            "alias that reaches PostgreSQL directly or through a session-mode pooler.",
            self.channel,
            self.alias,
            self.verify_timeout,
        )
