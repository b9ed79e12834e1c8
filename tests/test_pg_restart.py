"""PostgreSQL restarted twice while 3 worker processes run 200 keyed 3-step runs.

The cluster is the test's own (tests/own_cluster.py), never the shared server. Each
step adds an ``Execution`` row as its effect, so the test counts how often each step
ran: a step may run again when the connection went away before its outcome was
recorded (at-least-once per step); every such repeat must come with a ``lost``
attempt of that step, and none may run more than twice.
"""

from __future__ import annotations

import time

import pytest

from tests import own_cluster
from tests.worker_processes import WorkerProcess, wait_until

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),  # the test's own connection to its cluster
    pytest.mark.skipif(not own_cluster.available(), reason="pg_createcluster is not installed"),
]

RUNS = 200
WORKERS = 3
OUT_OF_REACH = "the database is out of reach"
BACK = "the database is back"
EXECUTIONS = "SELECT count(*) FROM testapp_execution"
COMPLETED = "SELECT count(*) FROM durable_run WHERE status = 'completed'"


@pytest.fixture
def cluster():
    with own_cluster.own_cluster("restart") as pg:
        yield pg


def test_two_restarts_under_load_lose_nothing_and_fail_nothing(cluster, tmp_path):
    began = time.monotonic()
    env = cluster.env(
        DURABLE_LEASE_SECONDS="5", DURABLE_HEARTBEAT_SECONDS="1", DURABLE_POLL_SECONDS="0.2"
    )
    workers = [
        WorkerProcess(
            ["--worker-id", f"restart-{n}", "--concurrency", "4"], env, tmp_path / f"w{n}.log"
        )
        for n in range(WORKERS)
    ]
    try:
        for worker in workers:
            worker.wait_for_output("serves", timeout=60)
        print(f"\nworkers up after {time.monotonic() - began:.1f}s")
        started = cluster.probe("start", "--runs", str(RUNS), "--pause", "0.1")
        assert started == {"started": RUNS, "errors": []}

        # Restart while steps are in flight: a quarter of the way, and past half way.
        for restart, executed in enumerate((150, 330), start=1):
            wait_until(
                lambda e=executed: (cluster.scalar(EXECUTIONS) or 0) >= e,
                120,
                f"{executed} step executions before restart {restart}",
            )
            assert (cluster.scalar(COMPLETED) or 0) < RUNS, "the runs finished too soon"
            cluster.restart()
            print(f"restart {restart} after {time.monotonic() - began:.1f}s")

        wait_until(lambda: cluster.scalar(COMPLETED) == RUNS, 120, "every run completed", 0.2)
        print(f"all completed after {time.monotonic() - began:.1f}s")
        report = cluster.probe("report")
    finally:
        for worker in workers:
            worker.send(15)
        codes = [worker.wait(60) for worker in workers]

    assert codes == [0] * WORKERS
    assert report["runs"] == RUNS and report["keys"] == RUNS  # 0 lost
    assert report["statuses"] == {"completed": RUNS}, report["failed_errors"]  # 0 failed
    assert report["holders_per_key"] == [1] and report["keys_held"] == RUNS
    assert report["steps_executed"] == 3 * RUNS
    # At-least-once per step: every repeat is an execution whose outcome was lost with
    # the connection (a "lost" attempt of that step). A step runs twice when one
    # restart took its outcome; three times only when each restart took one (a slow
    # re-execution on a loaded machine can straddle the second restart).
    for repeat in report["repeats"]:
        assert 1 <= repeat["lost_attempts"] <= 2, repeat
        assert repeat["executions"] <= repeat["lost_attempts"] + 1, repeat
    repeated = sum(r["executions"] - 1 for r in report["repeats"])
    print(
        f"\n{report['executions']} step executions for {3 * RUNS} steps: {repeated} repeated "
        f"(each after its outcome was lost with the connection); {report['recoveries']} "
        f"recoveries, {report['lost_attempts']} lost attempts"
    )
    for worker in workers:
        log = worker.output()
        # Each worker said once per outage that the database was gone, and that it was back.
        assert log.count(OUT_OF_REACH) == 2, log
        assert log.count(BACK) == 2, log
