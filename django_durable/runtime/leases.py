"""A worker's heartbeat: renewing its leases, noticing the runs it lost, and saying
once (not once a second) when the database is out of reach.

Leases are renewed by the database's clock (``store.renew_leases``), so a
worker whose own clock is off keeps its runs for exactly the lease.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections

from django_durable import store, telemetry
from django_durable.models import Status
from django_durable.runtime.errors import is_connection_fault

if TYPE_CHECKING:
    from django_durable.runtime.worker import Worker

logger = logging.getLogger("django_durable.runtime.worker")


class Outage:
    """Logs the first failure of a database outage and the return, not every retry.

    Shared by a worker's threads: the dispatcher, the heartbeat, the maintenance, the
    execution threads. A restarted server ended every session, so a thread whose
    connection is older than the end of the last outage drops it before its next
    statement (``refresh``): learning it from a failed statement would report a second
    outage, or hand a run back for nothing."""

    def __init__(self, worker_id: str):
        self.worker_id = worker_id
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        self._unreachable: set[str] = set()  # those of ``_failing`` that lost the database
        self._ended = 0  # outages over so far
        self._began = 0  # outages begun so far (by a connection fault)
        # .ended, .began: the outages this thread caught up with
        self._local = threading.local()
        self.back_at: float | None = None  # time.monotonic() when the last outage ended

    def holds_back(self, what: str, seconds: float) -> bool:
        """Should ``what`` wait: something else lost the database (a connection fault;
        ``what`` is then no longer retried), or the last outage ended less than
        ``seconds`` ago? The maintenance asks it before recovering expired leases."""
        with self._lock:
            if self._unreachable - {what}:
                self._failing.discard(what)
                self._unreachable.discard(what)
                return True
        return self.back_at is not None and time.monotonic() - self.back_at < seconds

    def refresh(self) -> None:
        """Drop this thread's connections if an outage began or ended since it last
        looked: a session opened before a failover leads to the old primary."""
        began, self._local.began = getattr(self._local, "began", 0), self._began
        if self._caught_up() and began == self._began:
            return
        for connection in connections.all(initialized_only=True):
            if not connection.in_atomic_block:
                connection.close()  # the next statement reconnects

    def _caught_up(self) -> bool:
        seen = getattr(self._local, "ended", 0)
        self._local.ended = self._ended
        return seen == self._ended

    def failed(self, what: str, exc: BaseException) -> None:
        # A session from before the last outage's end failing is that outage, not a new one.
        stale = not self._caught_up()
        fault = is_connection_fault(exc)
        with self._lock:
            first = not self._failing and not stale
            if not stale:
                self._failing.add(what)
                if fault:
                    self._unreachable.add(what)
            if first and fault:
                self._began += 1
                self._local.began = self._began  # this thread drops its session below
        if first:
            logger.warning(
                "worker %s: the database is out of reach (%s failed: %s); "
                "retrying until it is back",
                self.worker_id,
                what,
                exc,
            )
        # A session on a standby still answers (read-only errors): only a new one
        # finds the primary.
        store.reset_connection_after_error(drop=fault)

    def succeeded(self, what: str) -> None:
        if not self._failing:
            return
        with self._lock:
            self._failing.discard(what)
            self._unreachable.discard(what)
            back = not self._failing
            if back:
                self._ended += 1
                self._local.ended = self._ended  # this thread's session is a new one
                self.back_at = time.monotonic()
        if back:
            logger.warning("worker %s: the database is back", self.worker_id)


def heartbeat_loop(worker: Worker, finished: threading.Event) -> None:
    """The heartbeat thread: ``worker.heartbeat()`` every heartbeat interval until
    ``finished``, and after it for as long as a step of the worker still executes
    (one that outlived the shutdown grace: its lease must outlive its execution, so
    that no other worker begins the run while it runs here; it ends with the
    process). A failure is reported once per outage (``worker.outage``)."""
    try:
        while not finished.wait(worker.heartbeat_interval) or worker.executing():
            try:
                worker.heartbeat()
            except DatabaseError as exc:
                worker.outage.failed("the heartbeat", exc)
            else:
                worker.outage.succeeded("the heartbeat")
                worker.return_lost_runs()
    finally:
        connections.close_all()


def renew(worker: Worker) -> set:
    """Renew ``worker``'s row and the leases of the runs it holds.

    A run it no longer owns (cancelled, recovered elsewhere) is flagged, so the
    step's next ``ctx.heartbeat()`` raises ``Cancelled`` without asking the
    database and no later step starts. Returns the ids of such runs.
    """
    holding = worker.held()
    worker.outage.refresh()
    store.worker_heartbeat(worker.worker_id, stopping=worker.stopping)
    lost = store.renew_leases(
        worker.worker_id, [(h.run.id, h.fence) for h in holding], worker.lease
    )
    for h in holding:
        if h.run.id not in lost or getattr(h.run, "lease_lost", False):
            continue
        h.run.lease_lost = True
        status, fence = lost[h.run.id] or ("deleted", None)
        if status == Status.CANCELLED:
            why = "was cancelled"
        elif fence != h.fence or status == "deleted":
            why = f"was taken over ({status})"
        else:
            continue  # it just finished or suspended: nothing to say
        logger.info(
            "run %s (%s) %s; its step stops at its next ctx.heartbeat() and no later step runs",
            h.run.id,
            h.run.workflow,
            why,
            extra=telemetry.log_fields(h.run),
        )
    return set(lost)
