"""The answers to a taken key: use_existing returns the holder, error raises KeyTaken."""

import uuid

import pytest

import django_durable as durable
from django_durable.models import Activity, Run, Status
from django_durable.testing import drain
from tests.helpers import holder_in

pytestmark = pytest.mark.django_db


def test_use_existing_returns_the_holder_and_creates_nothing():
    first = durable.start_detailed("sync_account", {"id": 7}, key="account:7")
    again = durable.start_detailed("sync_account", {"id": 7}, key="account:7")
    assert first.outcome == "started"
    assert again == (first.run_id, "use_existing")
    assert Run.objects.count() == 1


def test_start_returns_a_uuid():
    run_id = durable.start("sync_account", {}, key="account:7")
    assert isinstance(run_id, uuid.UUID)
    assert durable.start("sync_account", {}, key="account:7") == run_id


def test_error_raises_key_taken_with_the_holder_id():
    holder = durable.start("send_invoice", {"id": "INV-1"}, key="invoice:INV-1")
    with pytest.raises(durable.KeyTaken) as raised:
        durable.start("send_invoice", {"id": "INV-1"}, key="invoice:INV-1")
    assert isinstance(raised.value, durable.DurableError)
    assert type(raised.value.holder_id) is uuid.UUID
    assert raised.value.holder_id == holder
    assert str(holder) in str(raised.value)
    assert Run.objects.count() == 1


def test_the_call_overrides_the_workflows_default():
    holder = durable.start("send_invoice", {}, key="invoice:INV-1")
    assert durable.start("send_invoice", {}, key="invoice:INV-1", on_duplicate="use_existing") == (
        holder
    )
    durable.start("sync_account", {}, key="account:7")
    with pytest.raises(durable.KeyTaken):
        durable.start("sync_account", {}, key="account:7", on_duplicate="error")


def test_a_finished_holder_that_reuse_keeps_is_returned_by_use_existing():
    """send_invoice has reuse='never': the completed run keeps its key for good."""
    holder = durable.start("send_invoice", {}, key="invoice:INV-1")
    drain()
    assert durable.get_run(holder).status == Status.COMPLETED
    assert durable.start_detailed(
        "send_invoice", {}, key="invoice:INV-1", on_duplicate="use_existing"
    ) == (holder, "use_existing")
    with pytest.raises(durable.KeyTaken) as raised:
        durable.start("send_invoice", {}, key="invoice:INV-1")
    assert raised.value.holder_id == holder


def test_a_finished_holder_that_reuse_frees_hands_off():
    old = durable.start("sync_account", {"v": 1}, key="account:7")
    drain()
    new = durable.start_detailed("sync_account", {"v": 2}, key="account:7", on_duplicate="error")
    assert new.outcome == "handed_off" and new.run_id != old
    assert list(
        Run.objects.filter(key="account:7", holds_key=True).values_list("id", flat=True)
    ) == [new.run_id]
    assert Activity.objects.filter(kind="key_handed_off", run_id=new.run_id).exists()


def test_keys_are_scoped_per_workflow():
    article = durable.start("process_article", {"id": 42}, key="shared:42")
    account = durable.start("sync_account", {"id": 42}, key="shared:42")
    assert article != account
    assert Run.objects.filter(key="shared:42", holds_key=True).count() == 2


def test_starts_without_a_key_always_create_a_run():
    ids = {durable.start("sync_account", {}) for _ in range(3)}
    assert len(ids) == 3
    assert not Run.objects.filter(holds_key=True).exists()


def test_a_start_by_class_and_by_name_meet_on_one_key():
    from tests.testapp.workflows import SyncAccount

    assert durable.start(SyncAccount, {}, key="account:7") == durable.start(
        "sync_account", {}, key="account:7"
    )


def test_a_duplicate_runs_nothing_inline():
    durable.start("sync_account", {}, key="account:7")
    durable.start("sync_account", {}, key="account:7")
    assert drain() == 1  # one run, one step


def test_cancel_existing_replaces_an_active_holder(define):
    workflow = define("keyed")
    old = holder_in(workflow, Status.RUNNING, "item:1")
    result = durable.start_detailed(
        workflow, {"v": 2}, key="item:1", on_duplicate="cancel_existing"
    )
    assert result.outcome == "cancel_existing" and result.run_id != old
    replaced = durable.get_run(old)
    assert (replaced.status, replaced.holds_key) == (Status.CANCELLED, False)
    assert replaced.error["replaced_by"] == str(result.run_id)
    assert durable.get_run(result.run_id).holds_key


def test_cancel_existing_cannot_replace_a_compensating_holder(define):
    workflow = define("keyed")
    holder = holder_in(workflow, Status.COMPENSATING, "item:1")
    with pytest.raises(durable.KeyTaken) as raised:
        durable.start(workflow, {}, key="item:1", on_duplicate="cancel_existing")
    assert raised.value.holder_id == holder
    assert durable.get_run(holder).status == Status.COMPENSATING


def test_key_contended_after_three_changes_of_hands(define, monkeypatch):
    """Other starts keep taking the key between this start's steps.

    Each time this start is about to take the finished holder's key, another start
    takes it first and leaves a finished run holding it, the way a concurrent start
    that committed in between would (the database does the rest for real)."""
    from django_durable import store
    from tests.factories import RunFactory

    workflow = define("keyed")
    holder_in(workflow, Status.COMPLETED, "item:1")
    real_hand_off = store.hand_off

    def another_start_wins_first(run, holder_id, holder_status):
        Run.objects.filter(id=holder_id).update(holds_key=False)
        RunFactory(workflow="keyed", key="item:1", status=Status.COMPLETED)
        return real_hand_off(run, holder_id, holder_status)

    monkeypatch.setattr(store, "hand_off", another_start_wins_first)
    runs_before = Run.objects.count()
    with pytest.raises(durable.KeyContended):
        durable.start(workflow, {}, key="item:1")
    assert isinstance(durable.KeyContended("x"), durable.DurableError)
    # The start's savepoint rolled back: nothing it did (or saw written) remains.
    assert Run.objects.count() == runs_before
    assert Run.objects.filter(key="item:1", holds_key=True).count() == 1
