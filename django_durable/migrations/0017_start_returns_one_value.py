"""durable_start returns one JSON value instead of a table (a call returning a table
costs more to plan and to read). A function's result type cannot be replaced, so
this drops the function 0016 installed (same arguments) and installs the current
functions. Nothing on other databases."""

from django.db import migrations

from django_durable.store.functions import replacing

# durable_start's arguments since migration 0016 (0016 returned a table).
EARLIER_START = """
DROP FUNCTION IF EXISTS durable_start(
    uuid, varchar, varchar, integer, jsonb, jsonb, varchar, boolean, uuid, uuid,
    timestamptz, timestamptz, timestamptz, jsonb, jsonb, timestamptz,
    boolean, text, text, text
)
"""

install = replacing(EARLIER_START)


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0016_start_looks_for_the_holder_first"),
    ]

    operations = [
        migrations.RunPython(install, migrations.RunPython.noop),
    ]
