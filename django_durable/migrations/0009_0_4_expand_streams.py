"""0.4, expand: live progress and streams (docs/streams.md): ``durable_stream``, one row per (run,
stream name), and ``durable_stream_item``, the items.

Expand only: two new tables; ``durable_run`` gains no column (``Run.progress`` is the
latest value of the run's ``progress`` stream). Their foreign keys to ``durable_run``
take a brief lock on it (SHARE ROW EXCLUSIVE, which blocks its writes while it waits),
so on PostgreSQL the migration first sets ``lock_timeout``: behind a long transaction
it fails after 5 s instead of holding every start and claim in a queue behind it, and
``migrate`` can simply be run again. Frozen: it imports nothing from django_durable but
``OctetLength`` (the name's CHECK), by path.

On PostgreSQL it creates ``durable_stream_write_v1`` (read from ``sql/`` by file name),
the write a step makes for each item, and leaves half of each page of
``durable_stream`` free (``fillfactor``): a stream's row is rewritten by every write,
and an update that finds room on its page stays a HOT update (no index touched).
"""

import django.db.models.deletion
import django.db.models.lookups
import django.utils.timezone
from pathlib import Path

from django.db import migrations, models

import django_durable.db_functions

SQL = Path(__file__).resolve().parent / "sql"
# The functions this migration creates (the release rules and doctor read the list).
FUNCTIONS = ["durable_stream_write_v1"]
FUNCTION = FUNCTIONS[0]


def set_lock_timeout(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("SET LOCAL lock_timeout = '5s'")


def create_write_function(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("ALTER TABLE durable_stream SET (fillfactor = 50)")
    with schema_editor.connection.cursor() as cursor:
        cursor.execute((SQL / f"{FUNCTION}.sql").read_text(encoding="utf-8"))


def drop_write_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0001_0_3_initial"),
    ]

    operations = [
        migrations.RunPython(set_lock_timeout, set_lock_timeout, elidable=True),
        migrations.CreateModel(
            name="Stream",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=100)),
                ("items", models.PositiveIntegerField(default=0)),
                ("step_index", models.PositiveIntegerField(blank=True, null=True)),
                ("fence", models.PositiveIntegerField(blank=True, null=True)),
                ("reset", models.BooleanField(default=False)),
                ("latest", models.JSONField(blank=True, null=True)),
                ("closed_at", models.DateTimeField(blank=True, null=True)),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="streams",
                        to="django_durable.run",
                    ),
                ),
            ],
            options={
                "db_table": "durable_stream",
                "ordering": ["run", "name"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("run", "name"), name="durable_stream_one_per_name"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            django.db.models.lookups.GreaterThanOrEqual(
                                django_durable.db_functions.OctetLength("name"), 1
                            ),
                            django.db.models.lookups.LessThanOrEqual(
                                django_durable.db_functions.OctetLength("name"), 100
                            ),
                        ),
                        name="durable_stream_name_length",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="StreamEntry",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("stream", models.CharField(max_length=100)),
                ("offset", models.PositiveIntegerField()),
                (
                    "kind",
                    models.CharField(
                        choices=[("value", "Value"), ("reset", "Reset")],
                        default="value",
                        max_length=10,
                    ),
                ),
                ("value", models.JSONField(blank=True, null=True)),
                ("step", models.CharField(max_length=200)),
                ("attempt", models.PositiveIntegerField()),
                ("written_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="django_durable.run",
                    ),
                ),
            ],
            options={
                "db_table": "durable_stream_item",
                "ordering": ["run", "stream", "offset"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("run", "stream", "offset"), name="durable_stream_item_once"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("kind__in", ["value", "reset"])),
                        name="durable_stream_item_kind_valid",
                    ),
                ],
            },
        ),
        migrations.RunPython(create_write_function, drop_write_function, elidable=False),
    ]
