"""What a step replaced in the context, written once with its record (a draft: the
lead renumbers it at merge, and it is folded into the release's migration).

``StepAttempt.replaced``: on a completed attempt, the values its step (or
compensation) replaced in the run's context, ``{name: [old value]}`` or
``{name: []}`` for a name it added; NULL when it changed nothing. A rerun from a
step reads them back to find the context the step began with
(docs/replay-and-repair.md). Until now they were kept in ``Run.state["undo"]``,
which every later step's record wrote again: a run's record grew as the square of
its steps. ``durable_record_step_v2`` (PostgreSQL) writes them into the attempt's
row; the file in ``sql/`` says how.

Expand, not replace: the column is nullable without a default (a change of the
catalog only, no rewrite of the table, under a short ACCESS EXCLUSIVE lock of
``durable_step_attempt``, bounded by ``lock_timeout`` below), and
``durable_record_step_v1`` stays for the previous release's workers, whose records
keep what a step replaced in the run's state, which a rerun still reads. Frozen like
every migration: it imports nothing from django_durable, and the function's text is
read from ``sql/`` by file name.
"""

from pathlib import Path

from django.db import migrations, models

SQL = Path(__file__).resolve().parent / "sql"
FUNCTIONS = ["durable_record_step_v2"]


def create_functions(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for name in FUNCTIONS:
            cursor.execute((SQL / f"{name}.sql").read_text(encoding="utf-8"))


def drop_functions(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in reversed(FUNCTIONS):
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {name}")


def bound_lock_wait(apps, schema_editor):
    """Give up (and let ``migrate`` be run again) rather than queue every start and
    step behind the ALTER TABLE while a long transaction holds the attempts' table."""
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("SET LOCAL lock_timeout = '5s'")


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0005_flow_claim_one_statement"),
    ]

    operations = [
        migrations.RunPython(bound_lock_wait, migrations.RunPython.noop, elidable=False),
        migrations.AddField(
            model_name="stepattempt",
            name="replaced",
            field=models.JSONField(blank=True, null=True),
        ),
        # After the column: durable_record_step_v2 writes it.
        migrations.RunPython(create_functions, drop_functions, elidable=False),
        # Backwards, the first operation: the bound before the column is dropped.
        migrations.RunPython(migrations.RunPython.noop, bound_lock_wait, elidable=False),
    ]
