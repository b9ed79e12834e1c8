"""Waits: ctx.sleep, ctx.wait_for_event, ctx.wait_for_input; send_event and provide_input."""

import threading
import time

import pytest
from django.db import connection

import django_durable as durable
from django_durable.models import Event, Status, StepAttempt
from django_durable.testing import drain
from tests.helpers import fresh
from tests.testapp.models import SideEffect
from tests.testapp.workflows import (
    BlocksThenWaits,
    Sleeper,
    TwoWaits,
    WaitsForApproval,
    WaitsForEvent,
    gate,
)

pytestmark = pytest.mark.django_db


def test_sleep_suspends_and_frees_the_worker_then_resumes_from_the_step_start():
    run_id = durable.start(Sleeper, {"seconds": 1})
    assert drain() == 1
    run = fresh(run_id)
    assert run.status == Status.WAITING
    assert run.waiting_for == "sleep"
    assert run.worker_id is None and run.lease_expires_at is None
    # Not due yet: nothing runs.
    assert drain() == 0
    time.sleep(1.1)
    assert drain() == 1
    run = fresh(run_id)
    assert run.status == Status.COMPLETED
    assert run.result == "rested"
    # The step began twice: once before the sleep, once on resume.
    assert sorted(SideEffect.objects.filter(run_id=run_id).values_list("step", flat=True)) == [
        "nap-0",
        "nap-1",
    ]
    outcomes = list(
        StepAttempt.objects.filter(run_id=run_id).order_by("id").values_list("status", flat=True)
    )
    assert outcomes == ["suspended", "completed"]


def test_sleep_keeps_the_key():
    run_id = durable.start(Sleeper, {"seconds": 60}, key="nap:1")
    drain()
    assert fresh(run_id).status == Status.WAITING
    assert fresh(run_id).holds_key
    assert durable.start(Sleeper, {"seconds": 60}, key="nap:1") == run_id


def test_event_resumes_a_waiting_run():
    run_id = durable.start(WaitsForEvent, {})
    drain()
    run = fresh(run_id)
    assert (run.status, run.waiting_for, run.due_at) == (Status.WAITING, "event:go", None)
    durable.send_event(run_id, "go", {"n": 1})
    assert fresh(run_id).status == Status.PENDING
    drain()
    run = fresh(run_id)
    assert run.status == Status.COMPLETED
    assert run.result == {"n": 1}


def test_event_wait_times_out_with_the_timeout_value():
    run_id = durable.start(WaitsForEvent, {"timeout": 1})
    drain()
    assert fresh(run_id).status == Status.WAITING
    time.sleep(1.1)
    drain()
    run = fresh(run_id)
    assert run.status == Status.COMPLETED
    assert run.result == "timed out"


def test_send_event_to_a_run_not_waiting_raises_not_waiting_unless_buffered():
    run_id = durable.start(WaitsForEvent, {})
    with pytest.raises(durable.NotWaiting):
        durable.send_event(run_id, "go", {"n": 1})
    assert not Event.objects.filter(run_id=run_id).exists()
    durable.send_event(run_id, "go", {"n": 2}, buffer=True)
    drain()
    # The kept event was there when the run reached its wait: it never suspended.
    run = fresh(run_id)
    assert run.status == Status.COMPLETED
    assert run.result == {"n": 2}


def test_the_newest_of_several_kept_events_wins_and_later_ones_are_never_read():
    run_id = durable.start(WaitsForEvent, {})
    for n in (1, 2, 3):
        durable.send_event(run_id, "go", {"n": n}, buffer=True)
    drain()
    assert fresh(run_id).result == {"n": 3}
    delivered = Event.objects.filter(run_id=run_id, delivered_at__isnull=False)
    assert [e.payload for e in delivered] == [{"n": 3}]


def test_a_run_gets_one_event_per_name():
    run_id = durable.start(TwoWaits, {})
    drain()
    durable.send_event(run_id, "first", "a")
    drain()
    assert fresh(run_id).waiting_for == "event:second"
    # A second "first" event is kept but the run already has one.
    durable.send_event(run_id, "first", "ignored", buffer=True)
    durable.send_event(run_id, "second", "b")
    drain()
    run = fresh(run_id)
    assert run.status == Status.COMPLETED
    assert run.result == ["a", "b"]


def test_wait_for_input_and_provide_input():
    run_id = durable.start(WaitsForApproval, {})
    with pytest.raises(durable.NotWaiting):
        durable.provide_input(run_id, "approval", {"by": "early"})
    drain()
    assert fresh(run_id).waiting_for == "input:approval"
    with pytest.raises(durable.NotWaiting):
        durable.provide_input(run_id, "other", 1)
    with pytest.raises(durable.NotWaiting):
        durable.send_event(run_id, "approval", 1)  # an event is not an input
    durable.provide_input(run_id, "approval", {"by": "ops@example.com"})
    drain()
    run = fresh(run_id)
    assert run.status == Status.COMPLETED
    assert run.result == {"approved_by": "ops@example.com"}


def test_waits_validate_their_arguments_before_writing():
    run_id = durable.start(WaitsForEvent, {})
    drain()
    with pytest.raises(TypeError):
        durable.send_event(run_id, "go", object())
    with pytest.raises(ValueError):
        durable.send_event(run_id, "", 1)
    assert not Event.objects.exists()
    assert fresh(run_id).status == Status.WAITING


def test_a_cancelled_waiting_run_is_finished_and_refuses_events():
    run_id = durable.start(WaitsForEvent, {})
    drain()
    durable.cancel(run_id, reason="no longer needed")
    assert fresh(run_id).status == Status.CANCELLED
    with pytest.raises(durable.NotWaiting):
        durable.send_event(run_id, "go", 1, buffer=True)


@pytest.mark.django_db(transaction=True)
def test_an_event_sent_mid_step_is_not_lost():
    """The event arrives while the step still runs (before it waits): it is kept and
    delivered when the step reaches the wait, whichever of the two commits first."""
    run_id = durable.start(BlocksThenWaits, {"gate": "mid-step"})
    steps = []

    def worker():
        try:
            steps.append(drain(max_seconds=20))
        finally:
            connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    deadline = time.monotonic() + 10
    while fresh(run_id).status != Status.RUNNING and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fresh(run_id).status == Status.RUNNING
    durable.send_event(run_id, "article_updated", {"rev": 9}, buffer=True)
    gate("mid-step").set()
    thread.join(20)
    assert not thread.is_alive()
    run = fresh(run_id)
    assert run.status == Status.COMPLETED
    assert run.result == {"rev": 9}
