"""The status CHECKs of runs and step attempts name their statuses as one array
constant on PostgreSQL (``db_functions.AnyOf``), which it reads and simplifies at
each INSERT and UPDATE in about half the time of the ``IN (...)`` list they had;
and durable_start names the conflict its insert answers (the body changed: the
functions are installed again).

On SQLite the CHECKs' text is the same ``IN (...)`` as before, so only Django's
record of them changes there: the tables are not rebuilt.
"""

from django.db import migrations, models

import django_durable.db_functions
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

# (model, constraint name, the statuses it allows)
CHECKS = [
    ("run", "durable_run_status_valid", RUN_STATUSES),
    ("stepattempt", "durable_step_attempt_status_valid", ATTEMPT_STATUSES),
]


def _swap(apps, schema_editor, old, new):
    """Replace each CHECK ``old(statuses)`` by ``new(statuses)`` (PostgreSQL only)."""
    if schema_editor.connection.vendor != "postgresql":
        return
    for model_name, name, statuses in CHECKS:
        model = apps.get_model("django_durable", model_name)
        schema_editor.remove_constraint(
            model, models.CheckConstraint(condition=old(statuses), name=name)
        )
        schema_editor.add_constraint(
            model, models.CheckConstraint(condition=new(statuses), name=name)
        )


def _as_in_list(statuses):
    return models.Q(status__in=statuses)


def _as_array(statuses):
    return django_durable.db_functions.AnyOf("status", statuses)


def forwards(apps, schema_editor):
    _swap(apps, schema_editor, _as_in_list, _as_array)


def backwards(apps, schema_editor):
    _swap(apps, schema_editor, _as_array, _as_in_list)


class Migration(migrations.Migration):
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
