"""The key rules hold in the database itself: every named constraint has a test
that breaks it, through the ORM and through raw SQL."""

import uuid

import pytest
from django.db import DataError, IntegrityError, connection, transaction
from django.utils import timezone

from django_durable.models import Run, Status
from tests.factories import RunFactory, StepAttemptFactory

pytestmark = pytest.mark.django_db


UNIQUE_COLUMNS = {
    "durable_run_one_holder_per_key": "durable_run.workflow, durable_run.key",
    "durable_run_one_waiting_per_key": "durable_run.workflow, durable_run.key",
    "durable_step_completed_once": "durable_step_attempt.run_id, durable_step_attempt.kind",
}


def broken(name: str):
    """Expect ``IntegrityError`` from constraint ``name``. PostgreSQL names every
    constraint; SQLite names CHECKs and reports a unique index by its columns."""
    if connection.vendor == "sqlite" and name in UNIQUE_COLUMNS:
        return pytest.raises(
            IntegrityError, match=f"UNIQUE constraint failed: {UNIQUE_COLUMNS[name]}"
        )
    return pytest.raises(IntegrityError, match=name)


def raw_insert(**values) -> None:
    """Insert a run with plain SQL, as another program sharing the database would."""
    at = connection.ops.adapt_datetimefield_value(timezone.now())
    row = {
        "id": uuid.uuid4().hex,
        "workflow": "sync_account",
        "queue": "default",
        "status": "pending",
        "key": None,
        "holds_key": False,
        "step_index": 0,
        "attempt": 1,
        "fence": 0,
        "created_at": at,
        **values,
    }
    json_columns = ["input", "context", "state"]
    columns = [*row, *json_columns]
    placeholders = ["%s"] * len(row) + ["'{}'"] * len(json_columns)
    sql = (
        f"INSERT INTO durable_run ({', '.join(connection.ops.quote_name(c) for c in columns)}) "
        f"VALUES ({', '.join(placeholders)})"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, list(row.values()))


def test_raw_insert_writes_a_valid_run():
    raw_insert(key="account:7", holds_key=True)
    assert Run.objects.get(key="account:7").holds_key


def test_a_second_holder_of_a_key_is_refused_via_the_orm():
    RunFactory(workflow="sync_account", key="account:7", status=Status.COMPLETED)
    with broken("durable_run_one_holder_per_key"), transaction.atomic():
        RunFactory(workflow="sync_account", key="account:7")


def test_a_second_holder_of_a_key_is_refused_via_raw_sql():
    raw_insert(key="account:7", holds_key=True)
    with broken("durable_run_one_holder_per_key"), transaction.atomic():
        raw_insert(key="account:7", holds_key=True, status="completed")


def test_taking_a_held_key_with_an_update_is_refused():
    RunFactory(key="account:7", holds_key=True)
    former = RunFactory(key="account:7", holds_key=False, status=Status.COMPLETED)
    with broken("durable_run_one_holder_per_key"), transaction.atomic():
        Run.objects.filter(id=former.id).update(holds_key=True)


def test_one_key_may_be_held_once_per_workflow_and_kept_by_many_former_holders():
    RunFactory(workflow="sync_account", key="shared")
    RunFactory(workflow="process_article", key="shared")
    RunFactory.create_batch(
        3, workflow="sync_account", key="shared", holds_key=False, status=Status.COMPLETED
    )
    assert Run.objects.filter(key="shared").count() == 5


def test_a_second_run_waiting_behind_a_key_is_refused():
    holder = RunFactory(key="account:7", status=Status.RUNNING)
    RunFactory(key="account:7", holds_key=False, runs_after=holder, due_at=None)
    with broken("durable_run_one_waiting_per_key"), transaction.atomic():
        RunFactory(key="account:7", holds_key=False, runs_after=holder, due_at=None)


def test_an_unknown_status_is_refused_via_the_orm():
    with broken("durable_run_status_valid"), transaction.atomic():
        RunFactory(status="paused")


def test_an_unknown_status_is_refused_via_raw_sql():
    with broken("durable_run_status_valid"), transaction.atomic():
        raw_insert(status="done")


@pytest.mark.parametrize(
    "key",
    ["", "é" * 128, "k" * 256],
    ids=["empty", "256-bytes-of-128-characters", "256-ascii"],
)
def test_a_key_that_is_not_1_to_255_bytes_is_refused(key):
    # The ORM writes what it is given (validation lives in start()); the CHECK catches it.
    if len(key) > 255 and connection.vendor == "postgresql":
        # varchar(255) refuses 256 characters before the CHECK is looked at.
        expected = pytest.raises(DataError, match="too long")
    else:
        expected = broken("durable_run_key_length")
    with expected, transaction.atomic():
        RunFactory(key=key, holds_key=False)
    with expected, transaction.atomic():
        raw_insert(key=key)


def test_a_key_of_255_bytes_fits():
    RunFactory(key="é" * 127 + "k")
    raw_insert(key="€" * 85)
    assert Run.objects.count() == 2


@pytest.mark.parametrize(
    "flow_key",
    ["", "é" * 128, "k" * 256],
    ids=["empty", "256-bytes-of-128-characters", "256-ascii"],
)
def test_a_flow_key_that_is_not_1_to_255_bytes_is_refused(flow_key):
    # start() refuses it first (ValueError); the CHECK catches any other writer.
    if len(flow_key) > 255 and connection.vendor == "postgresql":
        expected = pytest.raises(DataError, match="too long")
    else:
        expected = broken("durable_run_flow_key_length")
    with expected, transaction.atomic():
        RunFactory(flow_key=flow_key)
    with expected, transaction.atomic():
        raw_insert(flow_key=flow_key)


def test_a_flow_key_of_255_bytes_fits():
    RunFactory(flow_key="é" * 127 + "k")
    raw_insert(flow_key="€" * 85)
    assert Run.objects.exclude(flow_key=None).count() == 2


def test_holding_without_a_key_is_refused():
    with broken("durable_run_holder_has_key"), transaction.atomic():
        RunFactory(key=None, holds_key=True)
    with broken("durable_run_holder_has_key"), transaction.atomic():
        raw_insert(key=None, holds_key=True)


def test_a_step_is_recorded_completed_once():
    run = RunFactory(status=Status.RUNNING)
    StepAttemptFactory(run=run, step_index=0, attempt=1)
    StepAttemptFactory(run=run, step_index=0, attempt=2, status="failed")
    with broken("durable_step_completed_once"), transaction.atomic():
        StepAttemptFactory(run=run, step_index=0, attempt=3)


def test_an_unknown_attempt_status_is_refused():
    with broken("durable_step_attempt_status_valid"), transaction.atomic():
        StepAttemptFactory(status="maybe")


def test_every_status_a_run_can_have_passes_the_check():
    for status in Status.values:
        raw_insert(status=status)
    assert Run.objects.count() == len(Status.values)


def test_the_status_checks_validate_in_python_too():
    """Django checks a model's constraints in ``full_clean()`` (the admin's forms): the
    CHECK's condition is evaluated there as well."""
    from django.core.exceptions import ValidationError

    run = RunFactory.build(status="paused")
    with pytest.raises(ValidationError, match="durable_run_status_valid"):
        run.validate_constraints()
    RunFactory.build(status=Status.WAITING).validate_constraints()
    attempt = StepAttemptFactory.build(status="maybe")
    with pytest.raises(ValidationError, match="durable_step_attempt_status_valid"):
        attempt.validate_constraints()


def test_an_update_to_an_unknown_status_is_refused():
    """The rule holds for an UPDATE as for an INSERT."""
    run = RunFactory()
    with broken("durable_run_status_valid"), transaction.atomic():
        Run.objects.filter(id=run.id).update(status="paused")
    assert Run.objects.get(id=run.id).status == Status.PENDING


@pytest.mark.parametrize("column", ["step_index", "attempt", "fence", "recoveries"])
def test_a_negative_counter_is_refused(column):
    """A positive integer field's CHECK: ``<table>_<column>_check`` on PostgreSQL,
    reported by its expression on SQLite (both name the column)."""
    run = RunFactory()
    with pytest.raises(IntegrityError, match=column), transaction.atomic():
        Run.objects.filter(id=run.id).update(**{column: -1})
    with pytest.raises(IntegrityError, match=column), transaction.atomic():
        raw_insert(**{column: -1})
    attempt = StepAttemptFactory(run=run)
    if column in ("step_index", "attempt"):
        with pytest.raises(IntegrityError, match=column), transaction.atomic():
            type(attempt).objects.filter(id=attempt.id).update(**{column: -1})


# Every CHECK of the tables written at each start and step, by name, as PostgreSQL
# keeps it: plain CHECKs of the table (no domain, no custom column type).
CHECKS = {
    "durable_run": {
        "durable_run_attempt_check",
        "durable_run_fence_check",
        "durable_run_flow_key_length",
        "durable_run_holder_has_key",
        "durable_run_key_length",
        "durable_run_recoveries_check",
        "durable_run_status_valid",
        "durable_run_step_index_check",
    },
    "durable_step_attempt": {
        "durable_step_attempt_attempt_check",
        "durable_step_attempt_status_valid",
        "durable_step_attempt_step_index_check",
    },
}


@pytest.mark.postgres
def test_postgresql_has_each_rule_as_a_named_check_of_its_table():
    from django_durable.models import StepAttempt

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid), convalidated "
            "FROM pg_constraint WHERE contype = 'c' AND conrelid = ANY (%s::regclass[])",
            [list(CHECKS)],
        )
        rows = cursor.fetchall()
        cursor.execute(
            "SELECT count(*) FROM pg_type WHERE typtype = 'd' AND typname LIKE 'durable%%'"
        )
        (types,) = cursor.fetchone()
    found = {table: {name for t, name, _d, _v in rows if t == table} for table in CHECKS}
    assert found == CHECKS
    assert all(valid for *_rest, valid in rows)
    assert types == 0  # no domain
    definitions = {name: definition for _t, name, definition, _v in rows}
    for model, name in (
        (Run, "durable_run_status_valid"),
        (StepAttempt, "durable_step_attempt_status_valid"),
    ):
        statuses = model._meta.get_field("status").choices
        for value, _label in statuses:
            assert f"'{value}'" in definitions[name], (name, value)
    assert "octet_length" in definitions["durable_run_key_length"]


def test_octet_length_writes_the_sql_migration_0001_recorded():
    """Migration 0001 names ``db_functions.OctetLength`` (the key's CHECK): the SQL it
    writes is part of the schema and never changes."""
    from django.db.models import F
    from django.db.models.sql import Query

    from django_durable.db_functions import OctetLength

    query = Query(Run)
    compiler = query.get_compiler(connection=connection)
    sql, params = compiler.compile(OctetLength(F("key")).resolve_expression(query))
    if connection.vendor == "sqlite":
        assert sql == 'LENGTH(CAST("durable_run"."key" AS BLOB))'
    else:
        assert sql == 'OCTET_LENGTH("durable_run"."key")'
    assert list(params) == []
