"""Database functions and expressions that Django does not ship."""

from django.db.models import BooleanField, Func, IntegerField


class OctetLength(Func):
    """Length of a text value in bytes (UTF-8), on PostgreSQL and SQLite."""

    function = "OCTET_LENGTH"
    output_field = IntegerField()

    def as_sqlite(self, compiler, connection, **extra_context):
        return self.as_sql(
            compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))", **extra_context
        )


class AnyOf(Func):
    """True where ``expression`` (a text) is one of ``values``: a condition, as in
    ``CheckConstraint(condition=AnyOf("status", Status.values))``.

    The same test as ``Q(status__in=values)``, written for a CHECK that PostgreSQL
    evaluates at every INSERT and UPDATE. PostgreSQL keeps a CHECK as the text of
    its expression and reads that text again, and simplifies the expression again,
    for each statement that writes the table. ``IN (...)`` is kept as an array
    built from one constant per value, which each statement rebuilds; one array
    constant (``= ANY ('{...}'::text[])``) is read and simplified in about half the
    time. Elsewhere it is ``IN (...)``.
    """

    output_field = BooleanField()

    def __init__(self, expression, values):
        super().__init__(expression)
        self.values = tuple(values)

    def _lhs(self, compiler, connection):
        return compiler.compile(self.get_source_expressions()[0])

    def as_sql(self, compiler, connection, **extra_context):
        lhs, params = self._lhs(compiler, connection)
        placeholders = ", ".join(["%s"] * len(self.values))
        return f"{lhs} IN ({placeholders})", (*params, *self.values)

    def as_postgresql(self, compiler, connection, **extra_context):
        lhs, params = self._lhs(compiler, connection)
        return f"({lhs})::text = ANY (%s::text[])", (*params, text_array(self.values))


def text_array(values) -> str:
    """PostgreSQL's text form of a text array: each element double-quoted, with its
    double quotes and backslashes escaped."""
    quoted = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return "{" + ",".join(quoted) + "}"
