"""The status CHECKs of runs and step attempts name their statuses as one array
constant on PostgreSQL (``db_functions.AnyOf``), which it reads and simplifies at
each INSERT and UPDATE in about half the time of the ``IN (...)`` list they had;
and durable_start names the conflict its insert answers (the body changed: the
functions are installed again).

On PostgreSQL each CHECK is replaced in one short statement that does not scan
the table (the new one is added ``NOT VALID``: PostgreSQL checks every write
from then on), then validated in a transaction of its own, which reads the table
under a lock that lets starts and workers go on writing. That is why the
migration is not atomic. On SQLite the CHECKs' text is the same ``IN (...)`` as
before, so only Django's record of them changes there: the tables are not
rebuilt.
"""

from django.db import migrations, models

from django_durable.db_functions import AnyOf, text_array
from django_durable.store.functions import installing

RUN_STATUSES = [
    "pending",
    "running",
    "waiting",
    "compensating",
    "completed",
    "failed",
    "cancelled",
    "compensated",
    "compensation_failed",
]
ATTEMPT_STATUSES = ["running", "completed", "failed", "suspended", "cancelled", "lost"]

# Replace a table's status CHECK without a scan under the table's lock: drop it and
# add the other form NOT VALID, in one statement (no moment without a check).
REPLACE_CHECK = """
ALTER TABLE {table}
    DROP CONSTRAINT {name},
    ADD CONSTRAINT {name} CHECK ({check}) NOT VALID
"""

# Then check the rows already there, under a lock that lets writes go on.
VALIDATE_CHECK = "ALTER TABLE {table} VALIDATE CONSTRAINT {name}"

# (table, constraint, the statuses its CHECK allows)
CHECKS = [
    ("durable_run", "durable_run_status_valid", RUN_STATUSES),
    ("durable_step_attempt", "durable_step_attempt_status_valid", ATTEMPT_STATUSES),
]


def _as_array_check(statuses) -> str:
    """The CHECK as 0019 leaves it (what ``AnyOf`` writes on PostgreSQL)."""
    return f"(status)::text = ANY ('{text_array(statuses)}'::text[])"


def _as_in_check(statuses) -> str:
    """The CHECK before 0019 (what ``Q(status__in=...)`` wrote)."""
    return "status IN (" + ", ".join(f"'{status}'" for status in statuses) + ")"


def _replace(schema_editor, new: bool) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for table, name, statuses in CHECKS:
        check = _as_array_check(statuses) if new else _as_in_check(statuses)
        schema_editor.execute(REPLACE_CHECK.format(table=table, name=name, check=check))
        schema_editor.execute(VALIDATE_CHECK.format(table=table, name=name))


def forwards(apps, schema_editor):
    _replace(schema_editor, new=True)


def backwards(apps, schema_editor):
    _replace(schema_editor, new=False)


def _as_array(statuses):
    return AnyOf("status", statuses)


class Migration(migrations.Migration):
    # Each statement of forwards() commits alone: a CHECK is validated after the
    # table's lock is let go.
    atomic = False

    dependencies = [
        ("django_durable", "0018_start_reads_the_holder_first"),
    ]

    operations = [
        # Django's record of the CHECKs; the database's are replaced by forwards().
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="run", name="durable_run_status_valid"),
                migrations.RemoveConstraint(
                    model_name="stepattempt", name="durable_step_attempt_status_valid"
                ),
                migrations.AddConstraint(
                    model_name="run",
                    constraint=models.CheckConstraint(
                        condition=_as_array(RUN_STATUSES), name="durable_run_status_valid"
                    ),
                ),
                migrations.AddConstraint(
                    model_name="stepattempt",
                    constraint=models.CheckConstraint(
                        condition=_as_array(ATTEMPT_STATUSES),
                        name="durable_step_attempt_status_valid",
                    ),
                ),
            ],
        ),
        migrations.RunPython(forwards, backwards),
        migrations.RunPython(installing, migrations.RunPython.noop),
    ]
