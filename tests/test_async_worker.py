"""Async steps in a real ``manage.py durable_worker`` process: mixed with sync steps,
their logs kept, and a long ``asyncio.sleep`` stopped by a cancel."""

import signal

import pytest

import django_durable as durable
from django_durable.models import Run, StepAttempt
from tests.testapp.models import SideEffect
from tests.testapp.workflows import AsyncRetry, AsyncSleepsLong, MixedSteps
from tests.worker_processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SHORT_LEASE = {"lease_seconds": 2, "heartbeat_seconds": 0.4, "poll_seconds": 0.2}


def test_a_worker_process_runs_async_steps_keeps_their_logs_and_cancels_a_long_sleep(
    workers, tmp_path
):
    worker = workers.start("--concurrency", "2", **SHORT_LEASE)
    mixed = [durable.start(MixedSteps, {"n": i}) for i in range(4)]
    retried = durable.start(AsyncRetry)
    sleeper = durable.start(AsyncSleepsLong, {"dir": str(tmp_path)})

    wait_until(
        lambda: Run.objects.filter(id__in=[*mixed, retried], status="completed").count() == 5,
        60,
        "the mixed and retried runs to complete",
    )
    assert sorted(Run.objects.get(id=r).result["input"] for r in mixed) == [0, 1, 2, 3]
    first, second = StepAttempt.objects.filter(run_id=retried).order_by("id")
    assert (first.status, first.error["type"]) == ("failed", "ValueError")
    assert [(r["level"], r["message"]) for r in first.logs] == [("WARNING", "attempt 1 starting")]
    assert [r["message"] for r in second.logs] == ["attempt 2 starting"]

    wait_until((tmp_path / "sleep-started").exists, 60, "the async sleep to start")
    durable.cancel(sleeper, reason="stop sleeping")
    wait_until(
        lambda: StepAttempt.objects.filter(run_id=sleeper, status="cancelled").exists(),
        30,
        "the cancelled attempt",
    )
    worker.wait_for_output("was cancelled; its step stops")
    assert list(SideEffect.objects.filter(run_id=sleeper).values_list("step", flat=True)) == [
        "long-task-cancelled"
    ]
    assert Run.objects.get(id=sleeper).status == "cancelled"
    worker.send(signal.SIGTERM)
    assert worker.wait(30) == 0
