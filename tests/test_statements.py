"""The store's named statements agree with the models, and every statement reaches
Django's cursor: what an APM or the debug toolbar hooks sees each one."""

import dataclasses
import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

import django_durable as durable
from django_durable import store
from django_durable.models import Run
from django_durable.store import base, starts
from django_durable.store.engines import postgres, sqlite
from django_durable.store.functions import CURRENT
from tests import plans
from tests.helpers import run_claimed
from tests.testapp.workflows import Noop, SyncAccount


@pytest.mark.django_db
def test_the_statements_name_every_column_of_the_runs_table():
    columns = tuple(field.column for field in Run._meta.concrete_fields)
    assert columns == base.RUN_COLUMNS
    attnames = tuple(field.attname for field in Run._meta.concrete_fields)
    assert attnames == base.RUN_ATTNAMES
    assert sqlite.INSERT_RUN is postgres.INSERT_RUN  # one statement, both engines
    for statement in (postgres.INSERT_RUN, postgres.HAND_OFF):
        for column in columns:
            assert f"%({column})s" in statement, (column, statement[:60])
    claimed = postgres.CLAIM.split("FROM durable_claim", 1)[0].removeprefix("\nSELECT ")
    assert tuple(c.strip().strip('"') for c in claimed.split(",")) == columns
    # The start function takes the columns a start sets as arguments p_<column>, typed
    # as the table's columns, and inserts every column.
    assert set(starts.START_COLUMNS) <= set(columns)
    types = {f.column: f.db_type(connection) for f in Run._meta.concrete_fields}
    inserted = plans.START_INSERT.split("VALUES", 1)[1]
    listed = re.findall(r'\b"?(\w+)"?\b', plans.START_INSERT.split("VALUES", 1)[0].split("(", 1)[1])
    # The start function is frozen (migrations/sql): the columns its insert leaves
    # out must be nullable and take their default there.
    added_later = ("rerun_of_id", "rerun_from_step", "inputs")
    added_later += ("flow_slot", "workflow_slot", "queue_slot")  # 0007
    assert tuple(listed) == tuple(c for c in columns if c not in added_later)
    assert all(Run._meta.get_field(name).null for name in added_later)
    for column, sql_type in starts.START_COLUMNS.items():
        assert f"p_{column} {sql_type}" in plans.START_FUNCTION, column
        assert re.search(rf"\bp_{column}\b", inserted), column
        if connection.vendor == "postgresql":
            declared = types[column].split("(")[0]
            assert declared.replace("timestamp with time zone", "timestamptz") == sql_type, column


def test_the_start_call_passes_its_arguments_in_the_functions_order():
    """START names no types: PostgreSQL reads each argument as the parameter in its
    place, so the call's order is the function's."""
    head = f"FUNCTION {CURRENT['durable_start']}("
    signature = plans.START_FUNCTION.split(head, 1)[1].split(") RETURNS")[0]
    parameters = re.findall(r"\bp_(\w+) \w+", signature)
    arguments = re.findall(r"%\((\w+)\)s", postgres.START)
    assert arguments == parameters
    assert "::" not in postgres.START
    assert set(starts.START_COLUMNS) <= set(arguments)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_durable_start_gives_the_other_columns_a_new_runs_defaults():
    """The columns durable_start writes as constants are those of a new Run."""
    run_id = durable.start(SyncAccount, {"n": 1}, key="defaults:1")
    stored = Run.objects.get(id=run_id)
    fresh = Run()
    for field in Run._meta.concrete_fields:
        if field.column not in starts.START_COLUMNS:
            assert getattr(stored, field.attname) == getattr(fresh, field.attname), field.name


def test_a_new_run_has_exactly_the_columns_a_start_sets():
    """A start builds a NewRun, not a Run: it has an attribute for each column
    durable_start takes, by column name (and the input's JSON text, which is not a
    column), and no way to set any other column."""
    fields = {f.name for f in dataclasses.fields(store.NewRun)}
    assert fields == {*starts.START_COLUMNS, "input_json"}
    required = dict(
        id=uuid.uuid4(),
        workflow="w",
        queue="default",
        priority=0,
        input={},
        created_at=timezone.now(),
    )
    run = store.NewRun(**required)
    with pytest.raises(AttributeError):
        run.attempt = 3
    with pytest.raises(TypeError):
        store.NewRun(**required, status="running")


def test_a_start_passes_one_argument_per_column_it_sets():
    """``_start_params`` is written out, not derived from START_COLUMNS: it names each
    of them, and passes a UUID, a time and a JSON value as text, which durable_start
    reads as its parameter's type."""
    at = timezone.now()
    run = store.NewRun(
        id=uuid.uuid4(),
        workflow="w",
        queue="default",
        priority=0,
        input={"a": [1]},
        created_at=at,
        parent_id=uuid.uuid4(),
        due_at=at,
        step_names=["one", "two"],
    )
    params = starts._start_params(run)
    assert set(params) == set(starts.START_COLUMNS)
    assert params["id"] == str(run.id) and params["parent_id"] == str(run.parent_id)
    assert params["runs_after_id"] is None and params["timeout_at"] is None
    assert params["due_at"] == at.isoformat() == params["created_at"]
    assert params["input"] == '{"a": [1]}' and params["context"] == "{}"
    assert params["step_names"] == '["one", "two"]'


def test_the_holder_columns_are_those_a_holder_is_read_with():
    from django_durable.store import holders

    assert set(starts.HOLDER_ATTNAMES) == {*holders.HOLDER_FIELDS, "queue"}
    model_order = [f.attname for f in Run._meta.concrete_fields]
    assert list(starts.HOLDER_ATTNAMES) == [a for a in model_order if a in starts.HOLDER_ATTNAMES]


class ClassLevelHook:
    """Counts statements the way Sentry and many APMs do: by replacing
    ``CursorWrapper.execute`` on the class (not with ``execute_wrapper``)."""

    def __init__(self, monkeypatch):
        self.seen: list[str] = []
        original = CursorWrapper.execute

        def execute(cursor, sql, params=None):
            self.seen.append(sql)
            return original(cursor, sql, params)

        monkeypatch.setattr(CursorWrapper, "execute", execute)

    def count(self, fn) -> int:
        before = len(self.seen)
        fn()
        return len(self.seen) - before


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_apm_hook_on_the_cursor_class_sees_every_hot_statement(monkeypatch, settings):
    """With DEBUG off, each hot path's statements all pass through Django's cursor:
    as many as tests/test_round_trips.py pins."""
    settings.DEBUG = False
    connection.ensure_connection()  # its clock offset is read when it opens (store.base.now)
    hook = ClassLevelHook(monkeypatch)
    holder = []
    assert hook.count(lambda: holder.append(durable.start(SyncAccount, key="acct:apm"))) == 1
    assert hook.count(lambda: durable.start(SyncAccount, {"n": 2}, key="acct:apm")) == 1
    noop_id = durable.start(Noop)
    claimed = []
    claim = lambda: claimed.extend(  # noqa: E731
        store.claim(worker_id="apm", queues=None, limit=10, lease=LEASE)
    )
    # The first claim on a connection also asks the session's isolation level, once
    # (store.engines.postgres.sets_claim_level); every claim after it is one statement.
    assert (
        hook.count(lambda: store.claim(worker_id="apm", queues=["none"], limit=1, lease=LEASE)) == 2
    )
    assert hook.count(claim) == 1
    runs = {run.id: run for run in claimed}
    assert hook.count(lambda: run_claimed(runs[noop_id])) == 2  # a record per step
    run_claimed(runs[holder[0]])  # it completes and keeps the key until a start takes it
    result = []
    handoff = lambda: result.append(  # noqa: E731
        durable.start_detailed(SyncAccount, key="acct:apm")
    )
    assert hook.count(handoff) == 2  # the start meets the key and its holder, the hand-off
    assert result[0].outcome == "handed_off"


LEASE = timedelta(seconds=30)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_durable_starts_insert_answers_only_the_conflict_of_a_held_key():
    """The insert in durable_start names its conflict (durable_run_one_holder_per_key):
    a run id that is taken is an error, never answered as if the key had a holder."""
    from django.db import IntegrityError

    taken = durable.start(SyncAccount, {"n": 1}, key="arbiter:1")
    run = store.NewRun(
        id=taken,
        workflow=SyncAccount.name,
        queue="default",
        priority=0,
        input={"n": 2},
        key="arbiter:2",
        holds_key=True,
        created_at=timezone.now(),
    )
    with pytest.raises(IntegrityError, match="durable_run_pkey"):
        store.insert_or_get_holder(run)
    assert not Run.objects.filter(key="arbiter:2").exists()
    # The key's conflict is still an answer: its holder.
    again = dataclasses.replace(run, id=uuid.uuid4(), key="arbiter:1")
    found = store.insert_or_get_holder(again)
    assert not found.inserted and found.holder_id == taken
