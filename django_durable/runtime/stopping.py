"""How a worker stops on SIGTERM / SIGINT: the first signal stops it gracefully
(running steps may finish within ``DURABLE["SHUTDOWN_GRACE"]``, the rest is handed
back); a second one exits at once, leaving what it held to lease recovery."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_durable.runtime.worker import Worker

logger = logging.getLogger("django_durable.runtime.worker")

__all__ = ["install_signal_handlers"]


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
