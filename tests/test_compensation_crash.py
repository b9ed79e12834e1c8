"""A worker killed (SIGKILL) in the middle of a compensation: the run stays
compensating, keeps its key, and another worker finishes the compensations."""

import signal

import pytest

import django_durable as durable
from django_durable.models import Run, StepAttempt
from tests.testapp.models import SideEffect
from tests.testapp.workflows_engine import HangingUndo
from tests.worker_processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SHORT_LEASE = {"lease_seconds": 2, "heartbeat_seconds": 0.4, "poll_seconds": 0.2}


def test_a_killed_worker_s_compensation_is_recovered_and_finished(workers):
    run_id = durable.start(HangingUndo, key="trip:9")
    victim = workers.start("--worker-id", "victim", **SHORT_LEASE)
    wait_until(
        lambda: SideEffect.objects.filter(run_id=run_id, step="undo-started").exists(),
        timeout=60,
        what="the compensation to start",
    )
    run = durable.get_run(run_id)
    assert run.status == "compensating" and run.worker_id == "victim"
    victim.send(signal.SIGKILL)
    victim.wait(30)

    # Nobody works on it, yet it is still compensating and holding its key.
    with pytest.raises(durable.NotCancellable):
        durable.cancel(run_id)
    assert durable.get_run(run_id).holds_key

    rescuer = workers.start("--worker-id", "rescuer", **SHORT_LEASE)
    wait_until(
        lambda: durable.get_run(run_id).status == "compensated",
        timeout=60,
        what="the rescuer to finish the compensation",
    )
    rescuer.send(signal.SIGTERM)
    assert rescuer.wait(60) == 0

    run = durable.get_run(run_id)
    assert run.error["message"] == "payment refused"
    attempts = list(
        StepAttempt.objects.filter(run_id=run_id, kind="compensation")
        .order_by("id")
        .values_list("attempt", "status", "worker_id")
    )
    assert attempts == [(1, "lost", "victim"), (2, "completed", "rescuer")]
    assert SideEffect.objects.filter(run_id=run_id, step="undo-finished").count() == 1
    assert Run.objects.filter(workflow="hanging_undo").count() == 1
