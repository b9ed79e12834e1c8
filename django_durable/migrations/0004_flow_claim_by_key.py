"""Draft, never released: replaced by ``0001_0_3_initial`` (0.3.0's one migration)
and kept only so that a database migrated from ``main`` before the 0.3.0 tag
upgrades through the drafts it lacks; 0.4.0 deletes the drafts. Its database
functions are no longer created here: ``0008_0_3_functions``, the last draft,
drops every draft version and installs the release's, one version of each.

The claim with flow keys, by key (docs/flow-control.md): ``durable_claim_v3``, on
PostgreSQL, and its two indexes. A claimer walks the keys in turns from its queue's
pointer (the key the last claim took last: ``durable_flow_turn_last``), one priority
level at a time (``durable_run_flow_level``), takes the keys no other claimer is
claiming from (a lock per key it tries without waiting), then locks only the runs it
picks. v2 read every key with claimable runs at every claim, serialised every claimer
of a limited workflow, and locked a claim's worth of runs of every due key. The file
in ``sql/`` says how.

Expand, not replace: ``durable_claim_v2`` and ``durable_claim_v1`` stay, so the
previous releases' processes keep claiming during a rolling deploy. A v3 claimer
takes a limited workflow's lock shared, which a v2 claimer takes exclusive: the two
never count at once, and the limits stay exact while both run. No table changes.
Frozen like every migration: it imports nothing from django_durable, and the
function's text is read from ``sql/`` by file name.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0003_flow_control"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(
                    ("due_at__isnull", False),
                    ("flow_key__isnull", False),
                    ("status__in", ("pending", "waiting", "compensating")),
                ),
                fields=["queue", "-priority", "flow_key", "workflow", "due_at", "id"],
                name="durable_run_flow_level",
            ),
        ),
        migrations.AddIndex(
            model_name="flowturn",
            index=models.Index(fields=["queue", "claimed_at"], name="durable_flow_turn_last"),
        ),
    ]
