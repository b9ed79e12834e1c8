"""Sagas: compensations run newest first when a step fails for good."""

import pytest
from django.core.exceptions import ImproperlyConfigured

import django_durable as durable
from django_durable import Workflow, step, store
from django_durable.models import Run, StepAttempt
from django_durable.runtime.compensation import lost_step
from django_durable.testing import drain
from tests.testapp.models import SideEffect
from tests.testapp.workflows_engine import BookTrip, SlowUndo

pytestmark = pytest.mark.django_db


def effects(run_id):
    return list(
        SideEffect.objects.filter(run_id=run_id).order_by("id").values_list("step", flat=True)
    )


def compensation_attempts(run_id):
    return list(
        StepAttempt.objects.filter(run_id=run_id, kind="compensation")
        .order_by("id")
        .values_list("step", "step_index", "attempt", "status")
    )


def test_completed_steps_are_undone_newest_first():
    run_id = durable.start(BookTrip, {"fail_at": "charge"}, key="trip:1")
    drain()
    run = durable.get_run(run_id)
    assert run.status == "compensated"
    # charge failed twice (retries=1); hotel then flight undone; notify has no undo.
    assert effects(run_id) == [
        "book_flight",
        "notify",
        "book_hotel",
        "charge-1",
        "charge-2",
        "cancel_hotel-1",
        "cancel_flight-1",
    ]
    assert compensation_attempts(run_id) == [
        ("cancel_hotel", 2, 1, "completed"),
        ("cancel_flight", 0, 1, "completed"),
    ]
    # The original error is kept, and says which step failed.
    assert run.error["type"] == "RuntimeError"
    assert run.error["message"] == "charge failed"
    assert run.error["step"] == "charge"
    assert "compensation" not in run.error
    assert run.finished_at is not None
    # The compensation's return value is recorded; the failed step is not compensated.
    undo = StepAttempt.objects.get(run_id=run_id, kind="compensation", step="cancel_flight")
    assert undo.output == {"cancelled": "F1"}
    # Still the holder: compensated frees the key only as reuse says (after_close: free).
    assert run.holds_key


def test_the_failed_step_itself_is_not_compensated():
    run_id = durable.start(BookTrip, {"fail_at": "book_hotel"})
    drain()
    assert durable.get_run(run_id).status == "compensated"
    assert effects(run_id)[-1] == "cancel_flight-1"
    assert "cancel_hotel-1" not in effects(run_id)


def test_failure_with_nothing_to_undo_just_fails():
    run_id = durable.start(BookTrip, {"fail_at": "book_flight"})
    drain()
    run = durable.get_run(run_id)
    assert run.status == "failed"
    assert compensation_attempts(run_id) == []


def test_compensation_retries_then_succeeds():
    run_id = durable.start(
        BookTrip, {"fail_at": "charge", "fail_undo": "cancel_hotel", "undo_failures": 2}
    )
    drain()
    assert durable.get_run(run_id).status == "compensated"
    assert compensation_attempts(run_id) == [
        ("cancel_hotel", 2, 1, "failed"),
        ("cancel_hotel", 2, 2, "failed"),
        ("cancel_hotel", 2, 3, "completed"),
        ("cancel_flight", 0, 1, "completed"),
    ]


def test_a_compensation_failing_for_good_ends_compensation_failed():
    run_id = durable.start(BookTrip, {"fail_at": "charge", "fail_undo": "cancel_hotel"})
    drain()
    run = durable.get_run(run_id)
    assert run.status == "compensation_failed"
    # compensate_retries=2: three attempts, then the remaining undo is left for a person.
    assert [a[2] for a in compensation_attempts(run_id)] == [1, 2, 3]
    assert "cancel_flight-1" not in effects(run_id)
    # The original error stays; the compensation's is added.
    assert run.error["message"] == "charge failed"
    assert run.error["compensation"]["message"] == "cancel_hotel could not undo"
    assert run.error["compensation"]["method"] == "cancel_hotel"
    assert run.error["compensation"]["step"] == "book_hotel"


def test_compensation_retries_default_to_the_step_retries():
    # book_flight has no retries and no compensate_retries: one attempt.
    run_id = durable.start(BookTrip, {"fail_at": "charge", "fail_undo": "cancel_flight"})
    drain()
    assert durable.get_run(run_id).status == "compensation_failed"
    assert [a[0] for a in compensation_attempts(run_id)] == ["cancel_hotel", "cancel_flight"]


def test_compensating_run_holds_its_key_and_cannot_be_cancelled():
    run_id = durable.start(SlowUndo, key="undo:1")
    drain()
    run = durable.get_run(run_id)
    # The undo failed once and waits an hour for its retry: still compensating.
    assert run.status == "compensating"
    assert run.holds_key
    assert run.worker_id is None and run.due_at is not None
    with pytest.raises(durable.NotCancellable):
        durable.cancel(run_id)
    with pytest.raises(durable.AlreadyFinished):  # NotCancellable is an AlreadyFinished
        durable.cancel(run_id)
    # cancel_existing (SlowUndo's default) can't replace a compensating holder.
    with pytest.raises(durable.KeyTaken) as taken:
        durable.start(SlowUndo, key="undo:1")
    assert taken.value.holder_id == run_id
    assert durable.start(SlowUndo, key="undo:1", on_duplicate="use_existing") == run_id
    assert Run.objects.filter(workflow="slow_undo").count() == 1
    # release_key refuses a run that is still going.
    with pytest.raises(durable.NotFinished):
        durable.release_key(run_id)


def test_compensating_run_is_claimed_again_when_due(settings):

    run_id = durable.start(SlowUndo, key="undo:2")
    drain()
    Run.objects.filter(id=run_id).update(due_at=store.now())
    drain()
    run = durable.get_run(run_id)
    assert run.status == "compensation_failed"
    assert [a[2] for a in compensation_attempts(run_id)] == [1, 2]
    assert run.holds_key  # after_close: the next start may take it
    new_id = durable.start(SlowUndo, key="undo:2")
    assert new_id != run_id


def test_claim_keeps_a_compensating_run_compensating():
    from datetime import timedelta

    run_id = durable.start(SlowUndo, key="undo:3")
    drain()
    Run.objects.filter(id=run_id).update(due_at=store.now())
    [claimed] = store.claim(worker_id="w1", queues=None, limit=5, lease=timedelta(seconds=30))
    assert claimed.id == run_id
    run = durable.get_run(run_id)
    assert run.status == "compensating"
    assert run.worker_id == "w1" and run.due_at is None
    # Owned: not claimable again; cancel still refused.
    assert store.claim(worker_id="w2", queues=None, limit=5, lease=timedelta(seconds=30)) == []
    with pytest.raises(durable.NotCancellable):
        durable.cancel(run_id)


def test_an_expired_compensation_lease_is_recovered_still_compensating():
    from datetime import timedelta

    run_id = durable.start(SlowUndo, key="undo:4")
    drain()
    Run.objects.filter(id=run_id).update(due_at=store.now())
    store.claim(worker_id="dead", queues=None, limit=1, lease=timedelta(seconds=30))
    Run.objects.filter(id=run_id).update(lease_expires_at=store.now() - timedelta(seconds=1))
    assert run_id in store.recover_expired_leases(3, compensation_step=lost_step).ids
    run = durable.get_run(run_id)
    assert run.status == "compensating" and run.worker_id is None and run.due_at is not None
    assert run.holds_key
    lost = StepAttempt.objects.get(run_id=run_id, status="lost")
    assert lost.kind == "compensation" and lost.step_index == 0


class TimedTrip(Workflow):
    timeout = durable.hours(1)

    @step(compensate="unbook")
    def book(self, ctx):
        return "booked"

    @step
    def linger(self, ctx):
        ctx.sleep(durable.hours(2))

    def unbook(self, ctx):
        effect_note(ctx)


def effect_note(ctx):
    SideEffect.objects.create(run_id=ctx.run_id, step="unbook")


def test_a_timeout_compensates_completed_steps():

    run_id = durable.start(TimedTrip)
    drain()
    assert durable.get_run(run_id).status == "waiting"
    Run.objects.filter(id=run_id).update(timeout_at=store.now(), due_at=store.now())
    drain()
    run = durable.get_run(run_id)
    assert run.status == "compensated"
    assert run.error["type"] == "Timeout"
    assert effects(run_id) == ["unbook"]


class UndoStartsRuns(Workflow):
    name = "undo_starts_runs"

    @step(compensate="undo")
    def book(self, ctx):
        return "booked"

    @step
    def fail(self, ctx):
        raise RuntimeError("fails for good")

    def undo(self, ctx):
        if ctx.input["call"] == "call_workflow":
            ctx.call_workflow(TimedTrip)
        else:
            ctx.start(TimedTrip)


@pytest.mark.parametrize("call", ["call_workflow", "start"])
def test_a_compensation_starts_no_run(call):
    """A compensation cannot wait for a child, and a run it started would outlive an
    undo that runs again: its ctx refuses before anything is written."""
    run_id = durable.start(UndoStartsRuns, {"call": call})
    drain()
    run = durable.get_run(run_id)
    assert run.status == "compensation_failed"
    assert run.error["compensation"]["type"] == "RuntimeError"
    assert "not from a compensation" in run.error["compensation"]["message"]
    assert list(Run.objects.values_list("id", flat=True)) == [run_id]


def test_compensate_must_name_a_method():
    with pytest.raises(ImproperlyConfigured, match="not a method"):

        class Broken(Workflow):
            @step(compensate="nope")
            def one(self, ctx):
                pass

    with pytest.raises(ImproperlyConfigured, match="compensate_retries"):

        class Broken2(Workflow):
            @step(compensate="undo", compensate_retries=-1)
            def one(self, ctx):
                pass

            def undo(self, ctx):
                pass
