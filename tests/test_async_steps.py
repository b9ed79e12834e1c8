"""``async def`` steps and compensations: awaited by the executor, mixed with sync
steps, waiting, retrying, heartbeating, and cancelled with their run -- in this
process (``drain``) and on real worker threads."""

import asyncio
import threading
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync

import django_durable as durable
from django_durable import step, store
from django_durable.models import Run, StepAttempt
from django_durable.runtime import calling
from django_durable.runtime.context import Context
from django_durable.runtime.worker import Worker
from django_durable.testing import drain
from tests.testapp.models import SideEffect
from tests.testapp.workflows import (
    AsyncHeartbeating,
    AsyncRetry,
    AsyncSaga,
    AsyncSleepsLong,
    AsyncWaits,
    MixedSteps,
    Noop,
)
from tests.worker_processes import wait_until

LEASE = timedelta(seconds=30)


@pytest.fixture(autouse=True)
def info_logs_of_the_test_workflows(caplog):
    """Step logs follow the logging configuration's levels: let INFO through."""
    caplog.set_level("INFO", logger="tests")


def attempts(run_id):
    return list(
        StepAttempt.objects.filter(run_id=run_id)
        .order_by("id")
        .values_list("step", "kind", "attempt", "status")
    )


def effects(run_id):
    return list(SideEffect.objects.filter(run_id=run_id).order_by("id").values_list("step", "note"))


def make_due(run_id):
    Run.objects.filter(id=run_id).update(due_at=store.now() - timedelta(seconds=1))


@pytest.mark.django_db
def test_a_workflow_mixes_sync_and_async_steps():
    run_id = durable.start(MixedSteps, {"n": 7})
    assert drain() == 3
    run = durable.get_run(run_id)
    assert (run.status, run.result, run.error) == ("completed", {"total": 6, "input": 7}, None)
    assert run.context == {"numbers": [1, 2, 3], "total": 6}
    assert effects(run_id) == [("prepare", ""), ("add", "6"), ("finish", "")]
    assert StepAttempt.objects.get(run_id=run_id, step="add").output == 6


@pytest.mark.django_db
def test_an_async_step_sleeps_and_waits_for_an_event_like_a_sync_step():
    run_id = durable.start(AsyncWaits)
    drain()
    run = durable.get_run(run_id)
    assert (run.status, run.waiting_for) == ("waiting", "sleep")
    make_due(run_id)  # the controlled clock: the sleep is over
    drain()
    run = durable.get_run(run_id)
    assert (run.status, run.waiting_for) == ("waiting", "event:go")
    durable.send_event(run_id, "go", {"colour": "green"})
    drain()
    run = durable.get_run(run_id)
    assert (run.status, run.result) == ("completed", {"colour": "green"})
    assert attempts(run_id) == [
        ("nap", "step", 1, "suspended"),
        ("nap", "step", 1, "completed"),
        ("listen", "step", 1, "suspended"),
        ("listen", "step", 1, "completed"),
    ]


@pytest.mark.django_db
def test_a_failing_async_step_retries_and_each_attempt_keeps_its_own_logs():
    run_id = durable.start(AsyncRetry)
    drain()
    run = durable.get_run(run_id)
    assert (run.status, run.result) == ("completed", 2)
    first, second = StepAttempt.objects.filter(run_id=run_id).order_by("id")
    assert (first.status, first.error["type"], first.error["message"]) == (
        "failed",
        "ValueError",
        "first attempt fails",
    )
    assert [r["message"] for r in first.logs] == ["attempt 1 starting"]
    assert [r["message"] for r in second.logs] == ["attempt 2 starting"]


@pytest.mark.django_db
def test_an_async_compensation_is_awaited():
    run_id = durable.start(AsyncSaga)
    drain()
    run = durable.get_run(run_id)
    assert run.status == "compensated"
    assert [s for s, _ in effects(run_id)] == ["reserve", "unreserve"]
    undo = StepAttempt.objects.get(run_id=run_id, kind="compensation")
    assert (undo.step, undo.status, undo.output) == ("unreserve", "completed", "released")
    assert [r["message"] for r in undo.logs] == ["releasing the reservation"]


@pytest.mark.django_db
def test_the_blocking_heartbeat_in_an_async_step_fails_the_attempt_with_a_clear_error(define):
    async def beats_wrongly(self, ctx):
        ctx.heartbeat()

    workflow = define("beats_wrongly", go=step(beats_wrongly))
    run_id = durable.start(workflow)
    drain()
    run = durable.get_run(run_id)
    assert run.status == "failed"
    assert run.error["type"] == "SynchronousOnlyOperation"
    assert "await ctx.aheartbeat()" in run.error["message"]


@pytest.mark.django_db
def test_aheartbeat_renews_the_lease_and_raises_cancelled_once_the_run_is_cancelled():
    run_id = durable.start(Noop)
    (run,) = store.claim(worker_id="beater", queues=None, limit=1, lease=timedelta(seconds=2))
    ctx = Context(run, waits=[])
    async_to_sync(ctx.aheartbeat)()  # its query runs on this thread, as in a worker
    renewed = Run.objects.get(id=run_id).lease_expires_at
    assert renewed > store.now() + LEASE - timedelta(seconds=5)

    durable.cancel(run_id)
    with pytest.raises(durable.Cancelled):
        async_to_sync(ctx.aheartbeat)()


def test_a_timeout_cancels_the_steps_task_and_its_finally_runs():
    unwound = []

    async def slow():
        try:
            await asyncio.sleep(60)
        finally:
            unwound.append(True)

    with pytest.raises(calling.AttemptTimedOut):
        calling.call(Run(), slow, timeout=0.2)
    assert unwound == [True]


def test_a_flagged_run_cancels_the_async_step_it_is_awaiting():
    """What the worker's heartbeat thread does: flag the run; the supervisor on the
    step's loop sees it and cancels the step's task."""
    run = Run()
    started = threading.Event()

    async def waits_long():
        started.set()
        await asyncio.sleep(60)

    flagger = threading.Thread(target=lambda: started.wait(30) and setattr(run, "lease_lost", True))
    flagger.start()
    with pytest.raises(durable.Cancelled):
        calling.call(run, waits_long)
    flagger.join(30)


def test_an_async_step_that_cancels_itself_is_a_plain_failure():
    async def cancels_itself():
        raise asyncio.CancelledError

    with pytest.raises(RuntimeError, match="task was cancelled"):
        calling.call(Run(), cancels_itself)


# --- on worker threads ------------------------------------------------------------


@pytest.fixture
def running_worker(settings):
    """A worker on two threads in this process, heartbeating every 0.1 s."""
    settings.DURABLE = {
        "HEARTBEAT_INTERVAL": timedelta(seconds=0.1),
        "POLL_INTERVAL": timedelta(seconds=0.1),
        "LEASE": timedelta(seconds=5),
    }
    worker = Worker(concurrency=2, worker_id="async-threads")
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    yield worker
    worker.stop()
    thread.join(30)
    assert not thread.is_alive()


@pytest.mark.django_db(transaction=True)
def test_worker_threads_run_async_and_sync_steps_side_by_side(running_worker):
    run_ids = [durable.start(MixedSteps, {"n": i}) for i in range(6)]
    wait_until(
        lambda: Run.objects.filter(id__in=run_ids, status="completed").count() == 6,
        60,
        "the mixed runs to complete",
    )
    assert {durable.get_run(r).result["input"] for r in run_ids} == set(range(6))
    assert SideEffect.objects.filter(run_id__in=run_ids, step="add", note="6").count() == 6


@pytest.mark.django_db(transaction=True)
def test_cancelling_a_run_stops_its_async_step_in_a_long_asyncio_sleep(running_worker, tmp_path):
    run_id = durable.start(AsyncSleepsLong, {"dir": str(tmp_path)})
    wait_until((tmp_path / "sleep-started").exists, 60, "the async step to start")

    durable.cancel(run_id, reason="no longer needed")
    wait_until(
        lambda: StepAttempt.objects.filter(run_id=run_id, status="cancelled").exists(),
        30,
        "the cancelled attempt",
    )
    # The task was cancelled (its handler ran, on the worker thread's connection) and
    # no later step ran.
    assert [s for s, _ in effects(run_id)] == ["long-task-cancelled"]
    run = Run.objects.get(id=run_id)
    assert (run.status, run.error["reason"]) == ("cancelled", "no longer needed")
    # The thread is free again.
    other = durable.start(Noop)
    wait_until(lambda: Run.objects.get(id=other).status == "completed", 30, "the next run")
    assert [s for s, _ in effects(run_id)] == ["long-task-cancelled"]


@pytest.mark.django_db(transaction=True)
def test_an_async_step_heartbeating_sees_the_cancel(running_worker, tmp_path):
    run_id = durable.start(AsyncHeartbeating, {"dir": str(tmp_path)})
    wait_until((tmp_path / "async-long-started").exists, 60, "the async step to start")
    durable.cancel(run_id)
    wait_until(
        lambda: StepAttempt.objects.filter(run_id=run_id, status="cancelled").exists(),
        30,
        "the cancelled attempt",
    )
    assert [s for s, _ in effects(run_id)] == ["long-cancelled"]
    assert Run.objects.get(id=run_id).status == "cancelled"


@pytest.mark.django_db
def test_an_async_step_awaits_a_child_workflow_and_parallel_branches(define):
    async def delegates(self, ctx):
        child = await ctx.acall_workflow(Noop)
        branches = await ctx.aparallel([Noop, Noop])
        return {"child": child, "branches": branches}

    run_id = durable.start(define("delegates", go=step(delegates)))
    drain()
    run = durable.get_run(run_id)
    assert (run.status, run.result) == ("completed", {"child": 2, "branches": [2, 2]})
    assert Run.objects.filter(parent_id=run_id, workflow="noop", status="completed").count() == 3
