"""Failover without a stall: a primary stopped hard under keyed load and its
synchronous standby promoted (tests/standby_pair.py); a session on a read-only
server; a worker's backend terminated again and again inside one run's step.

A lost connection, or one that landed on a server that refuses writes (SQLSTATE
25006), is a connection fault everywhere: the worker reconnects, retries its claim
and hands the run back as soon as the database answers, never at its lease's expiry,
and never counts it as a lost worker (``MAX_RECOVERIES``). Its log says once per
outage that the database is out of reach and once that it is back, with no ERROR.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from django.db import DatabaseError, connection, connections, transaction

import django_durable as durable
from django_durable.models import Run, Status, StepAttempt
from django_durable.runtime.errors import is_connection_fault
from django_durable.runtime.leases import Outage
from django_durable.runtime.maintenance import RECOVERING
from django_durable.testing import drain
from tests import own_cluster, standby_pair
from tests.worker_processes import ROOT, WorkerProcess, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

OUT_OF_REACH = "the database is out of reach"
BACK = "the database is back"
EXECUTIONS = "SELECT count(*) FROM testapp_execution"
COMPLETED = "SELECT count(*) FROM durable_run WHERE status = 'completed'"
# The default lease: a run that waited for it would be recovered by a lease's expiry,
# and with MAX_RECOVERIES = 0 it would fail.
LEASE_SECONDS = 30


def quiet(log: str) -> None:
    """No ERROR, no traceback, no run left to its lease in a worker's log."""
    for bad in (" ERROR ", "Traceback", "left to lease expiry", "stopped heartbeating"):
        assert bad not in log, f"{bad!r} in the worker's log:\n{log}"


# --- what a connection fault is ---------------------------------------------------


def raised(sql: str, using=None) -> DatabaseError:
    try:
        with (using or connection).cursor() as cursor:
            cursor.execute(sql)
    except DatabaseError as exc:
        return exc
    raise AssertionError(f"{sql} raised nothing")


def test_a_read_only_error_is_a_connection_fault_and_a_steps_own_error_is_not():
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION READ ONLY")
        read_only = raised("CREATE TEMPORARY TABLE t (n int)")
        assert read_only.__cause__.sqlstate == "25006"
        assert "read-only transaction" in str(read_only)
        assert is_connection_fault(read_only)
        transaction.set_rollback(True)
    assert not is_connection_fault(raised("SELECT 1 / 0"))
    assert not is_connection_fault(raised("SELECT * FROM no_such_table"))
    assert not is_connection_fault(raised("SELECT 'x'::int"))


def test_a_terminated_session_and_a_closed_connection_are_connection_faults():
    assert is_connection_fault(terminated_session_error())  # 57P01, or the closed socket
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT 1")
        other.connection.close()
        assert is_connection_fault(raised("SELECT 1", other))  # the connection is closed
    finally:
        other.close()


def terminated_session_error() -> DatabaseError:
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        return raised("SELECT 1", other)
    finally:
        other.close()


def test_recovery_waits_while_the_database_is_unreachable_and_a_lease_after_it():
    outage = Outage("w")
    outage.failed("claiming", terminated_session_error())
    assert outage.holds_back(RECOVERING, 30)  # the database is out of reach
    outage.succeeded("claiming")  # back
    assert outage.holds_back(RECOVERING, 30)  # owners renew their leases first
    assert not outage.holds_back(RECOVERING, 0)  # a lease later, lost workers' runs go
    # A chore failing for another reason never holds recoveries back.
    other = Outage("w2")
    other.failed("firing schedules", raised("SELECT 1 / 0"))
    assert not other.holds_back(RECOVERING, 30)


def test_a_step_writing_to_a_read_only_database_of_its_own_fails_as_the_step():
    run_id = durable.start("writes_to_a_read_only_database")
    drain()
    run = Run.objects.get(id=run_id)
    # django-durable's own session writes: the refusal is the step's, not a failover.
    assert run.status == Status.FAILED
    assert "read-only transaction" in run.error["message"]
    assert run.recoveries == 0
    assert not StepAttempt.objects.filter(run_id=run_id, status="lost").exists()


# --- a. failover ----------------------------------------------------------------

RUNS = 200
WORKERS = 3


@pytest.fixture
def pair():
    if not standby_pair.available():
        pytest.skip("pg_createcluster, pg_basebackup or runuser is not installed")
    with standby_pair.standby_pair("failover") as made:
        yield made


def test_a_primary_stopped_hard_and_its_standby_promoted_lose_and_stall_nothing(pair, tmp_path):
    env = pair.env(
        DURABLE_HEARTBEAT_SECONDS="1", DURABLE_POLL_SECONDS="0.2", DURABLE_MAX_RECOVERIES="0"
    )
    workers = [
        WorkerProcess(
            ["--worker-id", f"failover-{n}", "--concurrency", "4"], env, tmp_path / f"w{n}.log"
        )
        for n in range(WORKERS)
    ]
    producer = None
    try:
        for worker in workers:
            worker.wait_for_output("serves", timeout=60)
        # Keyed starts go on through the failover: a start that raised is made again
        # with its key, as a web process retries its request.
        producer = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster_probe", "start", "--runs", str(RUNS),
             "--pause", "0.1", "--gap", "0.02", "--retry-for", "60"],
            cwd=ROOT, env=pair.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        primary, standby = pair.primary_port, pair.standby_port
        wait_until(lambda: (pair.count(primary, EXECUTIONS) or 0) >= 90, 120, "90 step executions")
        assert (pair.count(primary, COMPLETED) or 0) < RUNS, "the runs finished too soon"
        pair.stop_primary()
        at_stop = pair.count(standby, EXECUTIONS)  # synchronous: all the primary committed
        pair.promote()
        promoted = time.monotonic()
        assert not pair.in_recovery(standby)
        wait_until(
            lambda: (pair.count(standby, EXECUTIONS) or 0) > at_stop,
            20,
            "a step executed on the promoted standby",
            interval=0.02,
        )
        back_after = time.monotonic() - promoted
        out, err = producer.communicate(timeout=120)
        assert producer.returncode == 0, err
        started = json.loads(out.strip().splitlines()[-1])
        try:
            wait_until(lambda: pair.count(standby, COMPLETED) == RUNS, 120, "every run", 0.2)
        except AssertionError as timed_out:  # which runs, in what state, and the workers' logs
            logs = "\n".join(worker.output()[-3000:] for worker in workers)
            raise AssertionError(f"{timed_out}: {pair.probe('report')}\n{logs}") from None
        report = pair.probe("report")
    finally:
        if producer is not None and producer.poll() is None:
            producer.kill()
        for worker in workers:
            worker.send(signal.SIGTERM)
        codes = [worker.wait(60) for worker in workers]

    assert codes == [0] * WORKERS
    assert started["started"] == RUNS and started["errors"] == [], started
    assert report["runs"] == RUNS and report["keys"] == RUNS  # 0 committed starts lost
    assert report["statuses"] == {"completed": RUNS}, report["failed_errors"]  # 0 failed
    assert report["holders_per_key"] == [1] and report["keys_held"] == RUNS
    assert report["steps_executed"] == 3 * RUNS
    # No run waited for its lease: none was recovered (with MAX_RECOVERIES = 0 it would
    # have failed); every lost attempt is a hand-back by its live worker.
    assert report["recoveries"] == 0
    assert set(report["lost_kinds"]) <= {"ConnectionLost"}, report["lost_kinds"]
    # At least once per step: every repeat of a step comes with a lost attempt of it.
    for repeat in report["repeats"]:
        assert repeat["lost_attempts"] >= repeat["executions"] - 1, repeat
    print(
        f"\nworkers at work {back_after:.2f}s after the promote; {started['retried']} start "
        f"attempts retried through the failover; {report['lost_attempts']} runs handed back; "
        f"{report['executions'] - 3 * RUNS} step executions repeated"
    )
    for worker in workers:
        log = worker.output()
        quiet(log)
        assert log.count(OUT_OF_REACH) == 1, log
        assert log.count(BACK) == 1, log


# --- b. a read-only server --------------------------------------------------------


@pytest.fixture
def cluster():
    if not own_cluster.available():
        pytest.skip("pg_createcluster is not installed")
    with own_cluster.own_cluster("readonly") as pg:
        yield pg


def alter_system(pg: own_cluster.OwnCluster, setting: str) -> None:
    """``ALTER SYSTEM`` and a reload: open sessions take it at their next transaction."""
    standby_pair.psql(pg.port, f"ALTER SYSTEM {setting}")
    standby_pair.psql(pg.port, "SELECT pg_reload_conf()")


def test_a_server_that_turned_read_only_is_a_connection_fault(cluster, tmp_path):
    env = cluster.env(DURABLE_HEARTBEAT_SECONDS="0.5", DURABLE_POLL_SECONDS="0.2")
    env["DURABLE_MAX_RECOVERIES"] = "0"
    worker = WorkerProcess(["--concurrency", "2"], env, tmp_path / "w.log")
    try:
        worker.wait_for_output("serves", timeout=60)
        assert cluster.probe("start", "--runs", "20", "--pause", "0.3")["started"] == 20
        wait_until(lambda: (cluster.scalar(EXECUTIONS) or 0) >= 4, 60, "4 step executions")
        # Every write now fails with SQLSTATE 25006, as on a standby: inside steps (their
        # own writes), in claims, heartbeats, records and the maintenance.
        alter_system(cluster, "SET default_transaction_read_only = on")
        worker.wait_for_output(OUT_OF_REACH, timeout=30)
        worker.wait_for_output("read-only transaction", timeout=30)
        time.sleep(2)  # ten polls and four heartbeats against the read-only server
        assert cluster.scalar("SELECT count(*) FROM durable_run WHERE status = 'failed'") == 0
        alter_system(cluster, "RESET default_transaction_read_only")
        wait_until(lambda: cluster.scalar(COMPLETED) == 20, 60, "every run", 0.2)
        report = cluster.probe("report")
    finally:
        worker.send(signal.SIGTERM)
        code = worker.wait(60)
    assert code == 0
    assert report["statuses"] == {"completed": 20}, report["failed_errors"]
    assert report["recoveries"] == 0
    assert set(report["lost_kinds"]) <= {"ConnectionLost"}, report["lost_kinds"]
    log = worker.output()
    quiet(log)
    assert log.count(OUT_OF_REACH) == 1, log
    assert log.count(BACK) == 1, log


# --- c. a backend terminated inside a step, again and again ---------------------------

APPLICATION = "durable-failover-mid-step"
IN_STEP = """
    SELECT pid FROM pg_stat_activity
    WHERE application_name = %s AND datname = current_database()
      AND state = 'active' AND query LIKE '%%pg_sleep%%'
"""


def backend_in_step() -> int | None:
    with connection.cursor() as cursor:
        cursor.execute(IN_STEP, [APPLICATION])
        row = cursor.fetchone()
    return row[0] if row else None


def test_a_run_whose_backend_is_terminated_mid_step_is_handed_back_at_once(workers):
    proc = workers.start(
        "--concurrency",
        "1",
        extra_env={"DURABLE_TEST_APPLICATION_NAME": APPLICATION},
        heartbeat_seconds=0.5,
        poll_seconds=0.2,
        max_recoveries=1,
    )
    proc.wait_for_output("serves", timeout=60)
    run_id = durable.start("busy_steps", {"n": 1, "rounds": 150})
    lost = StepAttempt.objects.filter(run_id=run_id, status="lost")
    terminations = 3
    for done in range(terminations):
        pid = wait_until(backend_in_step, 60, "the run's step at work", interval=0.01)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        # Handed back by its worker well within the lease, not recovered at its expiry.
        wait_until(lambda d=done: lost.count() == d + 1, LEASE_SECONDS / 3, "the hand-back")
    run = wait_until(
        lambda: Run.objects.filter(id=run_id, status__in=["completed", "failed"]).first(),
        120,
        "the run's end",
    )
    assert run.status == Status.COMPLETED, run.error
    assert run.recoveries == 0  # MAX_RECOVERIES = 1, and three terminations: not counted
    assert [a.error["type"] for a in lost] == ["ConnectionLost"] * terminations
    proc.send(signal.SIGTERM)
    assert proc.wait(60) == 0
    log = proc.output()
    quiet(log)
    assert log.count("handing it back") == terminations, log
