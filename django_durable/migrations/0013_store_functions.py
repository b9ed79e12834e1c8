"""The store's PL/pgSQL functions on PostgreSQL (store/functions.py): a start, the
worker's claim, its next-due look-up and a step's record, planned once per database
session. Nothing on other databases."""

from django.db import migrations

from django_durable.store.functions import installing, uninstall_functions


def uninstall(apps, schema_editor):
    uninstall_functions(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0012_waiting_runs_index"),
    ]

    operations = [
        migrations.RunPython(installing, uninstall),
    ]
