"""Flow limits as database rules, in one short claim (docs/flow-control.md): each
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

from pathlib import Path

from django.db import migrations, models

SQL = Path(__file__).resolve().parent / "sql"
FUNCTIONS = ["durable_claimable_v1", "durable_holds_worker_v1", "durable_claim_v5"]
DROPPED = [
    "durable_claim_v1",
    "durable_claim_v2",
    "durable_claim_v3",
    "durable_claim_v4",
    "durable_key_running_v1",
]
HOLDS_WORKER = models.Q(("lease_expires_at__isnull", False), ("status__in", ("running", "compensating")))


def create_functions(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        for name in DROPPED:
            cursor.execute(f"DROP FUNCTION IF EXISTS {name}")
        for name in FUNCTIONS:
            cursor.execute((SQL / f"{name}.sql").read_text(encoding="utf-8"))


def drop_functions(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in reversed(FUNCTIONS):
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {name}")
    with schema_editor.connection.cursor() as cursor:
        for name in ("durable_claim_v1", "durable_key_running_v1", "durable_claim_v4"):
            cursor.execute((SQL / f"{name}.sql").read_text(encoding="utf-8"))


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
                condition=models.Q(("due_at__isnull", False), ("flow_key__isnull", False), CLAIMABLE),
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
        # After the columns and indexes: durable_claim_v5 reads them.
        migrations.RunPython(create_functions, drop_functions, elidable=False),
        migrations.RemoveIndex(model_name="run", name="durable_run_flow_level"),
    ]
