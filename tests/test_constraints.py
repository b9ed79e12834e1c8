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
    CHECK's condition (``AnyOf``) is evaluated there as well."""
    from django.core.exceptions import ValidationError

    run = RunFactory.build(status="paused")
    with pytest.raises(ValidationError, match="durable_run_status_valid"):
        run.validate_constraints()
    RunFactory.build(status=Status.WAITING).validate_constraints()
    attempt = StepAttemptFactory.build(status="maybe")
    with pytest.raises(ValidationError, match="durable_step_attempt_status_valid"):
        attempt.validate_constraints()


@pytest.mark.postgres
def test_postgresql_keeps_each_status_check_as_one_array_constant():
    """PostgreSQL reads a CHECK from its stored text at every INSERT and UPDATE: the
    status checks are stored as one array constant, not an ``IN`` list (an array
    rebuilt from one constant per status at each statement). Migration 0019 writes
    them by hand (NOT VALID, then validated): they name the model's statuses, and
    are validated."""
    import re

    from django_durable.db_functions import AnyOf
    from django_durable.models import StepAttempt

    expected = {
        c.name: set(c.condition.values)
        for model in (Run, StepAttempt)
        for c in model._meta.constraints
        if isinstance(getattr(c, "condition", None), AnyOf)
    }
    assert set(expected) == {"durable_run_status_valid", "durable_step_attempt_status_valid"}
    stored = _status_checks()  # validated ones only
    assert set(stored) == set(expected)
    for name, definition in stored.items():
        assert "= ANY ('{" in definition and "ARRAY[" not in definition, definition
        (array,) = re.findall(r"'\{(.*)\}'::text\[\]", definition)
        assert set(array.split(",")) == expected[name], definition


@pytest.mark.postgres
def test_a_text_array_reads_back_as_its_values():
    from django_durable.db_functions import text_array

    values = ["plain", 'with "quotes"', "back\\slash", "a,comma", "{brace}", "", "NULL"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::text[]", [text_array(values)])
        assert cursor.fetchone()[0] == values


def _status_checks() -> dict[str, str]:
    """The definitions of the validated status CHECKs, by name (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conname IN "
            "('durable_run_status_valid', 'durable_step_attempt_status_valid') AND convalidated"
        )
        return dict(cursor.fetchall())


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_migration_0019_replaces_the_status_checks_both_ways_with_rows_in_place():
    """0019 replaces each status CHECK without a table scan under the table's lock
    (NOT VALID, then validated on its own): back to 0018 the IN lists return, and
    forward the array constants, validated over the rows already there."""
    from django.core.management import call_command

    run = RunFactory(status=Status.COMPENSATION_FAILED)
    StepAttemptFactory(run=run, status="lost")
    call_command("migrate", "django_durable", "0018", verbosity=0)
    try:
        before = _status_checks()
        assert len(before) == 2 and all("ARRAY[" in d for d in before.values()), before
    finally:
        call_command("migrate", "django_durable", verbosity=0)
    after = _status_checks()
    assert len(after) == 2 and all("= ANY ('{" in d for d in after.values()), after
    assert Run.objects.get(id=run.id).status == Status.COMPENSATION_FAILED
    with broken("durable_run_status_valid"), transaction.atomic():
        raw_insert(status="done")
