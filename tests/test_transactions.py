"""A start inside the caller's transaction: it commits and rolls back with it, and
neither a duplicate nor KeyTaken leaves the transaction unusable."""

import threading

import pytest
from django.db import connection, transaction

import django_durable as durable
from django_durable.models import Activity, Run
from tests.helpers import DbThread, wait_until_blocked_on_lock
from tests.testapp.models import SideEffect


class Rollback(Exception):
    pass


@pytest.mark.django_db
def test_a_rollback_removes_the_run_and_frees_its_key():
    with pytest.raises(Rollback), transaction.atomic():
        rolled_back = durable.start("sync_account", {}, key="account:7")
        raise Rollback
    assert not Run.objects.filter(id=rolled_back).exists()
    result = durable.start_detailed("sync_account", {}, key="account:7")
    assert result.outcome == "started" and result.run_id != rolled_back


@pytest.mark.django_db
def test_a_rolled_back_handoff_gives_the_key_back_to_the_old_holder():
    from django_durable.testing import drain

    old = durable.start("sync_account", {}, key="account:7")
    drain()
    with pytest.raises(Rollback), transaction.atomic():
        assert durable.start_detailed("sync_account", {}, key="account:7").outcome == "handed_off"
        raise Rollback
    assert list(Run.objects.filter(holds_key=True).values_list("id", flat=True)) == [old]
    assert not Activity.objects.exists()


@pytest.mark.django_db
def test_a_duplicate_inside_atomic_leaves_the_transaction_usable():
    with transaction.atomic():
        first = durable.start("sync_account", {}, key="account:7")
        assert durable.start("sync_account", {}, key="account:7") == first
        SideEffect.objects.create(run_id=first, step="after the duplicate")
    assert SideEffect.objects.filter(step="after the duplicate").exists()


@pytest.mark.django_db
def test_key_taken_inside_atomic_leaves_the_transaction_usable():
    with transaction.atomic():
        holder = durable.start("send_invoice", {}, key="invoice:1")
        with pytest.raises(durable.KeyTaken):
            durable.start("send_invoice", {}, key="invoice:1")
        SideEffect.objects.create(run_id=holder, step="after KeyTaken")
        assert Run.objects.count() == 1
    assert SideEffect.objects.filter(step="after KeyTaken").exists()
    # The refused start is on record.
    assert Activity.objects.get(kind="key_duplicate").details["outcome"] == "error"


def open_transaction_starting(
    key: str, started: threading.Event, finish: threading.Event, *, commit: bool
):
    """In its own transaction: start ``key``, say so, then wait to commit or roll back."""
    try:
        with transaction.atomic():
            run_id = durable.start("sync_account", {"from": "first"}, key=key)
            started.set()
            assert finish.wait(30)
            if not commit:
                transaction.set_rollback(True)
        return run_id
    finally:
        started.set()


def start_in_autocommit(key: str):
    return durable.start_detailed("sync_account", {"from": "second"}, key=key)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_a_second_connection_waits_for_the_first_transaction(commit):
    """PostgreSQL: the second insert waits on the first transaction's uncommitted key.
    SQLite: the second start waits for the write lock. Either way it then sees the
    first run (commit) or takes the key itself (rollback)."""
    started, finish = threading.Event(), threading.Event()
    first = DbThread(open_transaction_starting, "account:7", started, finish, commit=commit)
    first.start()
    assert started.wait(30)
    second = DbThread(start_in_autocommit, "account:7")
    second.start()
    if connection.vendor == "postgresql":
        wait_until_blocked_on_lock(second)
    else:
        second.join(0.3)
        assert second.is_alive(), "the second start did not wait for the first transaction"
    finish.set()
    first_id = first.outcome()
    result = second.outcome()

    if commit:
        assert result == (first_id, "use_existing")
        assert Run.objects.count() == 1
    else:
        assert result.outcome == "started" and result.run_id != first_id
        assert list(Run.objects.values_list("id", flat=True)) == [result.run_id]
        assert Run.objects.get().input == {"from": "second"}
