"""Database functions that Django does not ship."""

from django.db.models import Func, IntegerField


class OctetLength(Func):
    """Length of a text value in bytes (UTF-8), on PostgreSQL and SQLite."""

    function = "OCTET_LENGTH"
    output_field = IntegerField()

    def as_sqlite(self, compiler, connection, **extra_context):
        return self.as_sql(
            compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))", **extra_context
        )
