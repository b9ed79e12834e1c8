"""Watching keys: activity rows and signals, which are sent after commit."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

import django_durable as durable
from django_durable import activity, signals
from django_durable.models import Activity
from django_durable.testing import drain
from tests.factories import ActivityFactory
from tests.testapp.workflows import SyncAccount

pytestmark = pytest.mark.django_db


@pytest.fixture
def received():
    """Every signal django-durable sends, as (name, kwargs) in order."""
    got = []
    receivers = {}
    for name in ("run_started", "run_finished", "key_duplicate", "key_handoff", "key_release"):

        def receiver(sender, signal, name=name, **kwargs):
            got.append((name, sender, kwargs))

        receivers[name] = receiver
        getattr(signals, name).connect(receiver)
    yield got
    for name, receiver in receivers.items():
        getattr(signals, name).disconnect(receiver)


def names(got):
    return [name for name, _, _ in got]


def test_key_duplicate_activity_says_what_the_start_did():
    holder = durable.start("sync_account", {"v": 1}, key="account:7")
    durable.start("sync_account", {"v": 1}, key="account:7")
    durable.start("sync_account", {"v": 2}, key="account:7")
    with pytest.raises(durable.KeyTaken):
        durable.start("sync_account", {"v": 3}, key="account:7", on_duplicate="error")

    rows = activity.list(kinds=["key_duplicate"])
    assert [row.run_id for row in rows] == [holder] * 3
    assert [row.details for row in reversed(rows)] == [
        {
            "key": "account:7",
            "workflow": "sync_account",
            "outcome": "use_existing",
            "input_changed": False,
            "input": {"v": 1},
        },
        {
            "key": "account:7",
            "workflow": "sync_account",
            "outcome": "use_existing",
            "input_changed": True,
            "input": {"v": 2},
        },
        {
            "key": "account:7",
            "workflow": "sync_account",
            "outcome": "error",
            "input_changed": True,
            "input": {"v": 3},
        },
    ]
    assert {(row.workflow, row.key) for row in rows} == {("sync_account", "account:7")}


def test_a_first_start_records_no_activity():
    durable.start("sync_account", {}, key="account:7")
    durable.start("sync_account", {})
    assert activity.list() == []


def test_activity_list_filters_by_kind_run_and_time():
    old = ActivityFactory(created_at=timezone.now() - timedelta(days=2))
    holder = durable.start("sync_account", {}, key="account:7")
    durable.start("sync_account", {}, key="account:7")
    drain()
    new = durable.start("sync_account", {}, key="account:7")

    assert [r.kind for r in activity.list()] == ["key_handed_off", "key_duplicate", "key_duplicate"]
    assert [r.kind for r in activity.list(kinds="key_handed_off")] == ["key_handed_off"]
    assert [r.kind for r in activity.list(run_id=holder)] == ["key_duplicate"]
    assert [r.run_id for r in activity.list(run_id=new)] == [new]
    assert old not in activity.list(since=timezone.now() - timedelta(days=1))
    with pytest.raises(ValueError, match="unknown activity kinds"):
        activity.list(kinds=["key_lost"])


def test_run_started_is_sent_after_commit_and_not_for_a_duplicate(
    received, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True) as callbacks, transaction.atomic():
        run_id = durable.start("sync_account", {"v": 1}, key="account:7")
        durable.start("sync_account", {"v": 2}, key="account:7")
        assert received == []  # nothing is sent while the transaction is open
    assert len(callbacks) == 2
    assert names(received) == ["run_started", "key_duplicate"]
    _, sender, started = received[0]
    assert sender is SyncAccount
    assert started == {"run_id": run_id, "workflow": "sync_account", "key": "account:7"}
    _, _, duplicate = received[1]
    assert duplicate == {
        "run_id": run_id,
        "workflow": "sync_account",
        "key": "account:7",
        "outcome": "use_existing",
        "input_changed": True,
        "input": {"v": 2},
    }


def test_a_rolled_back_start_sends_nothing(received, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True) as callbacks, transaction.atomic():
        durable.start("sync_account", {}, key="account:7")
        transaction.set_rollback(True)
    assert callbacks == [] and received == []


def test_a_handoff_sends_key_handoff_and_run_started(received, django_capture_on_commit_callbacks):
    old = durable.start("sync_account", {}, key="account:7")
    drain()
    received.clear()
    with django_capture_on_commit_callbacks(execute=True):
        new = durable.start("sync_account", {}, key="account:7")
    assert names(received) == ["run_started", "key_handoff"]
    assert received[1][2] == {
        "from_run_id": old,
        "to_run_id": new,
        "workflow": "sync_account",
        "key": "account:7",
    }


def test_key_taken_sends_key_duplicate_with_outcome_error(
    received, django_capture_on_commit_callbacks
):
    durable.start("send_invoice", {}, key="invoice:1")
    received.clear()
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(durable.KeyTaken):
        durable.start("send_invoice", {}, key="invoice:1")
    assert names(received) == ["key_duplicate"]
    assert received[0][2]["outcome"] == "error"


def test_release_key_sends_key_release(received, django_capture_on_commit_callbacks):
    run_id = durable.start("send_invoice", {}, key="invoice:1")
    drain()
    received.clear()
    with django_capture_on_commit_callbacks(execute=True):
        durable.release_key(run_id, by="ops@example.com")
    assert names(received) == ["key_release"]
    assert received[0][2] == {
        "run_id": run_id,
        "workflow": "send_invoice",
        "key": "invoice:1",
        "by": "ops@example.com",
    }


def test_a_finished_run_sends_run_finished(received, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        run_id = durable.start("sync_account", {}, key="account:7")
        drain()
    assert names(received) == ["run_started", "run_finished"]
    assert received[1][2]["status"] == "completed" and received[1][2]["run_id"] == run_id


def test_activity_rows_outlive_their_runs():
    holder = durable.start("sync_account", {}, key="account:7")
    durable.start("sync_account", {}, key="account:7")
    drain()
    durable.prune(older_than=timedelta(0))
    assert Activity.objects.filter(run_id=holder).exists()


def test_list_keys_shows_each_key_with_its_holder_and_readds():
    from django_durable.query import list_keys

    old = durable.start("sync_account", {}, key="account:7")
    drain()
    holder = durable.start("sync_account", {}, key="account:7")
    durable.start("sync_account", {}, key="account:7")  # a re-add
    invoice = durable.start("send_invoice", {}, key="invoice:1")
    drain()
    durable.release_key(invoice)
    durable.start("sync_account", {})  # no key: not listed

    assert list_keys() == [
        {
            "workflow": "send_invoice",
            "key": "invoice:1",
            "runs": 1,
            "holder_id": None,
            "holder_status": None,
            "readds_last_day": 0,
        },
        {
            "workflow": "sync_account",
            "key": "account:7",
            "runs": 2,
            "holder_id": holder,
            "holder_status": "completed",
            "readds_last_day": 1,
        },
    ]
    assert [row["key"] for row in list_keys("send_invoice")] == ["invoice:1"]
    assert old not in {row["holder_id"] for row in list_keys()}


def test_key_taken_survives_pickling():
    import pickle
    import uuid

    holder = uuid.uuid4()
    again = pickle.loads(pickle.dumps(durable.KeyTaken(holder, "held")))
    assert (again.holder_id, str(again)) == (holder, "held")
