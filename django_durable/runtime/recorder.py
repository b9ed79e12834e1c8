"""A worker's recorder: it writes the records of runs' completed last steps in
batches, so that the thread that ran a run goes on to its next one at once.

A thread that finishes a run's last step hands the record over
(``executor.execute(..., completions=...)``); the recorder writes whatever has
arrived since its last statement, up to ``DURABLE["COMPLETION_BATCH"]`` runs, in
one statement and one commit (``executor.record_last_steps``), then finishes each
run (``finish.run_finished``) and tells the worker (``after``). An idle worker's
record goes at once and alone; under load a batch holds what arrived while the
previous one was being written.

Until its batch commits, a run is still running under this worker's lease (the
heartbeat renews it: ``held``). A worker killed before the commit leaves its last
step to run again after recovery, as a worker killed between a step's end and its
record always has; nothing of the run is announced before the commit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from django_durable import store
from django_durable.runtime import executor
from django_durable.runtime.errors import is_connection_fault

logger = logging.getLogger("django_durable.runtime.recorder")

__all__ = ["Recorder"]


class Recorder:
    """Batches of completed last steps, written by one thread (``loop``)."""

    def __init__(self, batch: int):
        self.batch = batch
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        # (what the worker holds, the last step, what the worker does once it is written)
        self._waiting: list[tuple[Any, executor.LastStep, Callable[[], None]]] = []
        self._writing: list[tuple[Any, executor.LastStep, Callable[[], None]]] = []
        self._stopping = False

    def add(self, held: Any, last: executor.LastStep, after: Callable[[], None]) -> None:
        with self._lock:
            self._waiting.append((held, last, after))
            self._changed.notify_all()

    def held(self) -> list[Any]:
        """What the worker still holds here: runs whose record is not written yet."""
        with self._lock:
            return [held for held, _last, _after in (*self._writing, *self._waiting)]

    def pending(self) -> int:
        with self._lock:
            return len(self._waiting) + len(self._writing)

    def stop(self) -> None:
        """Write what is waiting, then end ``loop``."""
        with self._lock:
            self._stopping = True
            self._changed.notify_all()

    def wait_until_written(self, timeout: float) -> bool:
        """Wait until nothing is waiting or being written; False at ``timeout``."""
        with self._lock:
            return self._changed.wait_for(lambda: not self._waiting and not self._writing, timeout)

    def loop(self) -> None:
        try:
            while True:
                with self._lock:
                    self._changed.wait_for(lambda: self._waiting or self._stopping)
                    if not self._waiting:
                        return
                    self._writing = self._waiting[: self.batch]
                    del self._waiting[: self.batch]
                    batch = self._writing
                self._write([last for _held, last, _after in batch])
                for _held, _last, after in batch:
                    try:
                        after()
                    except Exception:
                        logger.exception("the worker's bookkeeping after a record failed")
                with self._lock:
                    self._writing = []
                    self._changed.notify_all()
        finally:
            connections.close_all()

    def _write(self, last_steps: list[executor.LastStep]) -> None:
        try:
            executor.record_last_steps(last_steps)
        except Exception as exc:
            # What record_last_step(s) did not handle (the database is out of reach):
            # the runs are still this worker's; ``after`` hands them back.
            if is_connection_fault(exc):
                logger.warning(
                    "recording %d completed run(s) failed (the database connection was lost: %s)",
                    len(last_steps),
                    exc,
                )
                store.reset_connection_after_error(drop=True)
                return
            logger.exception("recording %d completed run(s) failed", len(last_steps))
            store.reset_connection_after_error()
