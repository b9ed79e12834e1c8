"""ctx.wait_for_any and ctx.wait_for_all: any of several events, all of them over
several deliveries, buffered events, timeouts (moved into the past in the
database, never slept for), replay when the step runs again, and async steps."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

import django_durable as durable
from django_durable import step
from django_durable.models import Event, Run, Status, StepAttempt
from django_durable.testing import drain
from tests.helpers import fresh
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db


def time_passes(run_id):
    """The wait's timeout passes: its due time moved into the past in the database."""
    assert fresh(run_id).due_at is not None
    Run.objects.filter(id=run_id).update(due_at=timezone.now() - timedelta(seconds=1))


def effect(ctx, what):
    Execution.objects.create(run_id=ctx.run_id, step=what)


def effects(run_id):
    return list(
        Execution.objects.filter(run_id=run_id).order_by("id").values_list("step", flat=True)
    )


@pytest.fixture
def any_of(define):
    def wait(self, ctx):
        effect(ctx, "began")
        name, payload = ctx.wait_for_any(
            ["approved", "rejected"], timeout=durable.hours(1), timeout_value="nobody"
        )
        return [name, payload]

    return define("waits_for_any", wait=step(wait))


@pytest.fixture
def all_of(define):
    def wait(self, ctx):
        effect(ctx, "began")
        try:
            got = ctx.wait_for_all(["paid", "packed", "labelled"], timeout=durable.hours(1))
        except durable.WaitTimeout as exc:
            if ctx.input.get("catch"):
                return {"received": exc.received, "missing": exc.missing}
            raise
        return got

    return define("waits_for_all", wait=step(wait))


@pytest.mark.parametrize("name", ["approved", "rejected"])
def test_any_of_resumes_with_whichever_event_comes(any_of, name):
    run_id = durable.start(any_of)
    drain()
    run = fresh(run_id)
    assert (run.status, run.waiting_for) == (Status.WAITING, "any:approved, rejected")
    durable.send_event(run_id, name, {"by": "ops"})
    assert fresh(run_id).status == Status.PENDING
    other = {"approved": "rejected", "rejected": "approved"}[name]
    with pytest.raises(durable.NotWaiting):
        durable.send_event(run_id, other, {"by": "late"})  # the wait is answered
    drain()
    run = fresh(run_id)
    assert (run.status, run.result) == (Status.COMPLETED, [name, {"by": "ops"}])
    assert effects(run_id) == ["began", "began"]  # the step ran again from its start


def test_any_of_refuses_an_event_it_does_not_name(any_of):
    run_id = durable.start(any_of)
    drain()
    with pytest.raises(durable.NotWaiting):
        durable.send_event(run_id, "archived", 1)
    assert fresh(run_id).status == Status.WAITING
    assert not Event.objects.filter(run_id=run_id).exists()


def test_any_of_is_answered_at_once_by_a_buffered_event(any_of):
    run_id = durable.start(any_of)
    durable.send_event(run_id, "rejected", {"reason": "spam"}, buffer=True)
    drain()
    run = fresh(run_id)
    assert (run.status, run.result) == (Status.COMPLETED, ["rejected", {"reason": "spam"}])
    outcomes = StepAttempt.objects.filter(run_id=run_id).order_by("id")
    # The kept event was delivered as the run suspended: due at once, no waiting.
    assert [a.status for a in outcomes] == ["suspended", "completed"]
    assert Event.objects.get(run_id=run_id).delivered_at is not None


def test_any_of_takes_the_newest_of_several_buffered_events(any_of):
    run_id = durable.start(any_of)
    durable.send_event(run_id, "approved", 1, buffer=True)
    durable.send_event(run_id, "rejected", 2, buffer=True)
    durable.send_event(run_id, "approved", 3, buffer=True)
    drain()
    assert fresh(run_id).result == ["approved", 3]


def test_any_of_times_out_with_the_timeout_value(any_of):
    run_id = durable.start(any_of)
    drain()
    assert drain() == 0  # not due before its timeout
    time_passes(run_id)
    drain()
    run = fresh(run_id)
    assert (run.status, run.result) == (Status.COMPLETED, [None, "nobody"])
    with pytest.raises(durable.NotWaiting):
        durable.send_event(run_id, "approved", 1)


def test_all_of_arrives_over_several_deliveries_in_any_order(all_of):
    run_id = durable.start(all_of)
    drain()
    assert fresh(run_id).waiting_for == "all:paid, packed, labelled"
    durable.send_event(run_id, "labelled", {"n": 3})
    run = fresh(run_id)
    # A partial delivery is kept in the database; the run still waits for the rest.
    assert (run.status, run.waiting_for) == (Status.WAITING, "all:paid, packed")
    assert run.state["received"] == {"event:labelled": {"n": 3}}
    with pytest.raises(durable.NotWaiting):
        durable.send_event(run_id, "labelled", {"n": 4})  # one event per name
    assert drain() == 0
    durable.send_event(run_id, "paid", {"n": 1})
    assert fresh(run_id).waiting_for == "all:packed"
    durable.send_event(run_id, "packed", {"n": 2})
    assert fresh(run_id).status == Status.PENDING
    drain()
    run = fresh(run_id)
    assert run.status == Status.COMPLETED
    assert run.result == {"paid": {"n": 1}, "packed": {"n": 2}, "labelled": {"n": 3}}
    assert effects(run_id) == ["began", "began"]


def test_all_of_takes_buffered_events_and_waits_for_the_others(all_of):
    run_id = durable.start(all_of)
    durable.send_event(run_id, "packed", "box", buffer=True)
    durable.send_event(run_id, "paid", "card", buffer=True)
    drain()
    assert (fresh(run_id).status, fresh(run_id).waiting_for) == (Status.WAITING, "all:labelled")
    durable.send_event(run_id, "labelled", "label")
    drain()
    assert fresh(run_id).result == {"paid": "card", "packed": "box", "labelled": "label"}


def test_all_of_timing_out_raises_wait_timeout_that_the_step_can_catch(all_of):
    run_id = durable.start(all_of, {"catch": True})
    drain()
    durable.send_event(run_id, "packed", "box")
    time_passes(run_id)
    drain()
    run = fresh(run_id)
    assert run.status == Status.COMPLETED
    assert run.result == {"received": {"packed": "box"}, "missing": ["paid", "labelled"]}


def test_all_of_timing_out_uncaught_fails_the_attempt(all_of):
    run_id = durable.start(all_of)
    drain()
    time_passes(run_id)
    drain()
    run = fresh(run_id)
    assert run.status == Status.FAILED
    assert run.error["type"] == "WaitTimeout"
    assert "'paid', 'packed', 'labelled'" in run.error["message"]
    assert isinstance(durable.WaitTimeout("x"), durable.DurableError)


def test_each_wait_returns_its_recorded_value_when_the_step_runs_again(define):
    def both(self, ctx):
        effect(ctx, "began")
        first = ctx.wait_for_any(["a", "b"])
        effect(ctx, f"got {first[0]}")
        rest = ctx.wait_for_all(["c", "d"])
        ctx.sleep(0)
        return {"first": list(first), "rest": rest}

    run_id = durable.start(define("waits_twice", both=step(both)))
    drain()
    durable.send_event(run_id, "b", 2)
    drain()
    durable.send_event(run_id, "d", 4)
    durable.send_event(run_id, "c", 3)
    drain()
    drain()
    run = fresh(run_id)
    assert run.result == {"first": ["b", 2], "rest": {"c": 3, "d": 4}}
    assert effects(run_id) == ["began", "began", "got b", "began", "got b", "began", "got b"]


def test_an_event_received_earlier_in_the_run_answers_at_once(define):
    def first(self, ctx):
        return ctx.wait_for_event("b")

    def second(self, ctx):
        return [list(ctx.wait_for_any(["a", "b"])), ctx.wait_for_all(["b"])]

    run_id = durable.start(define("reuses_events", first=step(first), second=step(second)))
    drain()
    durable.send_event(run_id, "b", "bee")
    drain()
    run = fresh(run_id)
    assert (run.status, run.result) == (Status.COMPLETED, [["b", "bee"], {"b": "bee"}])


@pytest.mark.parametrize(
    ("names", "error"),
    [
        ("approved", TypeError),
        ({"a": 1}, TypeError),
        ([], ValueError),
        (["a", "a"], ValueError),
        (["a", ""], ValueError),
        (["a", 3], ValueError),
        (["a" * 201], ValueError),
    ],
)
def test_bad_names_are_refused_at_the_call(define, names, error):
    caught = []

    def wait(self, ctx):
        for call in (ctx.wait_for_any, ctx.wait_for_all):
            try:
                call(names)
            except error as exc:
                caught.append(exc)
        return "went on"

    run_id = durable.start(define("waits_badly", wait=step(wait)))
    drain()
    assert (fresh(run_id).status, len(caught)) == (Status.COMPLETED, 2)


def test_an_async_step_waits_for_any(define):
    async def listen(self, ctx):
        name, payload = ctx.wait_for_any(["go", "stop"], timeout=durable.hours(1))
        return {"name": name, "payload": payload}

    run_id = durable.start(define("async_any", listen=step(listen)))
    drain()
    assert (fresh(run_id).status, fresh(run_id).waiting_for) == (Status.WAITING, "any:go, stop")
    durable.send_event(run_id, "stop", {"why": "done"})
    drain()
    run = fresh(run_id)
    assert (run.status, run.result) == (
        Status.COMPLETED,
        {"name": "stop", "payload": {"why": "done"}},
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_all_of_sent_at_the_same_moment_from_two_threads_resumes_once_with_both(all_of):
    """Each delivery locks the run's row: two events arriving together are both kept
    (neither overwrites the other's partial state) and the run resumes once."""
    run_id = durable.start(all_of)
    drain()
    durable.send_event(run_id, "labelled", "label")
    barrier = threading.Barrier(2)
    errors = []

    def send(name):
        try:
            barrier.wait(10)
            durable.send_event(run_id, name, name.upper())
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(n,)) for n in ("paid", "packed")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert fresh(run_id).status == Status.PENDING
    drain()
    run = fresh(run_id)
    assert run.result == {"paid": "PAID", "packed": "PACKED", "labelled": "label"}
    assert Event.objects.filter(run_id=run_id, delivered_at__isnull=False).count() == 3
