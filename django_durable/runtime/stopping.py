"""How a worker stops on SIGTERM / SIGINT: the first signal stops it gracefully
(running steps may finish within ``DURABLE["SHUTDOWN_GRACE"]``, the rest is handed
back); a second one exits at once, leaving what it held to lease recovery.

A run is handed back only once its step has returned: a run given back while its
step still executes here could begin on another worker beside it, two steps of one
flow key under a limit of one. A step still running after the grace is asked to
stop (its next ``ctx.heartbeat()`` raises ``Cancelled``, an async step is
cancelled) and given ``STOP_AFTER_GRACE`` to do so; one that still executes then
stays this worker's, its lease renewed until the process exits (``leases``), and
comes back through the lease like a crashed worker's."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from django.db import DatabaseError

from django_durable import store, telemetry
from django_durable.runtime.handbacks import hand_back_quietly

if TYPE_CHECKING:
    from django_durable.runtime.worker import Worker

logger = logging.getLogger("django_durable.runtime.worker")

__all__ = ["STOP_AFTER_GRACE", "install_signal_handlers", "shut_down"]

# After the grace, how long the steps asked to stop have to return (seconds).
STOP_AFTER_GRACE = 1.0


def install_signal_handlers(worker: Worker) -> Callable[[], None] | None:
    """Stop ``worker`` on SIGTERM and SIGINT; returns what restores the previous
    handlers (None: not the main thread, where no handler can be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    received = 0

    def on_signal(signum: int, frame) -> None:
        nonlocal received
        received += 1
        if received > 1:
            # At once: what this worker holds comes back through lease recovery.
            os.write(2, b"durable_worker: second signal, exiting at once\n")
            os._exit(1)
        logger.info(
            "worker %s stopping (%s): running steps may finish within %.0fs, the rest is "
            "handed back; send the signal again to exit at once",
            worker.worker_id,
            signal.strsignal(signum),
            worker.shutdown_grace,
        )
        worker.stop()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def shut_down(worker: Worker) -> None:
    """Stop ``worker`` (its dispatcher calls it last): hand back what it has not
    started, let running steps end within the grace, ask the others to stop, write
    the recorder's last records and unregister."""
    worker.stop()
    for held in worker.take_unstarted():
        hand_back_quietly(held)
    deadline = time.monotonic() + worker.shutdown_grace
    if running := worker.wait_for_steps(0):
        logger.info(
            "worker %s: waiting up to %.0fs for %d running step(s)",
            worker.worker_id,
            worker.shutdown_grace,
            len(running),
        )
    # Each thread hands its run back once its step returned (Worker._outcome).
    if overdue := worker.wait_for_steps(worker.shutdown_grace):
        for held in overdue:
            held.run.lease_lost = True  # what ctx.heartbeat() and an async step look at
        overdue = worker.wait_for_steps(STOP_AFTER_GRACE, overdue)
    if worker.recorder:
        worker.recorder.stop()
        worker.recorder.wait_until_written(max(deadline - time.monotonic(), 5.0))
    for held in overdue:
        logger.warning(
            "run %s (%s) is still in its step after the grace period (%.0fs): not handed "
            "back while this process executes it; its lease brings it back once the "
            "process has exited (within LEASE, %.0fs)",
            held.run.id,
            held.run.workflow,
            worker.shutdown_grace,
            worker.lease.total_seconds(),
            extra=telemetry.log_fields(held.run),
        )
    try:
        store.unregister_worker(worker.worker_id)
    except DatabaseError as exc:
        logger.warning("could not unregister worker %s (%s)", worker.worker_id, exc)
