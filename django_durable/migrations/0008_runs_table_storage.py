"""Autovacuum settings of the queue tables (PostgreSQL only; nothing on SQLite).

A run is inserted, updated at its claim and at its end, and deleted by pruning:
every run leaves about three dead tuples behind. With PostgreSQL's defaults
(vacuum when 20% of the table is dead, naptime 60 s) a small, busy runs table is
mostly dead tuples between vacuums, and a big one (months of retention) waits for
millions before it is vacuumed. These settings vacuum the runs and step-attempt
tables after 1% of their rows (plus 1,000) are dead and analyse them after 2%
changed, so the claim's index stays small and its statistics fresh
(bench/soak.py measures it; docs/production.md explains it).

The fillfactor stays at 100: no update of a run can be a HOT update (every one
changes an indexed column or a column of a partial index's condition: status,
due_at, lease_expires_at), so room left on a page would only make the table
bigger. The soak measured 0 HOT updates.
"""

from django.db import migrations

TABLES = ("durable_run", "durable_step_attempt")
SETTINGS = (
    "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000, "
    "autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_vacuum_insert_threshold = 1000, "
    "autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 1000"
)
NAMES = (
    "autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, "
    "autovacuum_vacuum_insert_scale_factor, autovacuum_vacuum_insert_threshold, "
    "autovacuum_analyze_scale_factor, autovacuum_analyze_threshold"
)


def set_storage(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TABLES:
        schema_editor.execute(f"ALTER TABLE {table} SET ({SETTINGS})")


def reset_storage(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TABLES:
        schema_editor.execute(f"ALTER TABLE {table} RESET ({NAMES})")


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0007_priority_and_queues"),
    ]

    operations = [
        migrations.RunPython(set_storage, reset_storage, elidable=False),
    ]
