"""Database functions and expressions that Django does not ship.

``OctetLength`` is named by migration 0001 (the CHECK ``durable_run_key_length``):
Django refers to it by its import path in the migration, so it may never move or
be renamed, and the SQL it writes may never change (a test pins it on each
database). It is the one piece of the package a migration refers to.
"""

from django.db.models import Func, IntegerField


class OctetLength(Func):
    """Length of a text value in bytes (UTF-8), on PostgreSQL and SQLite."""

    function = "OCTET_LENGTH"
    output_field = IntegerField()

    def as_sqlite(self, compiler, connection, **extra_context):
        return self.as_sql(
            compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))", **extra_context
        )
