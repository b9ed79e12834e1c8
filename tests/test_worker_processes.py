"""``manage.py durable_worker`` as real processes: many workers, SIGKILL, SIGTERM,
cancellation, NOTIFY, and SQLite with threads."""

import signal
import time
from datetime import timedelta

import pytest
from django.db import connection

import django_durable as durable
from django_durable.models import (
    Event,
    Run,
    Status,
    StepAttempt,
    WorkerNode,
)
from tests.testapp.models import SideEffect
from tests.testapp.workflows import (
    Noop,
    ProcessArticle,
    WorkerAwaitsEvent,
    WorkerBlocking,
    WorkerHeartbeating,
    WorkerMarksAttempts,
    WorkerUnaware,
)
from tests.worker_processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# A short lease so that recovery happens within a test (heartbeat at most half of it).
SHORT_LEASE = {"lease_seconds": 2, "heartbeat_seconds": 0.4, "poll_seconds": 0.2}


def status_of(run_id):
    return Run.objects.get(id=run_id).status


def effects(run_id):
    return sorted(SideEffect.objects.filter(run_id=run_id).values_list("step", flat=True))


@pytest.mark.postgres
def test_500_runs_across_3_workers_each_complete_exactly_once(workers):
    names = ["w1", "w2", "w3"]
    procs = [workers.start("--worker-id", n, "--concurrency", "2") for n in names]
    for proc in procs:
        proc.wait_for_output("listening for NOTIFY", timeout=60)

    run_ids = [durable.start(ProcessArticle, {"id": i}, key=f"article:{i}") for i in range(500)]

    def all_done():
        counts = dict.fromkeys(Status.values, 0)
        for status in Run.objects.values_list("status", flat=True):
            counts[status] += 1
        assert counts["failed"] == 0, Run.objects.filter(status="failed").first().error
        return counts["completed"] == 500

    wait_until(all_done, timeout=240, what="500 completed runs", interval=0.5)
    for proc in procs:
        proc.send(signal.SIGTERM)
    assert [proc.wait(60) for proc in procs] == [0, 0, 0]

    # The unique constraint on SideEffect would have failed a step run twice.
    assert SideEffect.objects.count() == 1000
    completed = StepAttempt.objects.filter(status="completed")
    assert completed.count() == 1000
    assert not StepAttempt.objects.exclude(status="completed").exists()
    assert set(completed.values_list("run_id", flat=True)) == set(run_ids)
    assert set(completed.values_list("worker_id", flat=True)) == set(names)
    assert Run.objects.filter(holds_key=True).count() == 500
    # Each marked stopped on its clean stop (the Workers page shows it for a day).
    assert set(WorkerNode.objects.values_list("stopping", flat=True)) == {True}


def test_sigkill_mid_step_is_recovered_by_another_worker_and_the_key_stays_held(workers, tmp_path):
    doomed = workers.start("--worker-id", "doomed", **SHORT_LEASE)
    run_id = durable.start(WorkerBlocking, {"dir": str(tmp_path)}, key="blocking:1")
    wait_until((tmp_path / "first-started-1").exists, 60, "the step to start")

    doomed.kill()
    run = Run.objects.get(id=run_id)
    assert (run.status, run.worker_id, run.holds_key) == ("running", "doomed", True)
    lease_ran_out_at = run.lease_expires_at
    # Orphaned: the key is still held, a duplicate start gets the orphan back.
    assert durable.start(WorkerBlocking, {"dir": str(tmp_path)}, key="blocking:1") == run_id

    rescuer = workers.start("--worker-id", "rescuer", **SHORT_LEASE)
    seen = set()

    def finished():
        holder = Run.objects.get(workflow="worker_blocking", key="blocking:1", holds_key=True)
        assert holder.id == run_id  # never another holder, never no holder
        seen.add(holder.status)
        return holder.status == "completed"

    wait_until(finished, 60, "the recovered run to complete")
    assert "running" in seen
    run = Run.objects.get(id=run_id)
    assert run.holds_key and run.worker_id == "rescuer"
    lost = StepAttempt.objects.get(run_id=run_id, status="lost")
    assert (lost.worker_id, lost.attempt) == ("doomed", 1)
    assert lost.started_at >= lease_ran_out_at  # recovered only once the lease ran out
    done = StepAttempt.objects.filter(run_id=run_id, status="completed")
    assert set(done.values_list("worker_id", flat=True)) == {"rescuer"}
    assert (tmp_path / "first-started-2").exists()
    assert effects(run_id) == ["first", "second"]
    assert "recovered 1 run(s)" in rescuer.output()
    rescuer.send(signal.SIGTERM)
    assert rescuer.wait(30) == 0


@pytest.mark.postgres
def test_a_worker_killed_before_its_recorder_wrote_leaves_the_last_steps_to_run_again(
    workers, tmp_path
):
    """The recorder's window: three runs' last steps ran, their records wait in the
    recorder (its statement is blocked by a table lock), and the worker's
    machine dies (SIGKILL, its connection gone). Nothing of them was written: each
    run is recovered and its step runs again, and each ends with one completed
    attempt, after a lost one."""
    holder = connection.get_new_connection(connection.get_connection_params())
    holder.autocommit = False
    try:
        with holder.cursor() as cursor:  # inserts into durable_step_attempt wait for it
            cursor.execute("LOCK TABLE durable_step_attempt IN SHARE MODE")
        doomed = workers.start("--worker-id", "doomed", "--concurrency", "4", **SHORT_LEASE)
        run_ids = [
            durable.start(WorkerMarksAttempts, {"n": n, "dir": str(tmp_path)}) for n in range(3)
        ]
        wait_until(
            lambda: all((tmp_path / f"ran-{n}-1").exists() for n in range(3)),
            60,
            "the three steps to run",
        )

        def blocked_record():
            with connection.cursor() as cursor:
                cursor.execute(
                    # The statement's start: a long one is cut in pg_stat_activity.
                    "SELECT pid FROM pg_stat_activity WHERE wait_event = 'relation' "
                    "AND (query LIKE %s OR query LIKE %s)",
                    ["%durable_record_step_v2(%", "%WITH done AS%"],
                )
                return [pid for (pid,) in cursor.fetchall()]

        [pid] = wait_until(blocked_record, 60, "the recorder's statement to wait")
        doomed.kill()
        with connection.cursor() as cursor:  # the connection dies with the machine
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        holder.rollback()
        holder.close()
    assert not StepAttempt.objects.filter(run_id__in=run_ids).exists()
    assert set(Run.objects.filter(id__in=run_ids).values_list("status", flat=True)) == {"running"}

    rescuer = workers.start("--worker-id", "rescuer", **SHORT_LEASE)
    wait_until(
        lambda: Run.objects.filter(id__in=run_ids, status="completed").count() == 3,
        60,
        "the recovered runs to complete",
    )
    for n, run_id in enumerate(run_ids):
        attempts = StepAttempt.objects.filter(run_id=run_id).order_by("attempt")
        assert [(a.attempt, a.status, a.worker_id) for a in attempts] == [
            (1, "lost", "doomed"),
            (2, "completed", "rescuer"),
        ]
        assert Run.objects.get(id=run_id).result == 2
        assert (tmp_path / f"ran-{n}-2").exists()  # the step ran again
    rescuer.send(signal.SIGTERM)
    assert rescuer.wait(30) == 0


def test_sigterm_finishes_the_current_step_hands_back_the_rest_and_exits_0(workers, tmp_path):
    worker = workers.start("--worker-id", "graceful", grace_seconds=30, poll_seconds=0.2)
    run_id = durable.start(WorkerBlocking, {"dir": str(tmp_path)}, key="graceful:1")
    wait_until((tmp_path / "first-started-1").exists, 60, "the step to start")

    worker.send(signal.SIGTERM)
    worker.wait_for_output("stopping")
    (tmp_path / "release").touch()
    assert worker.wait(30) == 0

    run = Run.objects.get(id=run_id)
    assert (run.status, run.step_index, run.worker_id, run.holds_key) == (
        "pending",
        1,
        None,
        True,
    )
    assert effects(run_id) == ["first"]
    assert "handed back" in worker.output()
    assert WorkerNode.objects.get(id="graceful").stopping  # stopped, shown for a day

    # Another worker picks up where it stopped.
    follower = workers.start("--burst")
    assert follower.wait(60) == 0
    assert status_of(run_id) == "completed"
    assert effects(run_id) == ["first", "second"]


def test_sigterm_hands_back_a_step_that_outlives_the_grace_period(workers, tmp_path):
    worker = workers.start(grace_seconds=1, poll_seconds=0.2)
    run_id = durable.start(WorkerBlocking, {"dir": str(tmp_path)})
    wait_until((tmp_path / "first-started-1").exists, 60, "the step to start")

    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0
    run = Run.objects.get(id=run_id)
    assert (run.status, run.step_index, run.worker_id) == ("pending", 0, None)
    assert "still running after the grace period" in worker.output()


def test_a_second_signal_exits_at_once(workers, tmp_path):
    worker = workers.start(grace_seconds=60, poll_seconds=0.2)
    run_id = durable.start(WorkerBlocking, {"dir": str(tmp_path)})
    wait_until((tmp_path / "first-started-1").exists, 60, "the step to start")

    worker.send(signal.SIGTERM)
    worker.wait_for_output("stopping")
    worker.send(signal.SIGTERM)
    assert worker.wait(10) == 1
    # Not handed back: the run comes back through its lease, like after a crash.
    assert status_of(run_id) == "running"


def test_a_cancelled_long_step_stops_at_its_next_heartbeat(workers, tmp_path):
    worker = workers.start(**SHORT_LEASE)
    run_id = durable.start(WorkerHeartbeating, {"dir": str(tmp_path)})
    wait_until((tmp_path / "long-started").exists, 60, "the long step to start")

    durable.cancel(run_id, reason="not needed any more")
    wait_until(lambda: effects(run_id) == ["long-cancelled"], 30, "the step to stop")
    wait_until(
        lambda: StepAttempt.objects.filter(run_id=run_id, status="cancelled").exists(),
        30,
        "the cancelled attempt",
    )
    run = Run.objects.get(id=run_id)
    assert run.status == "cancelled" and run.error["reason"] == "not needed any more"

    # The thread is free again, and no later step of the cancelled run ever ran.
    other = durable.start(Noop)
    wait_until(lambda: status_of(other) == "completed", 30, "the next run")
    assert effects(run_id) == ["long-cancelled"]
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0


def test_the_worker_heartbeat_notices_a_cancel_and_no_later_step_runs(workers, tmp_path):
    worker = workers.start(**SHORT_LEASE)
    run_id = durable.start(WorkerUnaware, {"dir": str(tmp_path)})
    wait_until((tmp_path / "unaware-started").exists, 60, "the step to start")

    durable.cancel(run_id)
    worker.wait_for_output("was cancelled; its step stops")
    (tmp_path / "release").touch()
    worker.wait_for_output("stopped: it is cancelled now")
    assert effects(run_id) == ["first"]  # the step in progress ends; "second" never runs
    assert status_of(run_id) == "cancelled"
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0


@pytest.mark.postgres
def test_notify_wakes_an_idle_worker_long_before_its_poll_interval(workers):
    worker = workers.start("--poll-interval", "10")
    worker.wait_for_output("listening for NOTIFY", timeout=60)
    time.sleep(0.5)  # let it settle into its idle wait

    run_id = durable.start(Noop)
    wait_until(lambda: status_of(run_id) == "completed", 8, "the run, before the 10 s poll")
    run = Run.objects.get(id=run_id)
    # Picked up (claimed) well before the poll interval: the database's own clock says so.
    assert run.started_at - run.created_at < timedelta(seconds=2)

    # An event that resumes a waiting run wakes the worker the same way.
    waiting = durable.start(WorkerAwaitsEvent)
    wait_until(lambda: status_of(waiting) == "waiting", 8, "the run to wait")
    time.sleep(0.5)
    durable.send_event(waiting, "go", "now")
    wait_until(lambda: status_of(waiting) == "completed", 8, "the resumed run")
    sent = Event.objects.get(run_id=waiting).created_at
    resumed = StepAttempt.objects.get(run_id=waiting, status="completed").started_at
    assert resumed - sent < timedelta(seconds=2)
    assert effects(waiting) == ["got"]
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0


def test_one_worker_with_4_threads_completes_200_runs_then_exits_in_burst_mode(workers):
    run_ids = [durable.start(ProcessArticle, {"id": i}) for i in range(200)]
    worker = workers.start("--concurrency", "4", "--burst")
    assert worker.wait(180) == 0, worker.output()

    output = worker.output()
    assert "database is locked" not in output
    assert Run.objects.filter(id__in=run_ids, status="completed").count() == 200
    assert SideEffect.objects.count() == 400
    assert output.count("started: step 0") == 200
    if connection.vendor == "sqlite":
        assert "django_durable.W001" in output
