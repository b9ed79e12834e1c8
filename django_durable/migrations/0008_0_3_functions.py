"""Draft, never released: the last of the drafts ``0001_0_3_initial`` replaces. A
database migrated from ``main`` before the 0.3.0 tag holds the draft versions of the
store's functions (four claims, two starts, two step records...): this drops them all
and installs the release's functions, one version of each, as ``0001_0_3_initial``
does on a fresh database. 0.4.0 deletes the drafts.

Frozen like every migration: it imports nothing from django_durable, and the
functions' text is read from ``sql/`` by file name.
"""

from pathlib import Path

from django.db import migrations

SQL = Path(__file__).resolve().parent / "sql"
# The release's functions, in the order they are created (the claim calls the two
# small SQL functions before it).
FUNCTIONS = [
    "durable_claimable_v1",
    "durable_holds_worker_v1",
    "durable_start_v2",
    "durable_next_due_at_v1",
    "durable_record_step_v2",
    "durable_claim_v5",
]
# The drafts' versions that the release does not have.
DROPPED = [
    "durable_start_v1",
    "durable_claim_v1",
    "durable_claim_v2",
    "durable_claim_v3",
    "durable_claim_v4",
    "durable_key_running_v1",
    "durable_record_step_v1",
]


def install_release_functions(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        # The release's names too: a draft may have installed one with another body
        # or result type, which CREATE OR REPLACE cannot change.
        for name in [*DROPPED, *reversed(FUNCTIONS)]:
            cursor.execute(f"DROP FUNCTION IF EXISTS {name}")
        for name in FUNCTIONS:
            cursor.execute((SQL / f"{name}.sql").read_text(encoding="utf-8"))


def drop_release_functions(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in reversed(FUNCTIONS):
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0007_flow_slots"),
    ]

    operations = [
        migrations.RunPython(install_release_functions, drop_release_functions, elidable=False),
    ]
