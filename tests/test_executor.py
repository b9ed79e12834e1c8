"""Running steps: in order, context saved after each step, one attempt row per
attempt, retries with backoff while the run keeps its key, and the final status."""

from datetime import timedelta

import pytest
from django.utils import timezone

import django_durable as durable
from django_durable import step
from django_durable.models import Run, Status, StepAttempt
from django_durable.testing import drain
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db


def attempts(run_id):
    return list(
        StepAttempt.objects.filter(run_id=run_id)
        .order_by("id")
        .values_list("step", "attempt", "status")
    )


def test_steps_run_in_order_and_the_last_return_is_the_result():
    run_id = durable.start("process_article", {"id": 42}, key="article:42")
    assert drain() == 2
    run = durable.get_run(run_id)
    assert (run.status, run.result, run.error) == (
        Status.COMPLETED,
        {"summary": "body of 42"},
        None,
    )
    assert list(SideEffect.objects.order_by("id").values_list("step", flat=True)) == [
        "fetch",
        "summarize",
    ]
    assert attempts(run_id) == [("fetch", 1, "completed"), ("summarize", 1, "completed")]
    assert run.started_at <= run.finished_at
    assert run.holds_key  # a completed run still holds its key; reuse decides at the next start


def test_each_step_output_is_stored_on_its_attempt():
    run_id = durable.start("noop", {})
    drain()
    assert list(StepAttempt.objects.filter(run_id=run_id).values_list("output", flat=True)) == [
        1,
        2,
    ]


def test_context_is_saved_after_each_step(define):
    def first(self, ctx):
        ctx.put("seen", ["first"])
        ctx.put("run_id", str(ctx.run_id))

    def second(self, ctx):
        ctx.put("seen", [*ctx.get("seen"), "second"])
        raise RuntimeError("second fails after changing the context")

    workflow = define(
        "context_saving",
        first=step(first),
        second=step(retries=1, backoff=durable.hours(1))(second),
    )
    run_id = durable.start(workflow, {})
    drain()
    run = durable.get_run(run_id)
    # The first step's context is saved; the failed attempt's change to it is not.
    assert run.context == {"seen": ["first"], "run_id": str(run_id)}
    assert (run.step_index, run.status, run.attempt) == (1, Status.PENDING, 2)


def test_a_flaky_step_is_retried_until_it_succeeds():
    run_id = durable.start("flaky", {"failures": 2}, key="flaky:1")
    assert drain() == 3
    run = durable.get_run(run_id)
    assert (run.status, run.result) == (Status.COMPLETED, 3)
    assert attempts(run_id) == [
        ("wobble", 1, "failed"),
        ("wobble", 2, "failed"),
        ("wobble", 3, "completed"),
    ]
    failed = StepAttempt.objects.filter(run_id=run_id, status="failed").first()
    assert failed.error["type"] == "ValueError"
    assert failed.error["message"] == "attempt 1 fails"


def test_a_step_fails_the_run_when_retries_run_out():
    run_id = durable.start("flaky", {"failures": 10}, key="flaky:1")
    assert drain() == 4  # one attempt and three retries
    run = durable.get_run(run_id)
    assert run.status == Status.FAILED
    assert run.error["type"] == "ValueError"
    assert run.error["message"] == "attempt 4 fails"
    assert "Traceback" in run.error["traceback"]
    assert run.finished_at is not None and run.due_at is None
    assert [a[1] for a in attempts(run_id)] == [1, 2, 3, 4]
    assert run.holds_key  # failing changes the status, never the key


def always_fails(self, ctx):
    raise ValueError("not yet")


def test_between_attempts_the_run_waits_for_its_backoff_and_keeps_its_key(define):
    workflow = define(
        "backing_off", work=step(retries=2, backoff=durable.minutes(10))(always_fails)
    )
    run_id = durable.start(workflow, {}, key="job:1")
    before = timezone.now()
    assert drain() == 1  # the retry is ten minutes away: drain doesn't wait for it
    run = durable.get_run(run_id)
    assert (run.status, run.attempt, run.holds_key, run.worker_id) == (
        Status.PENDING,
        2,
        True,
        None,
    )
    assert before + timedelta(minutes=9) < run.due_at <= timezone.now() + timedelta(minutes=10)
    assert durable.start(workflow, {}, key="job:1") == run_id

    # Once the wait is over (moved to now here), the next failure waits twice as long.
    Run.objects.filter(id=run_id).update(due_at=timezone.now())
    assert drain() == 1
    run.refresh_from_db()
    assert (run.status, run.attempt, run.holds_key) == (Status.PENDING, 3, True)
    assert timezone.now() + timedelta(minutes=19) < run.due_at

    Run.objects.filter(id=run_id).update(due_at=timezone.now())
    assert drain() == 1
    run.refresh_from_db()
    assert (run.status, run.holds_key) == (Status.FAILED, True)
    assert attempts(run_id) == [("always_fails", n, "failed") for n in (1, 2, 3)]


def test_backoff_is_capped_by_max_backoff():
    """slow_retry waits an hour, the default cap, before each retry."""
    run_id = durable.start("slow_retry", {}, key="job:1")
    drain()
    Run.objects.filter(id=run_id).update(due_at=timezone.now())
    drain()
    run = durable.get_run(run_id)
    assert run.attempt == 3
    assert run.due_at <= timezone.now() + timedelta(hours=1)


def test_a_return_value_that_is_not_json_fails_the_step(define):
    workflow = define("bad_return", work=step(lambda self, ctx: {1, 2}))
    run_id = durable.start(workflow, {})
    drain()
    run = durable.get_run(run_id)
    assert run.status == Status.FAILED
    assert run.error["type"] == "TypeError"


def test_ctx_gives_the_step_its_run(define):
    def look(self, ctx):
        return {
            "run_id": str(ctx.run_id),
            "attempt": ctx.attempt,
            "input": ctx.input,
            "missing": ctx.get("missing", "default"),
        }

    workflow = define("looking", look=step(look))
    run_id = durable.start(workflow, {"id": 7})
    drain()
    assert durable.get_run(run_id).result == {
        "run_id": str(run_id),
        "attempt": 1,
        "input": {"id": 7},
        "missing": "default",
    }


def test_a_run_whose_workflow_vanished_fails(define):
    workflow = define("vanishing")
    run_id = durable.start(workflow, {})
    from django_durable.workflows.definition import registry

    registry.unregister("vanishing")
    assert drain() == 0
    run = durable.get_run(run_id)
    assert (run.status, run.error["type"]) == (Status.FAILED, "UnknownWorkflow")  # a LookupError


def test_drain_counts_steps_of_every_due_run_and_leaves_future_ones():
    durable.start("noop", {})
    durable.start("noop", {})
    durable.start("slow_retry", {})
    assert drain() == 5
    assert drain() == 0
    assert Run.objects.filter(status=Status.COMPLETED).count() == 2


def test_a_duplicate_start_does_not_execute_anything():
    run_id = durable.start("process_article", {"id": 1}, key="article:1")
    drain()
    assert durable.start("process_article", {"id": 1}, key="article:1") == run_id
    assert drain() == 0
    assert SideEffect.objects.filter(run_id=run_id, step="fetch").count() == 1


def cancels_itself(self, ctx):
    SideEffect.objects.create(run_id=ctx.run_id, step="before cancel")
    durable.cancel(ctx.run_id, reason="from inside")
    ctx.heartbeat()  # a cancelled run's step stops here
    SideEffect.objects.create(run_id=ctx.run_id, step="after cancel")


def test_a_cancelled_run_stops_at_its_next_heartbeat(define):
    workflow = define(
        "cancelling",
        first=step(cancels_itself),
        second=step(lambda self, ctx: SideEffect.objects.create(run_id=ctx.run_id, step="2")),
    )
    run_id = durable.start(workflow, {}, key="job:1")
    assert drain() == 1
    run = durable.get_run(run_id)
    assert (run.status, run.holds_key, run.error["reason"]) == (
        Status.CANCELLED,
        True,
        "from inside",
    )
    assert list(SideEffect.objects.values_list("step", flat=True)) == ["before cancel"]
    assert attempts(run_id) == [("cancels_itself", 1, "cancelled")]


def test_a_run_past_its_timeout_fails_and_keeps_its_key(define):
    import time

    workflow = define("timed", timeout=timedelta(milliseconds=1))
    run_id = durable.start(workflow, {}, key="job:1")
    time.sleep(0.01)  # real time passes the run's timeout before a worker gets to it
    assert drain() == 0
    run = durable.get_run(run_id)
    assert (run.status, run.error["type"], run.holds_key) == (Status.FAILED, "Timeout", True)
    assert not StepAttempt.objects.filter(run_id=run_id).exists()
