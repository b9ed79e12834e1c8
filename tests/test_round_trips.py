"""Round trips of the hot paths, pinned (docs/benchmarks.md lists them). Speed itself is
measured by bench/run.py, never asserted here.

Each statement is recorded with whether it ran inside a transaction: a start by a
caller in autocommit needs none, so it also costs no BEGIN and no COMMIT.
"""

import uuid

import pytest
from django.db import connection, transaction

import django_durable as durable
from django_durable import store
from django_durable.models import Activity, Run, StepAttempt
from django_durable.store import functions
from tests.helpers import pick_up, run_claimed
from tests.testapp.workflows import Noop, SyncAccount

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


class Statements:
    """Every statement run on the default connection, with ``in_atomic_block`` at the time."""

    def __init__(self):
        self.seen: list[tuple[str, bool]] = []

    def __call__(self, execute, sql, params, many, context):
        self.seen.append((sql, connection.in_atomic_block))
        return execute(sql, params, many, context)

    @property
    def in_transaction(self) -> bool:
        return any(atomic for _sql, atomic in self.seen)


def record(fn):
    statements = Statements()
    # A connection reads the database's clock once, when it opens (store.base.now):
    # not a round trip of the paths measured here.
    connection.ensure_connection()
    with connection.execute_wrapper(statements):
        result = fn()
    return result, statements


def test_start_of_a_new_key_is_one_statement_without_a_transaction():
    run_id, statements = record(lambda: durable.start(SyncAccount, {"n": 1}, key="acct:1"))
    assert len(statements.seen) == 1
    assert not statements.in_transaction
    run = Run.objects.get(id=run_id)
    assert (run.holds_key, run.status, run.input) == (True, "pending", {"n": 1})


def test_a_start_serialises_its_input_once(monkeypatch):
    """The JSON text a start checked its input as is the text its statement sends:
    the input is not serialised a second time to build the call."""
    import json

    from django_durable.workflows import values

    payload = {"order": {"items": [{"sku": "a", "qty": 2}], "note": "caf\u00e9"}}
    serialised = []
    encode, dumps = values._ENCODER.encode, json.dumps
    monkeypatch.setattr(
        values._ENCODER, "encode", lambda value: serialised.append(value) or encode(value)
    )
    monkeypatch.setattr(
        json, "dumps", lambda value, *a, **kw: serialised.append(value) or dumps(value, *a, **kw)
    )
    run_id, statements = record(lambda: durable.start(SyncAccount, payload, key="acct:once"))
    assert [value for value in serialised if value == payload] == [payload]
    assert len(statements.seen) == 1
    assert Run.objects.get(id=run_id).input == payload


def test_start_without_a_key_is_one_statement():
    _run_id, statements = record(lambda: durable.start(Noop))
    assert len(statements.seen) == 1
    assert not statements.in_transaction


@pytest.mark.parametrize("on_duplicate", ["use_existing", "error"])
def test_duplicate_is_one_statement_for_insert_holder_and_activity(on_duplicate):
    holder = durable.start(SyncAccount, {"n": 1}, key="acct:2")

    def duplicate():
        try:
            return durable.start(SyncAccount, {"n": 2}, key="acct:2", on_duplicate=on_duplicate)
        except durable.KeyTaken as exc:
            return exc.holder_id

    answer, statements = record(duplicate)
    assert answer == holder
    # durable_start's insert meets the key; the same call reads the holder and
    # writes the duplicate's activity row.
    assert len(statements.seen) == 1
    assert not statements.in_transaction
    assert Run.objects.filter(key="acct:2").count() == 1
    activity = Activity.objects.get(kind="key_duplicate")
    assert activity.run_id == holder
    assert activity.details["outcome"] == on_duplicate
    assert activity.details["input_changed"] is True


def test_start_inside_a_transaction_is_one_statement_in_a_savepoint():
    with transaction.atomic():
        _run_id, statements = record(lambda: durable.start(SyncAccount, key="acct:3"))
    sql = [text.split()[0] for text, _atomic in statements.seen]
    # The savepoint keeps the caller's transaction usable whatever the start meets.
    assert sql == ["SAVEPOINT", "SELECT", "RELEASE"]  # SELECT * FROM durable_start(...)
    assert statements.in_transaction


def test_each_step_is_recorded_in_one_statement():
    run_id = durable.start(Noop)
    run = pick_up(run_id)
    _steps, statements = record(lambda: run_claimed(run))
    assert len(statements.seen) == 2  # two steps, the last also completes the run
    assert not statements.in_transaction
    assert Run.objects.get(id=run_id).status == "completed"
    assert StepAttempt.objects.filter(run_id=run_id, status="completed").count() == 2


def test_a_keyed_run_with_nothing_waiting_finishes_without_a_transaction():
    """Its finish looks for a run waiting behind its key in one statement, with no lock
    and no transaction: the holder's and the waiting run's locks are taken only when
    one waits (the run_again tests cover that path)."""
    run_id = durable.start(Noop, key="noop:1")
    run = pick_up(run_id)
    _steps, statements = record(lambda: run_claimed(run))
    assert len(statements.seen) == 3  # two steps, then the look behind the key
    assert not statements.in_transaction
    assert "FOR UPDATE" not in statements.seen[2][0]
    assert Run.objects.get(id=run_id).status == "completed"


def test_a_step_of_a_run_taken_over_records_nothing():
    run_id = durable.start(Noop)
    run = pick_up(run_id)
    Run.objects.filter(id=run_id).update(fence=run.fence + 1)  # another worker claimed it
    run_claimed(run)
    assert StepAttempt.objects.filter(run_id=run_id).count() == 0
    assert Run.objects.get(id=run_id).step_index == 0


def prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def start_and_run_one():
    durable.start(SyncAccount, {"n": 1}, key="acct:prepared")
    durable.start(SyncAccount, {"n": 2}, key="acct:prepared")  # a duplicate
    run_claimed(pick_up(durable.start(Noop)))


def test_nothing_is_prepared_by_default():
    """Behind a pooler in transaction mode a prepared statement may be gone at the next
    transaction: by default (Django's client-side binding) nothing is prepared."""
    connection.close()
    for _ in range(6):
        start_and_run_one()
    assert prepared_statements() == []


def test_prepared_statements_through_the_databases_own_options():
    """A project on a direct connection may prepare the hot statements with psycopg's
    own ``prepare_threshold`` and Django's ``server_side_binding`` (docs/production.md)."""
    options = connection.settings_dict.setdefault("OPTIONS", {})
    options.update(server_side_binding=True, prepare_threshold=1)
    try:
        connection.close()
        start_and_run_one()
        start_and_run_one()
        prepared = [" ".join(s.split()) for s in prepared_statements()]
        assert any("SELECT durable_start_v2(" in s for s in prepared)  # a start, a duplicate
        assert any("durable_record_step_v2(" in s for s in prepared)  # a step's record
        claim_call = f"FROM {functions.CURRENT['durable_claim']}("
        assert any(claim_call in s for s in prepared)  # the claim's call
        assert Run.objects.filter(key="acct:prepared", holds_key=True).count() == 1
    finally:
        del options["server_side_binding"], options["prepare_threshold"]
        connection.close()


def test_a_hand_off_is_one_statement_that_does_it_all_or_nothing():
    old = durable.start(SyncAccount, {"n": 1}, key="acct:handoff")
    run_claimed(pick_up(old))  # it completes and keeps the key until a start takes it

    result, statements = record(
        lambda: durable.start_detailed(SyncAccount, {"n": 2}, key="acct:handoff")
    )
    assert result.outcome == "handed_off"
    assert len(statements.seen) == 2  # the start meets the key and its holder, the hand-off
    assert not statements.in_transaction
    assert Run.objects.get(key="acct:handoff", holds_key=True).id == result.run_id
    assert not Run.objects.get(id=old).holds_key
    handed = Activity.objects.get(kind="key_handed_off")
    assert (handed.run_id, handed.details["from_run_id"]) == (result.run_id, str(old))

    # A holder that is no longer what the start saw: nothing is written at all.
    later = durable.start_detailed(SyncAccount, {"n": 3}, key="acct:handoff")
    assert later.outcome == "use_existing"  # the new holder is pending
    at = store.now()
    stale = store.NewRun(
        id=uuid.uuid4(),
        workflow=SyncAccount.name,
        queue="default",
        priority=0,
        input={},
        key="acct:handoff",
        holds_key=True,
        created_at=at,
        due_at=at,
    )
    runs_before = Run.objects.count()
    assert not store.hand_off(stale, result.run_id, "completed")
    assert Run.objects.count() == runs_before
    assert Run.objects.get(id=result.run_id).holds_key
    assert Activity.objects.filter(kind="key_handed_off").count() == 1
