"""An idle ``durable_worker`` process stops at once on SIGTERM: Django's Tasks
framework's ``test_interrupt_no_tasks`` gives its ``db_worker`` 0.5 s. Nothing the
worker waits on when idle (the poll interval, the LISTEN's wait, the heartbeat and
maintenance intervals) may hold it up, nor the interpreter's exit."""

import re
import signal
import time

import pytest
from django.db import connection

from tests.worker_processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Django's Tasks framework gives an idle worker this long to exit after a signal.
EXIT_WITHIN = 0.5


def ready_line() -> str:
    """The last line an idle worker prints: on PostgreSQL, its LISTEN's check arrived."""
    return "listening for NOTIFY" if connection.vendor == "postgresql" else " serves "


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_idle_worker_exits_within_half_a_second_of_a_signal(workers, sig):
    exits = []
    for n in range(3):
        # Long intervals: a stop that waited for any of them would take seconds.
        worker = workers.start(
            "--worker-id", f"idle{n}", poll_seconds=10, heartbeat_seconds=10, lease_seconds=30
        )
        worker.wait_for_output(ready_line(), timeout=60)
        time.sleep(0.2)  # idle: in its waits
        sent = time.monotonic()
        worker.send(sig)
        wait_until(lambda w=worker: w.proc.poll() is not None, 10, "the exit", interval=0.002)
        exits.append(time.monotonic() - sent)
        assert worker.proc.returncode == 0, worker.output()
        # Its own account: the stop took a few milliseconds of the process's exit.
        took = re.search(r"stopped \(0 runs executed\), ([0-9.]+)s after", worker.output())
        assert took and float(took[1]) < EXIT_WITHIN / 2, worker.output()
    print(f"exits after {signal.Signals(sig).name}: {', '.join(f'{s:.3f}s' for s in exits)}")
    assert max(exits) < EXIT_WITHIN, exits
