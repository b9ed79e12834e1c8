"""Chores every live worker does on its own thread, each heartbeat interval:

- return runs whose worker stopped heartbeating to ``pending`` (any live worker
  may do it; row locks with SKIP LOCKED keep two workers from recovering the
  same run, and the fence keeps the old worker from recording over the new one),
  but not within a lease of the end of a database outage: leases that ran out
  during it are the outage's, and their live owners renew them or hand the runs
  back first;
- move on runs waiting behind a key whose holder finished (a crash can leave one);
- fire due schedules;
- prune every ``DURABLE["PRUNE_INTERVAL"]`` (an hour unless set; ``None`` turns it
  off) while a retention is set (``RUN_RETENTION``, ``ACTIVITY_RETENTION`` or a
  workflow's ``retention``): at the
  first round, then once per interval, on a thread of its own so that a long prune
  (the first one over a large table) never holds up recovery and schedules. Several
  workers prune one at a time (the store's advisory lock on PostgreSQL): one that
  finds another pruning stops at once.

On a thread of its own so that a slow chore never delays lease renewal.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import connections

from django_durable import conf, store, telemetry
from django_durable.operations import finish, prune, retention, schedules
from django_durable.runtime import compensation
from django_durable.runtime.errors import is_connection_fault

if TYPE_CHECKING:
    from django_durable.runtime.worker import Worker

logger = logging.getLogger("django_durable.runtime.worker")

RECOVERING = "recovering expired leases"
# Worker rows silent this long are deleted (their runs were recovered long ago); until
# then the Workers page shows them as stopped or gone.
FORGET_AFTER = store.WORKERS_KEPT


def recover() -> store.Recovery:
    """Recover runs of dead workers; finish those lost too often (MAX_RECOVERIES)."""
    recovery = store.recover_expired_leases(
        conf.get("MAX_RECOVERIES"), compensation_step=compensation.lost_step
    )
    telemetry.recovered(recovery.ids)
    for run in recovery.failed:
        logger.error(
            "run %s (%s) failed: %s",
            run.id,
            run.workflow,
            run.error["message"],
            extra=telemetry.log_fields(run),
        )
        finish.run_finished(run)
    return recovery


def prune_interval() -> timedelta | None:
    """How often a worker prunes: ``DURABLE["PRUNE_INTERVAL"]`` while a retention is
    set; None when it is set to None or nothing is kept for a limited time."""
    interval = conf.get("PRUNE_INTERVAL")
    if interval is None:
        return None
    if (
        conf.get("RUN_RETENTION") is None
        and conf.get("ACTIVITY_RETENTION") is None
        and not retention.limited()
    ):
        return None
    return interval


def describe_pruning() -> str:
    """The worker's start-up line says whether and how it prunes."""
    interval = prune_interval()
    if interval is None:
        why = "PRUNE_INTERVAL is None" if conf.get("PRUNE_INTERVAL") is None else "no retention"
        return f"no pruning ({why}; run durable_prune)"
    runs = conf.get("RUN_RETENTION")
    if runs is not None:
        kept = f"runs kept {_said(runs)}"
    elif retention.limited():
        kept = "runs kept as their workflows' retention says, others forever"
    else:
        kept = "runs kept forever"
    return f"pruning every {_said(interval)} ({kept})"


def _said(span: timedelta) -> str:
    """``30 days``, ``1 hour``, ``15 minutes``; anything else as ``timedelta`` says it."""
    seconds = span.total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return str(span)


class Maintenance:
    def __init__(self, worker: Worker):
        self.worker = worker
        self.prune_interval = prune_interval()
        # When this worker prunes next (None: at its first round), and the thread of
        # the prune under way (or the last one).
        self.next_prune_at: datetime | None = None
        self.pruning: threading.Thread | None = None

    def loop(self) -> None:
        try:
            while not self.worker.stopping:
                self.tick()
                if self.worker.wait_for_stop(self.worker.heartbeat_interval):
                    break
        finally:
            connections.close_all()

    def tick(self) -> None:
        """One round of chores; a failing chore is logged and does not stop the others."""
        self.worker.outage.refresh()
        recovery = None
        # After an outage every live worker renews its leases and hands back what it
        # lost at its first statements; the leases that ran out meanwhile are the
        # outage's, not lost workers': recover only once a lease has passed since.
        if not self.worker.outage.holds_back(RECOVERING, self.worker.lease.total_seconds()):
            recovery = self._chore(RECOVERING, recover)
        if recovery and recovery.resumed:
            recovered = recovery.resumed
            logger.warning(
                "recovered %d run(s) whose worker stopped heartbeating: %s",
                len(recovered),
                ", ".join(str(run_id) for run_id in recovered[:10]),
                extra={"run_ids": [str(run_id) for run_id in recovered]},
            )
            self.worker.wake()
            self._chore("announcing recovered runs", lambda: store.notify_runs_due(recovered))
        self._chore("moving on runs waiting behind finished holders", finish.sweep_waiting)
        self._chore(
            "forgetting dead workers",
            lambda: store.forget_dead_workers(store.now() - FORGET_AFTER),
        )
        if self._chore("firing schedules", schedules.fire_due):
            self.worker.wake()
        if self._prune_due():
            self.pruning = threading.Thread(target=self._prune, name="durable-prune", daemon=True)
            self.pruning.start()

    def _prune_due(self) -> bool:
        """Time to prune, and no prune of this worker still under way."""
        if self.prune_interval is None:
            return False
        if self.pruning is not None and self.pruning.is_alive():
            return False
        at = store.now()
        if self.next_prune_at is not None and at < self.next_prune_at:
            return False
        self.next_prune_at = at + self.prune_interval
        return True

    def _prune(self) -> None:
        try:
            pruned = self._chore("pruning", prune.prune)
            if pruned:
                logger.info("pruned %d finished run(s)", pruned)
        finally:
            connections.close_all()  # this thread's own

    def _chore(self, what: str, chore: Callable):
        try:
            result = chore()
        except Exception as exc:
            if is_connection_fault(exc):
                self.worker.outage.failed(what, exc)  # logged once per outage
            else:
                logger.exception("worker %s: %s failed", self.worker.worker_id, what)
                store.reset_connection_after_error()
            return None
        self.worker.outage.succeeded(what)
        return result
