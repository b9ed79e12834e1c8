"""Draft, never released: replaced by ``0001_0_3_initial`` (0.3.0's one migration)
and kept only so that a database migrated from ``main`` before the 0.3.0 tag
upgrades through the drafts it lacks; 0.4.0 deletes the drafts. Its database
functions are no longer created here: ``0008_0_3_functions``, the last draft,
drops every draft version and installs the release's, one version of each.

Flow limits as database rules, in one short claim (docs/flow-control.md): each
concurrency limit a numbered slot on durable_run under a partial unique index over
the runs that hold a worker (``durable_run_flow_slot``, ``durable_run_workflow_slot``,
``durable_run_queue_slot``), the rate slots of ``rate_per_key``
(``durable_flow_rate_slot``), the claim's gates (``durable_run_flow_due``,
``durable_run_workflow_due``), and ``durable_claim_v5``, which gives the slots.

The claim functions before it and ``durable_key_running_v1`` are dropped, as is
``durable_run_flow_level`` (only v3 and v4 read it): they were never released, so
there is no previous release's worker to keep claiming (the release folds the
history). Frozen like every migration: it imports nothing from django_durable, and
the function's text is read from ``sql/`` by file name.

On PostgreSQL the indexes on durable_run are built ``CONCURRENTLY``: a plain build
would hold its writes (every start, claim and step) until it is done. So the
migration is not atomic.
"""

from django.db import migrations, models

HOLDS_WORKER = models.Q(
    ("lease_expires_at__isnull", False), ("status__in", ("running", "compensating"))
)


class ConcurrentlyOnPostgreSQL:
    """On PostgreSQL, the index of an AddIndex or AddConstraint (a unique constraint
    with a condition is a unique index) built or dropped ``CONCURRENTLY``; as the
    operation does on another database."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        model = to_state.apps.get_model(app_label, self.model_name)
        if isinstance(self, migrations.AddIndex):
            sql = str(self.index.create_sql(model, schema_editor, concurrently=True))
        else:
            sql = str(self.constraint.create_sql(model, schema_editor))
            sql = sql.replace("CREATE UNIQUE INDEX", "CREATE UNIQUE INDEX CONCURRENTLY", 1)
        schema_editor.execute(sql)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor != "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        name = self.index.name if isinstance(self, migrations.AddIndex) else self.constraint.name
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


class AddIndex(ConcurrentlyOnPostgreSQL, migrations.AddIndex):
    pass


class AddConstraint(ConcurrentlyOnPostgreSQL, migrations.AddConstraint):
    pass


def slot(fields, name):
    condition = HOLDS_WORKER & models.Q((f"{name.removeprefix('durable_run_')}__isnull", False))
    return AddConstraint(
        model_name="run",
        constraint=models.UniqueConstraint(condition=condition, fields=fields, name=name),
    )


CLAIMABLE = ("status__in", ("pending", "waiting", "compensating"))


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_durable", "0006_step_undo"),
    ]

    operations = [
        migrations.CreateModel(
            name="FlowRateSlot",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("workflow", models.CharField(max_length=200)),
                ("flow_key", models.CharField(max_length=255)),
                ("slot", models.SmallIntegerField()),
                ("begun_at", models.DateTimeField()),
            ],
            options={
                "db_table": "durable_flow_rate_slot",
                "ordering": ["workflow", "flow_key", "slot"],
                "indexes": [models.Index(fields=["begun_at"], name="durable_flow_rate_slot_begun")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("workflow", "flow_key", "slot"), name="durable_flow_rate_slot_key"
                    )
                ],
            },
        ),
        migrations.AddField(
            model_name="run",
            name="flow_slot",
            field=models.SmallIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="workflow_slot",
            field=models.SmallIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="queue_slot",
            field=models.SmallIntegerField(blank=True, null=True),
        ),
        AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(
                    ("due_at__isnull", False), ("flow_key__isnull", False), CLAIMABLE
                ),
                fields=["queue", "due_at"],
                name="durable_run_flow_due",
            ),
        ),
        AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("due_at__isnull", False), CLAIMABLE),
                fields=["workflow", "due_at"],
                name="durable_run_workflow_due",
            ),
        ),
        slot(("workflow", "flow_key", "flow_slot"), "durable_run_flow_slot"),
        slot(("workflow", "workflow_slot"), "durable_run_workflow_slot"),
        slot(("queue", "queue_slot"), "durable_run_queue_slot"),
        migrations.RemoveIndex(model_name="run", name="durable_run_flow_level"),
    ]
