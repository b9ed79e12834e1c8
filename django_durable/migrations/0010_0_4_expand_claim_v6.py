"""0.4, expand: ``durable_claim_v6`` (read from ``sql/`` by file name), the claim this
release's code calls: a limited flow key's runs taken by several claimers at once,
each with slots no other claimer holds (docs/architecture.md).

Expand only: ``durable_claim_v5`` stays installed, since the previous release's
workers call it during a rolling deploy (the two exclude each other per key: v5 tries
the key's advisory lock, v6 tries it shared); a later contract migration drops it.
No table changes. Frozen: it imports nothing from django_durable.
"""

from pathlib import Path

from django.db import migrations

SQL = Path(__file__).resolve().parent / "sql"
# The functions this migration creates (the release rules and doctor read the list).
FUNCTIONS = ["durable_claim_v6"]
FUNCTION = FUNCTIONS[0]


def create_claim_function(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute((SQL / f"{FUNCTION}.sql").read_text(encoding="utf-8"))


def drop_claim_function(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0009_0_4_expand_streams"),
    ]

    operations = [
        migrations.RunPython(create_claim_function, drop_claim_function, elidable=False),
    ]
