"""124 worker backends terminated (``pg_terminate_backend``) while 200 runs do real work.

A lost connection is the infrastructure's fault, not the step's: wherever it surfaces
(in the step's own statement, at the COMMIT of the step's own ``transaction.atomic()``,
while the outcome is recorded, in the heartbeat or the claim), the run is handed back
and runs again: handed back by its live worker, not counted against MAX_RECOVERIES.
Half the runs do their middle step inside ``transaction.atomic()``.
The test terminates only the workers' sessions, found by their ``application_name``.
"""

from __future__ import annotations

import random
import signal
import threading
import time

import pytest
from django.db import connection

import django_durable as durable
from django_durable.models import Run, Status, StepAttempt
from tests.testapp.models import Execution
from tests.worker_processes import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RUNS = 200
TERMINATIONS = 124
APPLICATION = "durable-terminated-backends"
# A terminated backend is not a lost worker: it never counts against MAX_RECOVERIES
# (tests/test_failover.py proves it with MAX_RECOVERIES=1). Only a claim whose reply
# was lost with its connection leaves a run to its lease; the limit is high so that
# such runs, hit several times by chance, never fail here.
MAX_RECOVERIES = 50

# The workers' sessions that are doing something: in a statement, or inside a
# transaction between statements (a step's own atomic() block).
BUSY_BACKENDS = """
    SELECT pid, state FROM pg_stat_activity
    WHERE application_name = %s AND datname = current_database()
      AND state IN ('active', 'idle in transaction') AND query NOT LIKE 'LISTEN%%'
"""


class Terminator(threading.Thread):
    """Terminates one busy worker backend at a time until it has done ``limit``."""

    def __init__(self, limit: int):
        super().__init__(daemon=True)
        self.limit = limit
        self.done = 0
        self.in_transaction = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        chance = random.Random(13)
        try:
            while self.done < self.limit and not self.stop.is_set():
                with connection.cursor() as cursor:
                    cursor.execute(BUSY_BACKENDS, [APPLICATION])
                    busy = cursor.fetchall()
                    if not busy:
                        time.sleep(0.005)
                        continue
                    pid, state = chance.choice(busy)
                    cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
                    if cursor.fetchone()[0]:
                        self.done += 1
                        self.in_transaction += state == "idle in transaction"
                self.stop.wait(0.02)
        except BaseException as exc:  # handed to the test
            self.error = exc
        finally:
            connection.close()


def test_200_runs_complete_while_124_worker_backends_are_terminated(workers):
    settings = {"lease_seconds": 3, "heartbeat_seconds": 0.5, "poll_seconds": 0.2}
    settings["max_recoveries"] = MAX_RECOVERIES
    env = {"DURABLE_TEST_APPLICATION_NAME": APPLICATION}
    procs = [workers.start("--concurrency", "4", extra_env=env, **settings) for _ in range(2)]
    for proc in procs:
        proc.wait_for_output("serves", timeout=60)
    run_ids = [
        durable.start("busy_steps", {"n": n, "atomic": n % 2 == 1, "rounds": 8})
        for n in range(RUNS)
    ]
    terminator = Terminator(TERMINATIONS)
    terminator.start()
    try:
        runs = Run.objects.filter(id__in=run_ids)

        def settled():
            assert terminator.error is None, terminator.error
            failed = runs.filter(status=Status.FAILED).first()
            assert failed is None, failed.error
            return runs.filter(status=Status.COMPLETED).count() == RUNS

        wait_until(settled, 180, f"{RUNS} completed runs", interval=0.2)
    finally:
        terminator.stop.set()
        terminator.join(30)
    assert terminator.done == TERMINATIONS, "the runs finished before every termination"

    assert runs.filter(status=Status.COMPLETED).count() == RUNS
    lost = StepAttempt.objects.filter(run_id__in=run_ids, status="lost")
    recoveries = sum(runs.values_list("recoveries", flat=True))
    in_atomic = lost.filter(step="save", run_id__in=run_ids[1::2]).count()
    print(
        f"\n{terminator.done} backends terminated ({terminator.in_transaction} inside a "
        f"transaction); {recoveries} recoveries, {lost.count()} lost attempts, {in_atomic} "
        f"of them in a step's own atomic(); {Execution.objects.count()} step executions "
        f"for {3 * RUNS} steps"
    )
    handed_back = lost.filter(error__type="ConnectionLost").count()
    assert handed_back > 0  # handed back by their live workers...
    assert recoveries == lost.filter(error__type="LeaseExpired").count()  # ...uncounted
    assert recoveries < handed_back
    assert in_atomic > 0  # terminated inside the step's own atomic(): handed back, not failed
    for proc in procs:
        proc.send(signal.SIGTERM)
    assert [proc.wait(60) for proc in procs] == [0, 0]
