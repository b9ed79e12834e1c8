"""Draft, never released: replaced by ``0001_0_3_initial`` (0.3.0's one migration)
and kept only so that a database migrated from ``main`` before the 0.3.0 tag
upgrades through the drafts it lacks; 0.4.0 deletes the drafts. Its database
functions are no longer created here: ``0008_0_3_functions``, the last draft,
drops every draft version and installs the release's, one version of each.

The claim with flow keys in one statement where it can be (docs/flow-control.md):
``durable_claim_v4``, on PostgreSQL, with ``durable_key_running_v1`` and the index it
reads, ``durable_run_flow_busy``.

v3 read the keys it would take in one statement and claimed their runs in a second,
whose newer snapshot made the count of each key's running runs exact. v4 takes a
key's first due run in the statement that walks the keys, once it holds the key's
lock, and counts the key's running runs with ``durable_key_running_v1``: a volatile
function takes its own snapshot, after the lock, so the count stays exact inside the
one statement. The steps of v3 stay for what one statement cannot do (more than one
run per key, several queues, rates, workflow-wide limits). The file in ``sql/`` says
how.

Expand, not replace: ``durable_claim_v3``, ``_v2`` and ``_v1`` stay, so the previous
releases' processes keep claiming during a rolling deploy. v4 takes the same locks as
v3 (each key's lock, each limited workflow's lock shared or exclusive), so v3 and v4
claimers never count a key at once, nor v2 and v4 a workflow. Frozen like every
migration: it imports nothing from django_durable, and the functions' text is read
from ``sql/`` by file name.

On PostgreSQL the index is built ``CONCURRENTLY``: the build reads the whole of
``durable_run``, and a plain ``CREATE INDEX`` would hold its writes (every start,
claim and step) until it is done. So the migration is not atomic.
"""

from django.db import migrations, models


class AddIndexConcurrentlyOnPostgreSQL(migrations.AddIndex):
    """Django's ``AddIndexConcurrently`` on PostgreSQL; a plain ``AddIndex`` on another
    database (SQLite has no concurrent build, and nothing to wait for). Imported only
    on PostgreSQL: django.contrib.postgres needs psycopg, which a project on SQLite
    may not have installed."""

    def _apply(self, direction: str, app_label, schema_editor, from_state, to_state):
        operation = super()
        if schema_editor.connection.vendor == "postgresql":
            from django.contrib.postgres.operations import AddIndexConcurrently

            operation = AddIndexConcurrently(self.model_name, self.index)
        getattr(operation, direction)(app_label, schema_editor, from_state, to_state)

    def database_forwards(self, *args):
        self._apply("database_forwards", *args)

    def database_backwards(self, *args):
        self._apply("database_backwards", *args)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_durable", "0004_flow_claim_by_key"),
    ]

    operations = [
        AddIndexConcurrentlyOnPostgreSQL(
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
    ]
