"""django_durable.testing: ``drain(run_timers=True)`` runs what is due later, in due
order, without waiting for the clock, and the history stays the real one; the
assertion helpers pass on what happened and say what was found when they fail."""

from datetime import timedelta

import pytest
from django.utils import timezone

import django_durable as durable
from django_durable import step
from django_durable.models import Run, Status, StepAttempt
from django_durable.testing import (
    assert_completed,
    assert_failed,
    assert_not_started,
    assert_started,
    drain,
    runs_of,
)
from django_durable.workflows.definition import registry
from tests.test_docs_async_and_logs import python_blocks

pytestmark = pytest.mark.django_db

LONG = timedelta(hours=6)  # far longer than any test: only an advanced timer passes it


def sleeper(define, name="sleeps_long", **attrs):
    def nap(self, ctx):
        ctx.sleep(LONG)
        return "rested"

    return define(name, nap=step(nap), **attrs)


def test_drain_leaves_a_sleep_for_later_and_run_timers_runs_it(define):
    workflow = sleeper(define)
    run_id = durable.start(workflow)
    assert drain() == 1
    run = durable.get_run(run_id)
    assert run.status == Status.WAITING
    assert run.due_at > timezone.now() + LONG - timedelta(minutes=5)
    assert drain(run_timers=True) == 1
    run = assert_completed(run_id, result="rested")
    # The history is the real one: the run took seconds, not six hours.
    assert run.finished_at - run.created_at < LONG / 2
    attempts = StepAttempt.objects.filter(run_id=run_id).order_by("id")
    assert [a.status for a in attempts] == ["suspended", "completed"]
    assert all(a.started_at <= timezone.now() for a in attempts)


def test_run_timers_waits_out_the_backoff_between_retries(define):
    calls = []

    def flaky(self, ctx):
        calls.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError(f"attempt {ctx.attempt} fails")
        return ctx.attempt

    workflow = define("retries_slowly", flaky=step(retries=3, backoff=timedelta(hours=1))(flaky))
    run_id = durable.start(workflow)
    drain()
    assert calls == [1]
    assert durable.get_run(run_id).status == Status.PENDING  # between attempts
    drain(run_timers=True)
    assert calls == [1, 2, 3]
    assert_completed(run_id, result=3)


def test_run_timers_starts_delayed_runs_in_due_order(define):
    order = []

    def record(self, ctx):
        order.append(ctx.input["n"])

    workflow = define("delayed_in_order", record=step(record))
    for n, hours in ((3, 30), (1, 10), (2, 20)):
        durable.start(workflow, {"n": n}, run_after=timedelta(hours=hours))
    assert drain() == 0
    assert drain(run_timers=True) == 3
    assert order == [1, 2, 3]


def test_run_timers_ends_a_debounce_period_with_the_last_input(define):
    seen = []

    def index(self, ctx):
        seen.append(ctx.input["version"])

    workflow = define(
        "debounced_index",
        debounce=durable.Debounce(period=timedelta(hours=1)),
        index=step(index),
    )
    for version in (1, 2, 3):
        durable.start(workflow, {"version": version}, key="article:1")
    assert drain() == 0
    drain(run_timers=True)
    assert seen == [3]
    assert_started(workflow, key="article:1", count=1)


def test_run_timers_times_out_a_wait(define):
    def listen(self, ctx):
        return ctx.wait_for_event("go", timeout=LONG, timeout_value="timed out")

    workflow = define("waits_long", listen=step(listen))
    run_id = durable.start(workflow)
    drain()
    assert durable.get_run(run_id).waiting_for == "event:go"
    drain(run_timers=True)
    assert_completed(run_id, result="timed out")


def test_a_run_timeout_before_the_timer_still_fails_the_run(define):
    """The clock jumps for every timer at once: a run whose own timeout falls before
    the end of its sleep times out, as it would have with the wall clock."""
    workflow = sleeper(define, "sleeps_past_its_timeout", timeout=timedelta(hours=1))
    run_id = durable.start(workflow)
    drain(run_timers=True)
    run = assert_failed(run_id, error="timeout")
    assert run.finished_at - run.created_at < LONG / 2


def test_a_wait_with_no_timer_is_left_waiting(define):
    def listen(self, ctx):
        return ctx.wait_for_event("go")

    workflow = define("waits_forever", listen=step(listen))
    run_id = durable.start(workflow)
    assert drain(max_seconds=60, run_timers=True) == 1
    assert durable.get_run(run_id).status == Status.WAITING
    durable.send_event(run_id, "go", "now")
    drain(run_timers=True)
    assert_completed(run_id, result="now")


def test_run_timers_leaves_paused_queues_alone(define):
    workflow = sleeper(define, "sleeps_in_a_paused_queue", queue="held")
    run_id = durable.start(workflow)
    durable.pause_queue("held")
    drain(run_timers=True)
    assert durable.get_run(run_id).step_index == 0
    durable.resume_queue("held")
    drain(run_timers=True)
    assert_completed(run_id)


def test_runs_of_and_assert_started(define):
    workflow = define("started_for_assertions")
    other = define("never_started")
    first = durable.start(workflow, {"value": 1}, key="a")
    durable.start(workflow, {"value": 2}, key="a")  # a duplicate: starts nothing
    second = durable.start(workflow, {"value": 3})
    assert list(runs_of(workflow).values_list("id", flat=True)) == [first, second]
    assert runs_of("started_for_assertions", status=Status.PENDING).count() == 2
    assert assert_started(workflow).id == second  # the newest
    assert assert_started(workflow, key="a", count=1).id == first
    assert assert_started(workflow, input={"value": 3}).id == second
    assert_not_started(other)
    assert_not_started(workflow, key="b")

    with pytest.raises(AssertionError, match=r"with key='a' 2 time\(s\), found 1; its runs: "):
        assert_started(workflow, key="a", count=2)
    with pytest.raises(AssertionError, match=r"input=\{'value': 2\}.*found 0.*key='a'"):
        assert_started(workflow, input={"value": 2})
    with pytest.raises(AssertionError, match="expected never_started to be started"):
        assert_started(other)
    with pytest.raises(AssertionError, match=f"found {first} key='a'"):
        assert_not_started(workflow, key="a")
    with pytest.raises(ValueError, match="assert_not_started"):
        assert_started(workflow, count=0)


def test_assert_completed_says_how_the_run_ended(define):
    workflow = define("ends_badly")
    failed = durable.start(workflow, {"fail": True})
    sleeping = durable.start(workflow, {"sleep": True})
    done = durable.start(workflow, {"value": 7})
    drain()
    assert assert_completed(done, result=7).status == Status.COMPLETED
    with pytest.raises(AssertionError, match=r"is failed \(error: .*asked to fail.*not completed"):
        assert_completed(failed)
    with pytest.raises(AssertionError, match=r"is waiting; due at .*drain\(run_timers=True\)"):
        assert_completed(sleeping)
    with pytest.raises(AssertionError, match="completed with 7, not 8"):
        assert_completed(done, result=8)
    assert isinstance(assert_failed(failed, error="asked to fail"), Run)
    with pytest.raises(AssertionError, match="does not contain 'other'"):
        assert_failed(failed, error="other")
    with pytest.raises(AssertionError, match="is completed, not failed"):
        assert_failed(done)
    with pytest.raises(Run.DoesNotExist):
        assert_completed("00000000-0000-0000-0000-000000000000")


@pytest.fixture
def namespace():
    names = {w.name for w in registry.all()}
    yield {"__name__": "docs_example"}
    for name in {w.name for w in registry.all()} - names:
        registry.unregister(name)


def test_the_testing_docs_examples_run(namespace):
    """docs/testing.md as written: the workflow, its pytest-django test (called here,
    inside this test's database transaction), and the typed step."""
    definition, its_test, typed = python_blocks("testing.md")
    exec(definition, namespace)
    exec(its_test, namespace)
    tests = [name for name in namespace if name.startswith("test_")]
    assert tests == ["test_signing_up_twice_onboards_once"]
    namespace[tests[0]]()
    assert_completed(assert_started("onboard", key="user:1").id)

    exec(typed, namespace)
    run_id = durable.start(namespace["Receipt"], {"order": 7})
    drain()
    assert_completed(run_id, result="receipt for order 7")
