"""The failure contract with real ``durable_worker`` processes: a step that kills its
worker, a poison value, a rolling deploy with an old worker."""

import os
import signal

import pytest

import django_durable as durable
from django_durable.models import Run, Status, StepAttempt
from tests.testapp.models import Execution
from tests.worker_processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SHORT_LEASE = {"lease_seconds": 2, "heartbeat_seconds": 0.4, "poll_seconds": 0.2}


def finished(run_id):
    run = Run.objects.get(id=run_id)
    return run if run.status in (Status.COMPLETED, Status.FAILED) else None


def test_a_step_that_kills_its_worker_fails_after_max_recoveries(workers):
    run_id = durable.start("kills_its_worker")  # retries=0
    # Each execution kills its worker; a fresh worker recovers the run and is killed too.
    for _ in range(3):
        proc = workers.start("--concurrency", "1", max_recoveries=2, **SHORT_LEASE)
        wait_until(lambda p=proc: p.proc.poll() is not None or finished(run_id), 60, "a kill")
        if proc.proc.poll() is None:
            break
    survivor = workers.start("--concurrency", "1", max_recoveries=2, **SHORT_LEASE)
    run = wait_until(lambda: finished(run_id), 60, "the run to fail")
    assert run.status == Status.FAILED
    assert "its worker was lost 3 times" in run.error["message"]
    assert Execution.objects.filter(run_id=run_id, step="crash").count() == 3
    survivor.send(signal.SIGTERM)
    assert survivor.wait(30) == 0


@pytest.mark.postgres
def test_a_nul_result_fails_after_its_retries_in_a_real_worker(workers):
    run_id = durable.start("returns_nul")  # retries=2
    proc = workers.start("--concurrency", "2", **SHORT_LEASE)
    run = wait_until(lambda: finished(run_id), 60, "the run to fail")
    assert run.status == Status.FAILED and "NUL" in run.error["message"]
    assert Execution.objects.filter(run_id=run_id).count() == 3
    proc.send(signal.SIGTERM)
    assert proc.wait(30) == 0


@pytest.mark.postgres
def test_an_old_worker_leaves_a_new_workflows_runs_to_a_new_worker(workers):
    old = workers.start("--concurrency", "2", old_code="1", **SHORT_LEASE)
    old.wait_for_output("serves", timeout=60)
    assert (
        "added_in_this_release"
        not in [line for line in old.output().splitlines() if "serves" in line][0]
    )
    run_ids = [durable.start("added_in_this_release") for _ in range(20)]
    known = [durable.start("steps_3") for _ in range(5)]
    wait_until(lambda: all(finished(r) for r in known), 60, "the old worker's runs")
    assert Run.objects.filter(id__in=run_ids, status=Status.PENDING).count() == 20
    new = workers.start("--concurrency", "2", **SHORT_LEASE)
    wait_until(lambda: all(finished(r) for r in run_ids), 60, "the new workflow's runs")
    assert Run.objects.filter(id__in=run_ids, status=Status.COMPLETED).count() == 20
    for proc in (old, new):
        proc.send(signal.SIGTERM)
    assert [old.wait(30), new.wait(30)] == [0, 0]
    assert os.environ.get("DURABLE_OLD_CODE") is None


LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"


def skewed(offset: str) -> dict[str, str]:
    """libfaketime in the worker process only: its clock is ``offset`` off."""
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


@pytest.mark.postgres
@pytest.mark.skipif(not os.path.exists(LIBFAKETIME), reason="Debian's faketime is not installed")
def test_workers_whose_clocks_are_a_minute_off_take_no_live_run(workers):
    procs = [
        workers.start("--concurrency", "2", **SHORT_LEASE),
        workers.start("--concurrency", "2", extra_env=skewed("+60s"), **SHORT_LEASE),
        workers.start("--concurrency", "2", extra_env=skewed("-60s"), **SHORT_LEASE),
    ]
    for proc in procs:
        proc.wait_for_output("serves", timeout=60)
    run_ids = [durable.start("steps_3", key=f"skew:{n}") for n in range(150)]
    wait_until(
        lambda: Run.objects.filter(id__in=run_ids, status=Status.COMPLETED).count() == 150,
        180,
        "150 completed runs",
        interval=0.5,
    )
    # No lease was judged expired (no run taken from a live worker), no step ran twice.
    assert not Run.objects.filter(recoveries__gt=0).exists()
    assert Execution.objects.count() == 450
    repeated = Execution.objects.values("run_id", "step").distinct().count()
    assert repeated == 450
    # The skewed workers did claim runs: three workers recorded steps.
    workers_seen = StepAttempt.objects.values_list("worker_id", flat=True).distinct()
    assert len(set(workers_seen)) == 3
    for proc in procs:
        proc.send(signal.SIGTERM)
    assert [proc.wait(60) for proc in procs] == [0, 0, 0]
