"""durable_start looks for the key's holder before it tries the insert (a duplicate
is answered without an INSERT), and takes the holder states that answer a duplicate
as one comma-separated text instead of an array. Drops the signature 0014 installed
and installs the current functions. Nothing on other databases."""

from django.db import migrations

from django_durable.store.functions import replacing

# durable_start's arguments as migration 0014 installed them.
EARLIER_START = """
DROP FUNCTION IF EXISTS durable_start(
    uuid, varchar, varchar, integer, jsonb, jsonb, varchar, boolean, uuid, uuid,
    timestamptz, timestamptz, timestamptz, jsonb, jsonb, timestamptz,
    boolean, text, text, text[]
)
"""

install = replacing(EARLIER_START)


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0015_waiting_parents_index"),
    ]

    operations = [
        migrations.RunPython(install, migrations.RunPython.noop),
    ]
