"""django-durable 0.3.0's schema, in one migration: ten tables, their named rules and
indexes, and on PostgreSQL the store's functions (one version of each) and the runs
tables' autovacuum settings. Frozen from the 0.3.0 tag on (django_durable/migrations/
RELEASED.json pins it): a later change is a new migration of a later release, named by
that release (docs/contributing.md).

It replaces the drafts ``0001_initial`` to ``0008_0_3_functions`` made on ``main`` before
the tag: a fresh database applies this migration alone, and one migrated from ``main``
applies the drafts it lacks (tests/test_schema.py checks both end equal). 0.4.0
deletes the drafts and this ``replaces``.

The rules are the database's own, by name (docs/keys.md, docs/flow-control.md):

- ``durable_run_one_holder_per_key``: one run holds a (workflow, key);
- ``durable_run_one_waiting_per_key``: one run waits behind it (run_again);
- ``durable_run_key_length``, ``durable_run_flow_key_length``: 1 to 255 bytes of UTF-8;
- ``durable_run_holder_has_key``: only a run with a key holds one;
- ``durable_run_flow_slot``, ``durable_run_workflow_slot``, ``durable_run_queue_slot``:
  a numbered slot of a flow key's, a workflow's or a queue's concurrency is held by
  one run holding a worker at a time (the claim gives slots below the limit);
- ``durable_flow_rate_slot_key``: a rate slot of a flow key begins one run per window;
- ``durable_run_status_valid``, ``durable_step_attempt_status_valid``: known statuses;
- ``durable_step_completed_once``: a step's result is recorded once;
- and the counters (step index, attempt, fence, recoveries) are never negative
  (positive integer fields: ``<table>_<column>_check``).

It imports nothing from django_durable but ``OctetLength`` (the expression of a CHECK,
which Django must name by its path: it never moves); the functions' text is in
``sql/``, read by file name. On a fresh database its indexes are built plainly: the
tables are empty.
"""

import uuid
from pathlib import Path

import django.db.models.deletion
import django.db.models.lookups
import django.utils.timezone
from django.db import migrations, models

import django_durable.db_functions

# PostgreSQL: the store's functions, one file each in sql/ (what each does is at the
# top of its file), in the order they are created. Planned once per database session,
# each is a start, a claim, the next due time or a step's record in one round trip.
SQL = Path(__file__).resolve().parent / "sql"
FUNCTIONS = [
    "durable_claimable_v1",
    "durable_holds_worker_v1",
    "durable_start_v2",
    "durable_next_due_at_v1",
    "durable_record_step_v2",
    "durable_claim_v5",
]


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


# PostgreSQL: autovacuum of the queue tables. A run is inserted, updated at its claim
# and at its end, and deleted by pruning: about three dead tuples per run. With the
# defaults (vacuum when 20% of the table is dead) a small busy table is mostly dead
# tuples and a big one waits for millions; these vacuum after 1% (plus 1,000) and
# analyse after 2%, so the claim index stays small and its statistics fresh
# (bench/soak.py measures it).
STORAGE_TABLES = ["durable_run", "durable_step_attempt"]
STORAGE = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_insert_scale_factor": "0.02",
    "autovacuum_vacuum_insert_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_analyze_threshold": "1000",
}


def set_storage(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    settings = ", ".join(f"{name} = {value}" for name, value in STORAGE.items())
    for table in STORAGE_TABLES:
        schema_editor.execute(f"ALTER TABLE {table} SET ({settings})")


def reset_storage(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in STORAGE_TABLES:
        schema_editor.execute(f"ALTER TABLE {table} RESET ({', '.join(STORAGE)})")


class Migration(migrations.Migration):
    initial = True

    replaces = [
        ("django_durable", "0001_initial"),
        ("django_durable", "0002_replay_and_repair"),
        ("django_durable", "0003_flow_control"),
        ("django_durable", "0004_flow_claim_by_key"),
        ("django_durable", "0005_flow_claim_one_statement"),
        ("django_durable", "0006_step_undo"),
        ("django_durable", "0007_flow_slots"),
        ("django_durable", "0008_0_3_functions"),
    ]

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="QueueState",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("paused", models.BooleanField(default=False)),
                ("changed_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                "verbose_name": "queue",
                "db_table": "durable_queue",
                "ordering": ["name"],
            },
        ),
        migrations.CreateModel(
            name="WorkerNode",
            fields=[
                ("id", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("hostname", models.CharField(max_length=255)),
                ("pid", models.PositiveIntegerField()),
                ("queues", models.JSONField(default=list)),
                ("concurrency", models.PositiveIntegerField(default=1)),
                ("started_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("heartbeat_at", models.DateTimeField()),
                ("stopping", models.BooleanField(default=False)),
                ("workflows", models.JSONField(blank=True, default=None, null=True)),
            ],
            options={
                "db_table": "durable_worker_node",
                "ordering": ["id"],
            },
        ),
        migrations.CreateModel(
            name="Activity",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("key_duplicate", "Key Duplicate"),
                            ("key_handed_off", "Key Handed Off"),
                            ("key_released", "Key Released"),
                            ("key_retaken", "Key Retaken"),
                        ],
                        max_length=30,
                    ),
                ),
                ("run_id", models.UUIDField(blank=True, null=True)),
                ("workflow", models.CharField(max_length=200)),
                ("key", models.CharField(blank=True, max_length=255, null=True)),
                ("details", models.JSONField(default=dict)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                "verbose_name_plural": "activity",
                "db_table": "durable_activity",
                "ordering": ["-created_at", "-id"],
                "indexes": [
                    models.Index(fields=["created_at"], name="durable_activity_created"),
                    models.Index(fields=["kind", "created_at"], name="durable_activity_kind"),
                    models.Index(fields=["run_id"], name="durable_activity_run"),
                    models.Index(fields=["workflow", "key"], name="durable_activity_key"),
                    models.Index(
                        condition=models.Q(("kind", "key_duplicate")),
                        fields=["workflow", "key", "created_at"],
                        name="durable_activity_readds",
                    ),
                ],
            },
        ),
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
                "indexes": [
                    models.Index(fields=["queue", "claimed_at"], name="durable_flow_turn_last")
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("queue", "flow_key"), name="durable_flow_turn_key"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="Run",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=uuid.uuid4, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("workflow", models.CharField(max_length=200)),
                ("queue", models.CharField(default="default", max_length=100)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("pending", "Pending"),
                            ("running", "Running"),
                            ("waiting", "Waiting"),
                            ("compensating", "Compensating"),
                            ("completed", "Completed"),
                            ("failed", "Failed"),
                            ("cancelled", "Cancelled"),
                            ("compensated", "Compensated"),
                            ("compensation_failed", "Compensation Failed"),
                        ],
                        default="pending",
                        max_length=20,
                    ),
                ),
                ("priority", models.IntegerField(db_default=0, default=0)),
                ("input", models.JSONField(default=dict)),
                ("context", models.JSONField(default=dict)),
                ("result", models.JSONField(blank=True, null=True)),
                ("error", models.JSONField(blank=True, null=True)),
                ("key", models.CharField(blank=True, max_length=255, null=True)),
                ("holds_key", models.BooleanField(default=False)),
                ("step_index", models.PositiveIntegerField(default=0)),
                ("attempt", models.PositiveIntegerField(default=1)),
                ("due_at", models.DateTimeField(blank=True, null=True)),
                ("timeout_at", models.DateTimeField(blank=True, null=True)),
                ("debounce_deadline", models.DateTimeField(blank=True, null=True)),
                ("waiting_for", models.CharField(blank=True, max_length=300, null=True)),
                ("state", models.JSONField(blank=True, default=dict)),
                ("worker_id", models.CharField(blank=True, max_length=200, null=True)),
                ("lease_expires_at", models.DateTimeField(blank=True, null=True)),
                ("fence", models.PositiveIntegerField(default=0)),
                ("recoveries", models.PositiveIntegerField(db_default=0, default=0)),
                ("step_names", models.JSONField(blank=True, db_default=[], default=list)),
                ("trace_context", models.JSONField(blank=True, null=True)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("rerun_of_id", models.UUIDField(blank=True, null=True)),
                ("rerun_from_step", models.CharField(blank=True, max_length=200, null=True)),
                ("inputs", models.JSONField(blank=True, null=True)),
                ("flow_key", models.CharField(blank=True, max_length=255, null=True)),
                ("flow_slot", models.SmallIntegerField(blank=True, null=True)),
                ("workflow_slot", models.SmallIntegerField(blank=True, null=True)),
                ("queue_slot", models.SmallIntegerField(blank=True, null=True)),
                (
                    "parent",
                    models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="children",
                        to="django_durable.run",
                    ),
                ),
                (
                    "runs_after",
                    models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="django_durable.run",
                    ),
                ),
            ],
            options={
                "db_table": "durable_run",
                "ordering": ["-created_at"],
            },
        ),
        migrations.CreateModel(
            name="Event",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "kind",
                    models.CharField(
                        choices=[("event", "Event"), ("input", "Input")],
                        default="event",
                        max_length=10,
                    ),
                ),
                ("name", models.CharField(max_length=200)),
                ("payload", models.JSONField(blank=True, null=True)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("delivered_at", models.DateTimeField(blank=True, null=True)),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="events",
                        to="django_durable.run",
                    ),
                ),
            ],
            options={
                "db_table": "durable_event",
                "ordering": ["run", "id"],
            },
        ),
        migrations.CreateModel(
            name="HeldKey",
            fields=[],
            options={
                "verbose_name": "key",
                "verbose_name_plural": "keys",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("django_durable.run",),
        ),
        migrations.CreateModel(
            name="Schedule",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=200, unique=True)),
                ("workflow", models.CharField(max_length=200)),
                ("cron", models.CharField(max_length=200)),
                ("key", models.CharField(blank=True, max_length=255, null=True)),
                ("input", models.JSONField(default=dict)),
                ("timezone", models.CharField(default="UTC", max_length=64)),
                ("enabled", models.BooleanField(default=True)),
                ("next_fire_at", models.DateTimeField(blank=True, null=True)),
                ("last_fired_at", models.DateTimeField(blank=True, null=True)),
                ("last_run_id", models.UUIDField(blank=True, null=True)),
                ("failures", models.PositiveIntegerField(default=0)),
                ("declared", models.BooleanField(default=False)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                "db_table": "durable_schedule",
                "ordering": ["name"],
                "indexes": [
                    models.Index(
                        condition=models.Q(("enabled", True)),
                        fields=["next_fire_at"],
                        name="durable_schedule_due",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="StepAttempt",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "kind",
                    models.CharField(
                        choices=[("step", "Step"), ("compensation", "Compensation")],
                        default="step",
                        max_length=20,
                    ),
                ),
                ("step", models.CharField(max_length=200)),
                ("step_index", models.PositiveIntegerField()),
                ("attempt", models.PositiveIntegerField()),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("running", "Running"),
                            ("completed", "Completed"),
                            ("failed", "Failed"),
                            ("suspended", "Suspended"),
                            ("cancelled", "Cancelled"),
                            ("lost", "Lost"),
                        ],
                        default="running",
                        max_length=20,
                    ),
                ),
                ("output", models.JSONField(blank=True, null=True)),
                ("error", models.JSONField(blank=True, null=True)),
                ("logs", models.JSONField(blank=True, null=True)),
                ("worker_id", models.CharField(blank=True, max_length=200, null=True)),
                ("started_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                ("replaced", models.JSONField(blank=True, null=True)),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="attempts",
                        to="django_durable.run",
                    ),
                ),
            ],
            options={
                "db_table": "durable_step_attempt",
                "ordering": ["run", "id"],
            },
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(
                    ("due_at__isnull", False),
                    ("status__in", ("pending", "waiting", "compensating")),
                ),
                fields=["queue", "-priority", "due_at"],
                name="durable_run_claim",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("parent__isnull", False)),
                fields=["parent"],
                name="durable_run_parent",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("runs_after__isnull", False)),
                fields=["runs_after"],
                name="durable_run_runs_after",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status__in", ("running", "compensating"))),
                fields=["lease_expires_at"],
                name="durable_run_lease",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                fields=["key", "workflow"],
                name="durable_run_key",
                opclasses=["varchar_pattern_ops", "varchar_pattern_ops"],
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["workflow", "status"], name="durable_run_workflow_status"),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["-created_at"], name="durable_run_created"),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("key__isnull", False)),
                fields=["workflow", "key"],
                name="durable_run_workflow_key",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(
                    ("holds_key", True),
                    (
                        "status__in",
                        [
                            "pending",
                            "running",
                            "waiting",
                            "compensating",
                            "completed",
                            "failed",
                            "cancelled",
                            "compensated",
                            "compensation_failed",
                        ],
                    ),
                ),
                fields=["status", "workflow", "key"],
                name="durable_run_held_status",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status", "waiting")),
                fields=["created_at", "id"],
                name="durable_run_waiting",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status", "waiting"), ("waiting_for", "children")),
                fields=["id"],
                name="durable_run_waiting_parents",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("rerun_of_id__isnull", False)),
                fields=["rerun_of_id"],
                name="durable_run_rerun_of",
            ),
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
                    ("flow_key__isnull", False),
                    ("status__in", ("pending", "waiting", "compensating")),
                ),
                fields=["queue", "due_at"],
                name="durable_run_flow_due",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(
                    ("due_at__isnull", False),
                    ("status__in", ("pending", "waiting", "compensating")),
                ),
                fields=["workflow", "due_at"],
                name="durable_run_workflow_due",
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
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(
                    ("flow_key__isnull", False),
                    ("lease_expires_at__isnull", False),
                    ("status__in", ("running", "compensating")),
                ),
                fields=["workflow", "flow_key"],
                name="durable_run_flow_busy",
            ),
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(
                    (
                        "status__in",
                        ["cancelled", "compensated", "compensation_failed", "completed", "failed"],
                    )
                ),
                fields=["finished_at"],
                name="durable_run_finished",
            ),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.UniqueConstraint(
                condition=models.Q(("holds_key", True)),
                fields=("workflow", "key"),
                name="durable_run_one_holder_per_key",
            ),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("holds_key", False), ("runs_after__isnull", False), ("status", "pending")
                ),
                fields=("workflow", "key"),
                name="durable_run_one_waiting_per_key",
            ),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "status__in",
                        [
                            "pending",
                            "running",
                            "waiting",
                            "compensating",
                            "completed",
                            "failed",
                            "cancelled",
                            "compensated",
                            "compensation_failed",
                        ],
                    )
                ),
                name="durable_run_status_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("key__isnull", True),
                    models.Q(
                        django.db.models.lookups.GreaterThanOrEqual(
                            django_durable.db_functions.OctetLength("key"), 1
                        ),
                        django.db.models.lookups.LessThanOrEqual(
                            django_durable.db_functions.OctetLength("key"), 255
                        ),
                    ),
                    _connector="OR",
                ),
                name="durable_run_key_length",
            ),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.CheckConstraint(
                condition=models.Q(("holds_key", False), ("key__isnull", False), _connector="OR"),
                name="durable_run_holder_has_key",
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
            model_name="run",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("lease_expires_at__isnull", False),
                    ("status__in", ("running", "compensating")),
                    ("flow_slot__isnull", False),
                ),
                fields=("workflow", "flow_key", "flow_slot"),
                name="durable_run_flow_slot",
            ),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("lease_expires_at__isnull", False),
                    ("status__in", ("running", "compensating")),
                    ("workflow_slot__isnull", False),
                ),
                fields=("workflow", "workflow_slot"),
                name="durable_run_workflow_slot",
            ),
        ),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("lease_expires_at__isnull", False),
                    ("status__in", ("running", "compensating")),
                    ("queue_slot__isnull", False),
                ),
                fields=("queue", "queue_slot"),
                name="durable_run_queue_slot",
            ),
        ),
        migrations.AddIndex(
            model_name="event",
            index=models.Index(fields=["run", "kind", "name"], name="durable_event_lookup"),
        ),
        migrations.AddConstraint(
            model_name="stepattempt",
            constraint=models.UniqueConstraint(
                condition=models.Q(("status", "completed")),
                fields=("run", "kind", "step_index"),
                name="durable_step_completed_once",
            ),
        ),
        migrations.AddConstraint(
            model_name="stepattempt",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "status__in",
                        ["running", "completed", "failed", "suspended", "cancelled", "lost"],
                    )
                ),
                name="durable_step_attempt_status_valid",
            ),
        ),
        migrations.RunPython(set_storage, reset_storage, elidable=False),
        # After the tables: the functions read and write them.
        migrations.RunPython(create_functions, drop_functions, elidable=False),
    ]
