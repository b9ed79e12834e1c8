"""Draft, never released: replaced by ``0001_0_3_initial`` (0.3.0's one migration)
and kept only so that a database migrated from ``main`` before the 0.3.0 tag
upgrades through the drafts it lacks; 0.4.0 deletes the drafts. Its database
functions are no longer created here: ``0008_0_3_functions``, the last draft,
drops every draft version and installs the release's, one version of each.

Flow control by key (docs/flow-control.md): a run's flow key (``flow_key``, 1 to
255 bytes: ``durable_run_flow_key_length``), the claim's index of flow-keyed runs
(``durable_run_flow``) and of their begins (``durable_run_flow_begun``, for
``rate_per_key``), the table of turns (``durable_flow_turn``), and on PostgreSQL two
new versions of the store's functions: ``durable_start_v2`` (takes the flow key) and
``durable_claim_v2`` (enforces the limits and takes turns).

Expand, not replace: ``durable_start_v1`` and ``durable_claim_v1`` stay, so the
previous release's processes keep starting and claiming during a rolling deploy (their
runs have no flow key; their claims apply no flow limit). A later release drops them.
Frozen like every migration: it imports nothing from django_durable but
``OctetLength`` (the CHECK's expression, which Django names by its path), and the
functions' text is read from ``sql/`` by file name.
"""

import django.db.models.lookups
import django.utils.timezone
from django.db import migrations, models

import django_durable.db_functions


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0002_replay_and_repair"),
    ]

    operations = [
        migrations.CreateModel(
            name="FlowTurn",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("queue", models.CharField(max_length=100)),
                ("flow_key", models.CharField(blank=True, max_length=255)),
                ("claimed_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                "db_table": "durable_flow_turn",
                "ordering": ["queue", "flow_key"],
            },
        ),
        migrations.AddField(
            model_name="run",
            name="flow_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(
                    ("due_at__isnull", False),
                    ("flow_key__isnull", False),
                    ("status__in", ("pending", "waiting", "compensating")),
                ),
                fields=["queue", "flow_key", "workflow", "-priority", "due_at", "id"],
                name="durable_run_flow",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(
                    ("due_at__isnull", False),
                    ("flow_key__isnull", True),
                    ("status__in", ("pending", "waiting", "compensating")),
                ),
                fields=["queue", "-priority", "due_at"],
                name="durable_run_claim_no_flow",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("flow_key__isnull", False), ("started_at__isnull", False)),
                fields=["workflow", "flow_key", "started_at"],
                name="durable_run_flow_begun",
            ),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("flow_key__isnull", True),
                    models.Q(
                        django.db.models.lookups.GreaterThanOrEqual(
                            django_durable.db_functions.OctetLength("flow_key"), 1
                        ),
                        django.db.models.lookups.LessThanOrEqual(
                            django_durable.db_functions.OctetLength("flow_key"), 255
                        ),
                    ),
                    _connector="OR",
                ),
                name="durable_run_flow_key_length",
            ),
        ),
        migrations.AddConstraint(
            model_name="flowturn",
            constraint=models.UniqueConstraint(
                fields=("queue", "flow_key"), name="durable_flow_turn_key"
            ),
        ),
    ]
