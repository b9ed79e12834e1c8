"""A worker that stops after executing a number of runs (``durable_worker --max-tasks``,
the counterpart of the Tasks framework's ``db_worker --max-tasks``)."""

from __future__ import annotations

import logging

from django_durable.runtime.worker import Held, Worker

logger = logging.getLogger("django_durable.runtime.worker")

__all__ = ["LimitedWorker"]


class LimitedWorker(Worker):
    """Claims at most ``max_runs`` runs in all, and stops once it executed them (a run
    that suspends in a wait counts: its execution ended). Exit code 0, as a stop on
    SIGTERM."""

    def __init__(self, *, max_runs: int, **options) -> None:
        if max_runs < 1:
            raise ValueError(f"max_runs must be at least 1, got {max_runs}")
        super().__init__(**options)
        self.max_runs = max_runs
        self._ended = 0  # executions over (runs_executed counts them a moment later)

    def _claimable(self) -> int:
        # Called with the lock held: never more claimed than there are runs left.
        left = self.max_runs - self._ended - len(self._ready) - len(self._executing)
        return min(super()._claimable(), left)

    def execute(self, held: Held) -> None:
        try:
            super().execute(held)
        finally:
            with self._lock:
                self._ended += 1
                reached = self._ended >= self.max_runs
            if reached and not self.stopping:
                logger.info("worker %s: %d runs executed, stopping", self.worker_id, self.max_runs)
                self.stop()
