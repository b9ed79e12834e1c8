"""durable_start takes only the columns a start sets (store.starts.START_COLUMNS):
the others begin as a new run's defaults, written as constants by the function, and
the duplicate's input is the run's. Drops the function's earlier signature (from a
database migrated to 0013 by an earlier build) and installs the current functions.
Nothing on other databases."""

from django.db import migrations

from django_durable.store.functions import replacing

# durable_start's arguments as migration 0013 first installed them.
EARLIER_START = """
DROP FUNCTION IF EXISTS durable_start(
    uuid, varchar, varchar, varchar, integer, jsonb, jsonb, jsonb, jsonb, varchar,
    boolean, uuid, uuid, integer, integer, timestamptz, timestamptz, timestamptz,
    varchar, jsonb, varchar, timestamptz, integer, integer, jsonb, jsonb, timestamptz,
    timestamptz, timestamptz, boolean, text, text, jsonb, text[]
)
"""

install = replacing(EARLIER_START)


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0013_store_functions"),
    ]

    operations = [
        migrations.RunPython(install, migrations.RunPython.noop),
    ]
