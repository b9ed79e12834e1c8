"""durable_start reads a key's holder with a plain look-up, and writes a duplicate's
activity row only when it has one to write: a new key no longer pays the setup of an
insert into durable_activity. Same arguments and result: the current functions are
installed again. Nothing on other databases."""

from django.db import migrations

from django_durable.store.functions import installing


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0017_start_returns_one_value"),
    ]

    operations = [
        migrations.RunPython(installing, migrations.RunPython.noop),
    ]
