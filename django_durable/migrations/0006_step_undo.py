"""Draft, never released: replaced by ``0001_0_3_initial`` (0.3.0's one migration)
and kept only so that a database migrated from ``main`` before the 0.3.0 tag
upgrades through the drafts it lacks; 0.4.0 deletes the drafts. Its database
functions are no longer created here: ``0008_0_3_functions``, the last draft,
drops every draft version and installs the release's, one version of each.

What a step replaced in the context, written once with its record (a draft: the
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

from django.db import migrations, models


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
        # Backwards, the first operation: the bound before the column is dropped.
        migrations.RunPython(migrations.RunPython.noop, bound_lock_wait, elidable=False),
    ]
