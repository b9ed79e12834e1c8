"""Chores every live worker does on its own thread, each heartbeat interval:

- return runs whose worker stopped heartbeating to ``pending`` (any live worker
  may do it; row locks with SKIP LOCKED keep two workers from recovering the
  same run, and the fence keeps the old worker from recording over the new one);
- move on runs waiting behind a key whose holder finished (a crash can leave one);
- fire due schedules;
- prune every ``DURABLE["PRUNE_INTERVAL"]`` when it is set.

On a thread of its own so that a slow prune never delays lease renewal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db import connections

from django_durable import conf, store, telemetry
from django_durable.operations import finish, prune, schedules
from django_durable.runtime.errors import is_connection_fault

if TYPE_CHECKING:
    from django_durable.runtime.worker import Worker

logger = logging.getLogger("django_durable.runtime.worker")

# Worker rows silent for this many leases are deleted (their runs were recovered long ago).
FORGET_AFTER_LEASES = 20


def recover() -> store.Recovery:
    """Recover runs of dead workers; finish those lost too often (MAX_RECOVERIES)."""
    recovery = store.recover_expired_leases(conf.get("MAX_RECOVERIES"))
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


class Maintenance:
    def __init__(self, worker: Worker):
        self.worker = worker
        self.prune_interval: timedelta | None = conf.get("PRUNE_INTERVAL")
        self._last_prune: float | None = None

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
        recovery = self._chore("recovering expired leases", recover)
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
            lambda: store.forget_dead_workers(
                store.now() - self.worker.lease * FORGET_AFTER_LEASES
            ),
        )
        if self._chore("firing schedules", schedules.fire_due):
            self.worker.wake()
        if self.prune_interval is not None and self._prune_due():
            pruned = self._chore("pruning", prune.prune)
            if pruned:
                logger.info("pruned %d finished run(s)", pruned)

    def _prune_due(self) -> bool:
        at = time.monotonic()
        if (
            self._last_prune is not None
            and at - self._last_prune < self.prune_interval.total_seconds()
        ):
            return False
        self._last_prune = at
        return True

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
