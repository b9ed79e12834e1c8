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


def test_an_update_to_an_unknown_status_is_refused():
    """The rule holds for an UPDATE as for an INSERT (on PostgreSQL the column's type
    checks what an UPDATE writes to it)."""
    run = RunFactory()
    with broken("durable_run_status_valid"), transaction.atomic():
        Run.objects.filter(id=run.id).update(status="paused")
    assert Run.objects.get(id=run.id).status == Status.PENDING


@pytest.mark.parametrize("column", ["step_index", "attempt", "fence", "recoveries"])
def test_a_negative_counter_is_refused(column):
    run = RunFactory()
    # PostgreSQL: the counters' domain; SQLite: the positive integer field's CHECK.
    name = "durable_counter_not_negative" if connection.vendor == "postgresql" else column
    with pytest.raises(IntegrityError, match=name), transaction.atomic():
        Run.objects.filter(id=run.id).update(**{column: -1})
    with pytest.raises(IntegrityError, match=name), transaction.atomic():
        raw_insert(**{column: -1})
    attempt = StepAttemptFactory(run=run)
    if column in ("step_index", "attempt"):
        with pytest.raises(IntegrityError, match=name), transaction.atomic():
            type(attempt).objects.filter(id=attempt.id).update(**{column: -1})


def _single_column_checks(table: str) -> list[str]:
    """The CHECKs of ``table`` that read one column (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass "
            "AND contype = 'c' AND cardinality(conkey) = 1 ORDER BY conname",
            [table],
        )
        return [name for (name,) in cursor.fetchall()]


def _column_types(table: str) -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            [table],
        )
        return dict(cursor.fetchall())


DOMAIN_COLUMNS = {
    "durable_run": {
        "status": "durable_run_status",
        "key": "durable_run_key",
        "step_index": "durable_counter",
        "attempt": "durable_counter",
        "fence": "durable_counter",
        "recoveries": "durable_counter",
    },
    "durable_step_attempt": {
        "status": "durable_step_attempt_status",
        "step_index": "durable_counter",
        "attempt": "durable_counter",
    },
}


def _assert_the_columns_have_their_domains() -> None:
    """No CHECK of one column left on the tables, each such column typed by its domain."""
    for table, domains in DOMAIN_COLUMNS.items():
        assert _single_column_checks(table) == []
        types = _column_types(table)
        assert {column: types[column] for column in domains} == domains


@pytest.mark.postgres
def test_postgresql_checks_the_rules_of_one_column_by_its_type():
    """PostgreSQL reads every CHECK of a table back from its text at each INSERT and
    UPDATE; a domain's check is read once per session. So the tables written at
    every start and step keep only the CHECK that reads two columns
    (durable_run_holder_has_key), and each column with a rule of its own has a
    domain as its type, whose check is validated and named as the rule."""
    _assert_the_columns_have_their_domains()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT t.typname, c.conname, c.convalidated FROM pg_constraint AS c "
            "JOIN pg_type AS t ON t.oid = c.contypid WHERE t.typname LIKE 'durable%%'"
        )
        checks = {domain: (name, valid) for domain, name, valid in cursor.fetchall()}
    assert checks == {
        "durable_counter": ("durable_counter_not_negative", True),
        "durable_run_status": ("durable_run_status_valid", True),
        "durable_step_attempt_status": ("durable_step_attempt_status_valid", True),
        "durable_run_key": ("durable_run_key_length", True),
    }


@pytest.mark.postgres
def test_postgresql_keeps_each_status_check_as_one_array_constant():
    """The status checks (the domains' since migration 0020, the tables' from 0019)
    are stored as one array constant, not an ``IN`` list (an array rebuilt from one
    constant per status each time it is read): they name the model's statuses, and
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
    """The definitions of the validated status CHECKs, by name, of the tables or of
    the domains (PostgreSQL)."""
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


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_migration_0020_moves_the_rules_into_the_column_types_both_ways_with_rows_in_place():
    """Back to 0019 the tables' CHECKs return (the counters' too) and the columns
    their base types; forward the domains, with the rows kept and the rules held."""
    from django.core.management import call_command

    run = RunFactory(status=Status.COMPENSATION_FAILED, key="order:1", attempt=3, fence=2)
    StepAttemptFactory(run=run, status="lost", step_index=1)
    call_command("migrate", "django_durable", "0019", verbosity=0)
    try:
        assert _single_column_checks("durable_run") == [
            "durable_run_attempt_check",
            "durable_run_fence_check",
            "durable_run_key_length",
            "durable_run_recoveries_check",
            "durable_run_status_valid",
            "durable_run_step_index_check",
        ]
        assert _single_column_checks("durable_step_attempt") == [
            "durable_step_attempt_attempt_check",
            "durable_step_attempt_status_valid",
            "durable_step_attempt_step_index_check",
        ]
        types = _column_types("durable_run")
        assert (types["status"], types["key"], types["fence"]) == (
            "character varying(20)",
            "character varying(255)",
            "integer",
        )
        with broken("durable_run_status_valid"), transaction.atomic():
            raw_insert(status="done")
    finally:
        call_command("migrate", "django_durable", verbosity=0)
    _assert_the_columns_have_their_domains()
    kept = Run.objects.get(id=run.id)
    assert (kept.status, kept.key, kept.attempt, kept.fence) == (
        Status.COMPENSATION_FAILED,
        "order:1",
        3,
        2,
    )
    assert kept.attempts.get().status == "lost"
    with broken("durable_run_status_valid"), transaction.atomic():
        raw_insert(status="done")
    with broken("durable_run_key_length"), transaction.atomic():
        raw_insert(key="")
