"""Retrying a run that failed by a timeout (issue 32, case 12).

Whatever timeout failed the run (the workflow's ``timeout`` while it waited, ran or
backed off; ``wait_for_input(on_timeout="fail")``; an uncaught ``WaitTimeout`` of
``wait_for_all``), ``retry()`` makes it wait again with a fresh deadline, and the
old error is gone: it never completes at once with the timed-out wait's value.
Time passes by ``drain(run_timers=True)``, never by sleeping.
"""

from datetime import timedelta

import pytest

import django_durable as durable
from django_durable import Workflow, step, store
from django_durable.models import Run, Status
from django_durable.testing import drain

pytestmark = pytest.mark.django_db


def fresh(run_id) -> Run:
    return Run.objects.get(id=run_id)


class EventPastTimeout(Workflow):
    name = "retry_timeout_event"
    timeout = durable.seconds(1)

    @step
    def wait(self, ctx):
        return ctx.wait_for_event("go")


class EventWithOwnTimeout(Workflow):
    """The wait's own timeout is later than the run's: the run's comes first."""

    name = "retry_timeout_event_own"
    timeout = durable.seconds(1)

    @step
    def wait(self, ctx):
        return ctx.wait_for_event("go", timeout=durable.hours(1), timeout_value="gave up")


class AnyPastTimeout(Workflow):
    name = "retry_timeout_any"
    timeout = durable.seconds(1)

    @step
    def wait(self, ctx):
        return ctx.wait_for_any(["a", "b"])


class SleepsPastTimeout(Workflow):
    name = "retry_timeout_sleep"
    timeout = durable.seconds(1)

    @step
    def nap(self, ctx):
        ctx.sleep(durable.hours(1))
        return "rested"


class SecondWaitPastTimeout(Workflow):
    """A wait the step passed before the one the run timed out in keeps its value."""

    name = "retry_timeout_second_wait"
    timeout = durable.minutes(10)

    @step
    def wait(self, ctx):
        first = ctx.wait_for_event("first")
        second = ctx.wait_for_event("second")
        return [first, second]


class InputFails(Workflow):
    name = "retry_timeout_input"

    @step
    def ask(self, ctx):
        return ctx.wait_for_input(
            "ok", kind="approval", timeout=durable.hours(1), on_timeout="fail"
        )


class AllTimesOut(Workflow):
    name = "retry_timeout_all"

    @step
    def gather(self, ctx):
        return ctx.wait_for_all(["a", "b"], timeout=durable.hours(1))


def failed_by_timeout(run_id, error_type="Timeout") -> Run:
    drain(run_timers=True)
    run = fresh(run_id)
    assert (run.status, run.error["type"]) == (Status.FAILED, error_type), run.error
    return run


def retried(run_id) -> Run:
    before = store.now()
    assert durable.retry(run_id) == run_id
    run = fresh(run_id)
    assert run.error is None  # the old error is cleared at once
    drain()  # what is due now: the step runs again and waits
    run = fresh(run_id)
    assert run.status == Status.WAITING, run.error
    assert run.error is None
    assert run.due_at is not None and run.due_at > before
    return run


@pytest.mark.parametrize(
    ("workflow", "waiting_for"),
    [
        (EventPastTimeout, "event:go"),
        (EventWithOwnTimeout, "event:go"),
        (AnyPastTimeout, "any:a, b"),
        (SleepsPastTimeout, "sleep"),
    ],
)
def test_a_run_that_passed_its_timeout_in_a_wait_waits_again_after_retry(workflow, waiting_for):
    run_id = durable.start(workflow)
    failed_by_timeout(run_id)
    run = retried(run_id)
    assert run.waiting_for == waiting_for
    assert run.timeout_at > store.now()  # a fresh deadline: the workflow's timeout from now
    # That deadline holds again: the retried run times out again, it never completes.
    failed_by_timeout(run_id)


def test_a_retried_event_wait_takes_the_event_sent_after_the_retry():
    run_id = durable.start(EventPastTimeout)
    failed_by_timeout(run_id)
    retried(run_id)
    durable.send_event(run_id, "go", {"n": 1})
    drain()
    run = fresh(run_id)
    assert (run.status, run.result, run.error) == (Status.COMPLETED, {"n": 1}, None)


def test_the_waits_a_step_passed_before_the_timeout_keep_their_values():
    run_id = durable.start(SecondWaitPastTimeout)
    drain()
    durable.send_event(run_id, "first", 1)
    drain()
    assert fresh(run_id).waiting_for == "event:second"
    failed_by_timeout(run_id)
    retried(run_id)
    assert fresh(run_id).waiting_for == "event:second"
    durable.send_event(run_id, "second", 2)
    drain()
    assert (fresh(run_id).status, fresh(run_id).result) == (Status.COMPLETED, [1, 2])


def test_an_event_that_came_with_the_timeout_is_taken_by_the_retried_run():
    run_id = durable.start(EventPastTimeout)
    drain()
    # The deadline passes, and the event arrives before any worker saw the timeout.
    Run.objects.filter(id=run_id).update(timeout_at=store.now() - timedelta(seconds=1))
    durable.send_event(run_id, "go", "late")
    drain()
    assert fresh(run_id).error["type"] == "Timeout"
    durable.retry(run_id)
    drain()
    assert (fresh(run_id).status, fresh(run_id).result) == (Status.COMPLETED, "late")


def test_a_run_that_passed_its_timeout_between_attempts_runs_again_after_retry(define):
    calls = []

    def work(self, ctx):
        calls.append(ctx.attempt)
        if len(calls) == 1:
            raise RuntimeError("first attempt fails")
        return "done"

    workflow = define(
        "retry_timeout_backoff",
        timeout=durable.seconds(1),
        work=step(work, retries=3, backoff=durable.hours(1)),
    )
    run_id = durable.start(workflow)
    # The backoff would end after the deadline: the run fails timed out at its deadline.
    failed_by_timeout(run_id)
    assert calls == [1]
    durable.retry(run_id)
    assert fresh(run_id).error is None
    drain()
    run = fresh(run_id)
    assert (run.status, run.result, run.error) == (Status.COMPLETED, "done", None)
    assert calls == [1, 1]  # a fresh attempt count


def test_an_input_that_timed_out_with_on_timeout_fail_is_asked_again_after_retry():
    run_id = durable.start(InputFails)
    failed_by_timeout(run_id, "WaitTimeout")
    run = retried(run_id)
    assert run.waiting_for == "input:ok"
    assert run.due_at > store.now() + timedelta(minutes=59)  # the input's timeout, afresh
    failed_by_timeout(run_id, "WaitTimeout")  # and it holds again


def test_a_wait_for_all_that_timed_out_waits_again_after_retry():
    run_id = durable.start(AllTimesOut)
    drain()
    durable.send_event(run_id, "a", 1)
    failed_by_timeout(run_id, "WaitTimeout")
    run = retried(run_id)
    assert run.waiting_for == "all:b"  # what arrived before is kept
    assert run.due_at > store.now() + timedelta(minutes=59)
    durable.send_event(run_id, "b", 2)
    drain()
    run = fresh(run_id)
    assert (run.status, run.result) == (Status.COMPLETED, {"a": 1, "b": 2})
