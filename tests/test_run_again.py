"""on_duplicate="run_again": one run waits behind the holder, with the newest input."""

import threading
from datetime import timedelta

import pytest
from django.db import connection

import django_durable as durable
from django_durable import activity, store
from django_durable.models import Run, Status
from django_durable.operations import finish as lifecycle
from django_durable.testing import drain
from tests.helpers import fresh, pick_up, run_claimed
from tests.testapp.workflows import RebuildIndex, RebuildOnce

pytestmark = pytest.mark.django_db


def started_holder(workflow, key, v=1):
    """A holder that a worker has picked up (claimed), but not finished."""
    holder = durable.start(workflow, {"v": v}, key=key)
    return pick_up(holder)


def test_one_run_waits_however_many_starts_arrive_with_the_newest_input():
    holder = started_holder(RebuildIndex, "account:7")
    first = durable.start_detailed(RebuildIndex, {"v": 2}, key="account:7")
    assert first.outcome == "run_again"
    for v in (3, 4, 5):
        assert durable.start(RebuildIndex, {"v": v}, key="account:7") == first.run_id
    waiting = fresh(first.run_id)
    assert waiting.input == {"v": 5}
    assert waiting.runs_after_id == holder.id
    assert not waiting.holds_key
    assert waiting.status == Status.PENDING and waiting.due_at is None
    assert Run.objects.filter(key="account:7").count() == 2
    dup = activity.list(kinds=["key_duplicate"])[0]
    assert dup.details["outcome"] == "run_again"
    assert dup.details["runs_after"] == str(holder.id)
    assert dup.details["input"] == {"v": 5}

    # The waiting run is not claimable while it waits.
    assert store.claim(worker_id="other", queues=None, limit=10, lease=timedelta(seconds=5)) == []
    # When the holder ends, the waiting run takes the key and runs.
    run_claimed(holder)
    waiting = fresh(first.run_id)
    assert waiting.holds_key and waiting.due_at is not None
    assert not fresh(holder.id).holds_key
    drain()
    assert fresh(first.run_id).status == Status.COMPLETED
    assert fresh(first.run_id).result == 5
    handoffs = activity.list(kinds=["key_handed_off"])
    assert handoffs[0].details["to_run_id"] == str(first.run_id)


def test_a_holder_nobody_picked_up_takes_the_newer_input_itself():
    holder = durable.start(RebuildIndex, {"v": 1}, key="account:8")
    result = durable.start_detailed(RebuildIndex, {"v": 2}, key="account:8")
    assert result == (holder, "run_again")
    assert fresh(holder).input == {"v": 2}
    assert Run.objects.count() == 1
    assert "runs_after" not in activity.list()[0].details


def test_after_close_the_waiting_run_goes_after_a_failed_holder():
    holder = durable.start(RebuildIndex, {"v": 1, "fail": True}, key="a")
    claimed = pick_up(holder)
    waiting = durable.start(RebuildIndex, {"v": 2}, key="a")
    run_claimed(claimed)
    assert fresh(holder).status == Status.FAILED
    drain()
    assert fresh(waiting).status == Status.COMPLETED
    assert fresh(waiting).holds_key


def test_after_failure_the_waiting_run_is_cancelled_when_the_holder_completed():
    claimed = started_holder(RebuildOnce, "b")
    waiting = durable.start(RebuildOnce, {"v": 2}, key="b")
    run_claimed(claimed)
    assert fresh(claimed.id).status == Status.COMPLETED
    assert fresh(claimed.id).holds_key
    run = fresh(waiting)
    assert run.status == Status.CANCELLED
    assert run.error["type"] == "KeyKept"
    assert "after_failure" in run.error["message"]


def test_cancelling_the_holder_lets_the_waiting_run_go():
    claimed = started_holder(RebuildIndex, "c")
    waiting = durable.start(RebuildIndex, {"v": 2}, key="c")
    durable.cancel(claimed.id)
    assert fresh(waiting).holds_key
    drain()
    assert fresh(waiting).status == Status.COMPLETED


def test_the_waiting_run_waits_behind_an_interloper():
    claimed = started_holder(RebuildIndex, "d")
    waiting = durable.start(RebuildIndex, {"v": 2}, key="d")
    # The holder's worker records its last step and dies before handing the key on.
    store.record_step_completed(claimed, "rebuild", store.now(), 1, last=True, state={})
    # Meanwhile another start takes the free key (after_close hands it off).
    interloper = durable.start_detailed(RebuildIndex, {"v": 3}, key="d")
    assert interloper.outcome == "handed_off"
    lifecycle.sweep_waiting()
    assert fresh(waiting).runs_after_id == interloper.run_id
    assert not fresh(waiting).holds_key
    drain()  # runs the interloper, then the waiting run behind it
    assert fresh(interloper.run_id).status == Status.COMPLETED
    assert fresh(waiting).status == Status.COMPLETED


def test_the_waiting_runs_timeout_counts_from_when_it_takes_the_key():
    claimed = started_holder(RebuildOnce, "e")
    waiting = durable.start(RebuildOnce, {"v": 2}, key="e")
    assert fresh(waiting).timeout_at is None
    Run.objects.filter(id=claimed.id).update(status=Status.RUNNING)
    store.record_step_failed(
        claimed, "rebuild", store.now(), {"type": "X"}, retry_at=None, state={}
    )
    before = store.now()
    lifecycle.promote_waiting("rebuild_once", "e")
    run = fresh(waiting)
    assert run.holds_key
    assert before + timedelta(minutes=10) <= run.timeout_at <= store.now() + timedelta(minutes=10)


def test_run_again_with_reuse_never_is_refused_before_writing():
    from tests.testapp.workflows import SendInvoice

    with pytest.raises(ValueError):
        durable.start(SendInvoice, {}, key="x", on_duplicate="run_again")
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_twelve_threads_starting_while_the_holder_finishes_never_leave_two_waiting():
    claimed = started_holder(RebuildIndex, "race")
    barrier = threading.Barrier(13)
    answers, errors = [], []

    def start(n):
        try:
            barrier.wait()
            for _ in range(20):
                try:
                    answers.append(durable.start_detailed(RebuildIndex, {"v": n}, key="race"))
                    return
                except durable.KeyContended:
                    continue
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    def finish():
        try:
            barrier.wait()
            run_claimed(claimed)
        except Exception as exc:  # pragma: no cover
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=start, args=(n,)) for n in range(12)]
    threads.append(threading.Thread(target=finish))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(answers) == 12
    runs = Run.objects.filter(key="race")
    assert runs.filter(holds_key=True).count() == 1
    waiting = runs.filter(holds_key=False, runs_after__isnull=False, status=Status.PENDING)
    assert waiting.count() <= 1
    # Every start was answered by a run that exists, and no start was lost: the
    # holder's finish plus at most one waiting run plus hand-offs account for all.
    assert {a.run_id for a in answers} <= set(runs.values_list("id", flat=True))
    drain()
    assert not runs.filter(status__in=[Status.PENDING, Status.RUNNING]).exists()
