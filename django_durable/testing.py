"""Helpers for tests of projects that use django-durable."""

from __future__ import annotations

import os
import threading
import time

from django_durable import conf, store
from django_durable.operations import finish as lifecycle
from django_durable.runtime import executor


def drain(max_seconds: float = 10, queues: list[str] | None = None) -> int:
    """Run, in this process, everything that is due now until nothing is due.

    Timers in the future (sleeps, backoff, debounce periods) are not waited for.
    Returns how many steps ran. Stops after ``max_seconds`` even if work remains.
    """
    deadline = time.monotonic() + max_seconds
    worker_id = f"drain-{os.getpid()}-{threading.get_ident()}"
    lease = conf.get("LEASE")
    steps = 0
    while time.monotonic() < deadline:
        lifecycle.sweep_waiting()
        runs = store.claim(worker_id=worker_id, queues=queues, limit=1, lease=lease)
        if not runs:
            break
        for run in runs:
            steps += executor.execute(run)
    return steps
