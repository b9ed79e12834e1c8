"""get_run, list_executions, cancel, retry, rerun and release_key."""

import uuid

import pytest

import django_durable as durable
from django_durable import step
from django_durable.activity import list as list_activity
from django_durable.models import Run, Status
from django_durable.testing import drain
from tests.helpers import holder_in
from tests.testapp.models import SideEffect

pytestmark = pytest.mark.django_db


def fails_until_allowed(self, ctx):
    if not SideEffect.objects.filter(run_id=ctx.run_id, step="allowed").exists():
        raise RuntimeError("not allowed yet")
    return "done"


@pytest.fixture
def gated(define):
    """A workflow factory whose runs fail until ``allow(run_id)``."""

    def make(reuse):
        return define(f"gated_{reuse}", reuse=reuse, work=step(fails_until_allowed))

    return make


def allow(run_id):
    SideEffect.objects.create(run_id=run_id, step="allowed")


def failed_run(workflow, key="item:1"):
    run_id = durable.start(workflow, {}, key=key)
    drain()
    assert durable.get_run(run_id).status == Status.FAILED
    return run_id


# --- get_run and list_executions ----------------------------------------------


def test_get_run_returns_the_model_and_raises_does_not_exist():
    run_id = durable.start("sync_account", {"id": 7}, key="account:7")
    run = durable.get_run(run_id)
    assert isinstance(run, Run)
    assert (run.id, run.workflow, run.input, run.key, run.holds_key) == (
        run_id,
        "sync_account",
        {"id": 7},
        "account:7",
        True,
    )
    assert durable.get_run(str(run_id)).id == run_id
    with pytest.raises(Run.DoesNotExist):
        durable.get_run(uuid.uuid4())


def test_list_executions_shows_every_run_of_a_key_and_which_holds_it():
    first = durable.start("sync_account", {}, key="account:7")
    drain()
    second = durable.start("sync_account", {}, key="account:7")
    durable.start("sync_account", {}, key="account:8")
    durable.start("process_article", {}, key="account:7")

    runs = durable.list_executions(key="account:7", workflow="sync_account")
    assert [(r.id, r.holds_key) for r in runs] == [(second, True), (first, False)]
    from tests.testapp.workflows import SyncAccount

    assert [r.id for r in durable.list_executions(key="account:7", workflow=SyncAccount)] == [
        second,
        first,
    ]
    assert durable.list_executions(key="account:7").count() == 3
    assert [r.id for r in durable.list_executions(status="completed")] == [first]
    assert durable.list_executions(workflow="sync_account").count() == 3
    assert durable.list_executions(key="account:7").filter(holds_key=True).count() == 2


# --- cancel --------------------------------------------------------------------


@pytest.mark.parametrize("status", [Status.PENDING, Status.RUNNING, Status.WAITING])
def test_cancel_stops_a_run_that_keeps_its_key(define, status):
    workflow = define("keyed", reuse="never")
    run_id = holder_in(workflow, status, "item:1")
    durable.cancel(run_id, reason="changed my mind")
    run = durable.get_run(run_id)
    assert (run.status, run.holds_key) == (Status.CANCELLED, True)
    assert run.error["reason"] == "changed my mind"
    assert run.finished_at is not None and run.due_at is None
    assert drain() == 0
    # Under reuse="never" the cancelled run keeps answering for its key.
    assert durable.start(workflow, {}, key="item:1") == run_id


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.FAILED, Status.CANCELLED])
def test_cancel_refuses_a_finished_run(define, status):
    run_id = holder_in(define("keyed"), status, "item:1")
    with pytest.raises(durable.AlreadyFinished):
        durable.cancel(run_id)
    assert durable.get_run(run_id).status == status


def test_cancel_refuses_a_compensating_run(define):
    run_id = holder_in(define("keyed"), Status.COMPENSATING, "item:1")
    with pytest.raises(durable.AlreadyFinished):
        durable.cancel(run_id)
    assert durable.get_run(run_id).status == Status.COMPENSATING


# --- retry ---------------------------------------------------------------------


def test_retry_resumes_a_failed_run_that_still_holds_its_key(gated):
    workflow = gated("after_failure")
    run_id = failed_run(workflow)
    allow(run_id)
    assert durable.retry(run_id) == run_id
    run = durable.get_run(run_id)
    assert (run.status, run.holds_key, run.attempt) == (Status.PENDING, True, 1)
    assert drain() == 1
    assert durable.get_run(run_id).status == Status.COMPLETED
    assert not list_activity(kinds=["key_retaken"])  # nothing changed hands


def test_retry_takes_the_key_back_from_a_finished_newer_run(gated):
    workflow = gated("after_close")
    old = failed_run(workflow)
    newer = durable.start(workflow, {}, key="item:1")  # after_close: the failed run lets go
    allow(newer)
    drain()
    assert durable.get_run(newer).status == Status.COMPLETED

    allow(old)
    assert durable.retry(old) == old
    assert (durable.get_run(old).holds_key, durable.get_run(newer).holds_key) == (True, False)
    [retaken] = list_activity(kinds=["key_retaken"])
    assert retaken.run_id == old
    assert retaken.details == {
        "key": "item:1",
        "workflow": "gated_after_close",
        "from_run_id": str(newer),
    }
    drain()
    assert durable.get_run(old).status == Status.COMPLETED


def test_retry_is_refused_while_a_newer_run_holds_the_key(gated):
    workflow = gated("after_close")
    old = failed_run(workflow)
    newer = durable.start(workflow, {}, key="item:1")  # pending: still going
    with pytest.raises(durable.KeyTaken) as raised:
        durable.retry(old)
    assert raised.value.holder_id == newer
    run = durable.get_run(old)
    assert (run.status, run.holds_key) == (Status.FAILED, False)


def test_retry_is_refused_when_reuse_keeps_the_newer_runs_key(gated):
    workflow = gated("after_failure")
    old = failed_run(workflow)
    newer = durable.start(workflow, {}, key="item:1")
    allow(newer)
    drain()
    with pytest.raises(durable.KeyTaken) as raised:
        durable.retry(old)  # after_failure keeps a completed run's key
    assert raised.value.holder_id == newer
    assert durable.get_run(old).status == Status.FAILED


@pytest.mark.parametrize("status", [Status.PENDING, Status.COMPLETED, Status.CANCELLED])
def test_retry_takes_only_a_failed_run(define, status):
    run_id = holder_in(define("keyed"), status, "item:1")
    with pytest.raises(durable.NotFailed):
        durable.retry(run_id)


def test_retry_of_a_run_without_a_key(gated):
    workflow = gated("after_close")
    run_id = durable.start(workflow, {})
    drain()
    allow(run_id)
    assert durable.retry(run_id) == run_id
    drain()
    run = durable.get_run(run_id)
    assert (run.status, run.key, run.holds_key) == (Status.COMPLETED, None, False)


# --- rerun ---------------------------------------------------------------------


def test_rerun_starts_a_fresh_copy_by_the_start_rules():
    old = durable.start("sync_account", {"id": 7}, key="account:7")
    drain()
    new = durable.rerun(old)
    assert new != old
    run = durable.get_run(new)
    assert (run.workflow, run.input, run.key, run.holds_key) == (
        "sync_account",
        {"id": 7},
        "account:7",
        True,
    )
    assert list_activity(kinds=["key_handed_off"])[0].run_id == new


def test_rerun_raises_key_taken_instead_of_returning_the_holder():
    old = durable.start("sync_account", {}, key="account:7")
    drain()
    holder = durable.start("sync_account", {}, key="account:7")
    with pytest.raises(durable.KeyTaken) as raised:
        durable.rerun(old)
    assert raised.value.holder_id == holder


def test_rerun_under_reuse_never_needs_the_key_released():
    invoice = durable.start("send_invoice", {"id": "INV-1"}, key="invoice:INV-1")
    drain()
    with pytest.raises(durable.KeyTaken) as raised:
        durable.rerun(invoice)
    assert raised.value.holder_id == invoice
    durable.release_key(invoice, by="ops@example.com")
    again = durable.rerun(invoice)
    assert again != invoice and durable.get_run(again).holds_key


def test_rerun_of_a_run_without_a_key_starts_another():
    first = durable.start("noop", {"n": 1})
    drain()
    second = durable.rerun(first)
    assert second != first and durable.get_run(second).input == {"n": 1}


def test_rerun_takes_a_finished_run():
    run_id = durable.start("sync_account", {}, key="account:7")
    with pytest.raises(durable.NotFinished):
        durable.rerun(run_id)


# --- release_key -----------------------------------------------------------------


def test_release_key_frees_a_finished_runs_key_and_records_who():
    invoice = durable.start("send_invoice", {}, key="invoice:INV-1")
    drain()
    durable.release_key(invoice, by="ops@example.com")
    run = durable.get_run(invoice)
    # The released run keeps its history and its key, but holds nothing.
    assert (run.status, run.key, run.holds_key) == (Status.COMPLETED, "invoice:INV-1", False)
    [released] = list_activity(kinds=["key_released"])
    assert released.run_id == invoice
    assert released.details == {
        "key": "invoice:INV-1",
        "workflow": "send_invoice",
        "by": "ops@example.com",
    }
    # The next start takes the free key: a plain start, nobody handed it over.
    assert durable.start_detailed("send_invoice", {}, key="invoice:INV-1").outcome == "started"


def test_release_key_refuses_a_run_that_is_still_going():
    run_id = durable.start("send_invoice", {}, key="invoice:INV-1")
    with pytest.raises(durable.NotFinished):
        durable.release_key(run_id, by="ops@example.com")
    assert durable.get_run(run_id).holds_key


def test_release_key_refuses_a_run_that_holds_no_key():
    no_key = durable.start("noop", {})
    drain()
    with pytest.raises(durable.NoKey):
        durable.release_key(no_key)
    invoice = durable.start("send_invoice", {}, key="invoice:INV-1")
    drain()
    durable.release_key(invoice)
    with pytest.raises(durable.NoKey):
        durable.release_key(invoice)
    assert len(list_activity(kinds=["key_released"])) == 1
