"""Draft, never released: replaced by ``0001_0_3_initial`` (0.3.0's one migration)
and kept only so that a database migrated from ``main`` before the 0.3.0 tag
upgrades through the drafts it lacks; 0.4.0 deletes the drafts. Its database
functions are no longer created here: ``0008_0_3_functions``, the last draft,
drops every draft version and installs the release's, one version of each.

django-durable's schema: six tables, their named rules and indexes, and on
PostgreSQL the store's functions and the runs tables' autovacuum settings.

This is the first migration of the first release. It is frozen like every
migration after it: it imports nothing from django_durable but ``OctetLength``
(the expression of a CHECK, which Django must name by its path: it never moves),
and the functions' text is in ``sql/``, read by file name. A later change is a new
migration; a function's change is a new version beside the old one
(``durable_start_v2`` beside ``durable_start_v1``), the old one dropped a release
later (docs/production.md, "Upgrading").

The rules of keys are the database's own, by name:

- ``durable_run_one_holder_per_key``: one run holds a (workflow, key);
- ``durable_run_one_waiting_per_key``: one run waits behind it (run_again);
- ``durable_run_key_length``: a key is 1 to 255 bytes of UTF-8;
- ``durable_run_holder_has_key``: only a run with a key holds one;
- ``durable_run_status_valid``, ``durable_step_attempt_status_valid``: known statuses;
- ``durable_step_completed_once``: a step's result is recorded once;
- and the counters (step index, attempt, fence, recoveries) are never negative
  (positive integer fields: ``<table>_<column>_check``).
"""

import uuid

import django.db.models.deletion
import django.db.models.lookups
import django.utils.timezone
from django.db import migrations, models

import django_durable.db_functions

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


def _choices(values):
    """A field's choices as Django records TextChoices (the value, titled)."""
    return [(value, value.replace("_", " ").title()) for value in values]


# PostgreSQL: autovacuum of the queue tables. A run is inserted, updated at its claim
# and at its end, and deleted by pruning: about three dead tuples per run. With the
# defaults (vacuum when 20% of the table is dead) a small busy table is mostly dead
# tuples and a big one waits for millions; these vacuum after 1% (plus 1,000) and
# analyse after 2%, so the claim index stays small and its statistics fresh
# (bench/soak.py measures it). The fillfactor stays 100: no update of a run can be
# HOT (each changes a column an index or its condition reads).
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

    dependencies = []

    operations = [
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
                        choices=_choices(RUN_STATUSES), default="pending", max_length=20
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
                # What each index serves: the comments of models.Run.Meta.indexes.
                "indexes": [
                    models.Index(
                        condition=models.Q(
                            ("due_at__isnull", False),
                            ("status__in", ("pending", "waiting", "compensating")),
                        ),
                        fields=["queue", "-priority", "due_at"],
                        name="durable_run_claim",
                    ),
                    models.Index(
                        condition=models.Q(("parent__isnull", False)),
                        fields=["parent"],
                        name="durable_run_parent",
                    ),
                    models.Index(
                        condition=models.Q(("runs_after__isnull", False)),
                        fields=["runs_after"],
                        name="durable_run_runs_after",
                    ),
                    models.Index(
                        condition=models.Q(("status__in", ("running", "compensating"))),
                        fields=["lease_expires_at"],
                        name="durable_run_lease",
                    ),
                    models.Index(
                        fields=["key", "workflow"],
                        name="durable_run_key",
                        opclasses=["varchar_pattern_ops", "varchar_pattern_ops"],
                    ),
                    models.Index(fields=["workflow", "status"], name="durable_run_workflow_status"),
                    models.Index(fields=["-created_at"], name="durable_run_created"),
                    models.Index(
                        condition=models.Q(("key__isnull", False)),
                        fields=["workflow", "key"],
                        name="durable_run_workflow_key",
                    ),
                    models.Index(
                        condition=models.Q(("holds_key", True), ("status__in", RUN_STATUSES)),
                        fields=["status", "workflow", "key"],
                        name="durable_run_held_status",
                    ),
                    models.Index(
                        condition=models.Q(("status", "waiting")),
                        fields=["created_at", "id"],
                        name="durable_run_waiting",
                    ),
                    models.Index(
                        condition=models.Q(("status", "waiting"), ("waiting_for", "children")),
                        fields=["id"],
                        name="durable_run_waiting_parents",
                    ),
                    models.Index(
                        condition=models.Q(
                            (
                                "status__in",
                                [
                                    "cancelled",
                                    "compensated",
                                    "compensation_failed",
                                    "completed",
                                    "failed",
                                ],
                            )
                        ),
                        fields=["finished_at"],
                        name="durable_run_finished",
                    ),
                ],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("holds_key", True)),
                        fields=("workflow", "key"),
                        name="durable_run_one_holder_per_key",
                    ),
                    models.UniqueConstraint(
                        condition=models.Q(
                            ("holds_key", False),
                            ("runs_after__isnull", False),
                            ("status", "pending"),
                        ),
                        fields=("workflow", "key"),
                        name="durable_run_one_waiting_per_key",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("status__in", RUN_STATUSES)),
                        name="durable_run_status_valid",
                    ),
                    models.CheckConstraint(
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
                    models.CheckConstraint(
                        condition=models.Q(
                            ("holds_key", False), ("key__isnull", False), _connector="OR"
                        ),
                        name="durable_run_holder_has_key",
                    ),
                ],
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
                        choices=_choices(ATTEMPT_STATUSES), default="running", max_length=20
                    ),
                ),
                ("output", models.JSONField(blank=True, null=True)),
                ("error", models.JSONField(blank=True, null=True)),
                ("logs", models.JSONField(blank=True, null=True)),
                ("worker_id", models.CharField(blank=True, max_length=200, null=True)),
                ("started_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
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
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("status", "completed")),
                        fields=("run", "kind", "step_index"),
                        name="durable_step_completed_once",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("status__in", ATTEMPT_STATUSES)),
                        name="durable_step_attempt_status_valid",
                    ),
                ],
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
                "indexes": [
                    models.Index(fields=["run", "kind", "name"], name="durable_event_lookup")
                ],
            },
        ),
        migrations.CreateModel(
            name="Activity",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "kind",
                    models.CharField(
                        choices=_choices(
                            ["key_duplicate", "key_handed_off", "key_released", "key_retaken"]
                        ),
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
        migrations.RunPython(set_storage, reset_storage, elidable=False),
    ]
