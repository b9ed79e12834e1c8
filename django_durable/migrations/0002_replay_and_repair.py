"""Draft, never released: replaced by ``0001_0_3_initial`` (0.3.0's one migration)
and kept only so that a database migrated from ``main`` before the 0.3.0 tag
upgrades through the drafts it lacks; 0.4.0 deletes the drafts. Its database
functions are no longer created here: ``0008_0_3_functions``, the last draft,
drops every draft version and installs the release's, one version of each.

Replay and repair: where a rerun came from (rerun_of_id, the run rerun() was
called with, and rerun_from_step, the step it began at), and the inputs folded into a
run by debounce or run_again (inputs, oldest first). All three are NULL for a run that
is no rerun and folded nothing, so a start's insert leaves them out."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="rerun_of_id",
            field=models.UUIDField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="rerun_from_step",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="inputs",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("rerun_of_id__isnull", False)),
                fields=["rerun_of_id"],
                name="durable_run_rerun_of",
            ),
        ),
    ]
