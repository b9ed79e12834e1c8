"""Columns whose rules PostgreSQL checks through their type: a domain, not a table CHECK.

PostgreSQL keeps a table's CHECK as the text of its expression, and at every
INSERT and UPDATE it reads that text back and simplifies it again, for every
CHECK of the table, whichever columns the statement writes. A domain's CHECK is
read once per database session, becomes part of the statement's plan (a start's
is planned once per session, in ``durable_start``), and is checked only where a
statement writes a column of that type. ``durable_run`` is written at every start
and at every step, so its per-column rules (a run's and an attempt's status, a
key's length, the counters) are domains on PostgreSQL (migration 0020): a new
key costs the server about 22 µs less (docs/benchmarks.md, "Profiles").

On other databases the same rules stay CHECKs of the table, under the same names,
and Django validates them in Python alike (``Model.validate_constraints``).
"""

from django.db import models

__all__ = [
    "AttemptStatusField",
    "CounterField",
    "DomainCheck",
    "RunKeyField",
    "RunStatusField",
]


class _DomainType:
    """A field whose column type on PostgreSQL is the domain ``domain`` (which carries
    the base type and the rule); elsewhere the field's own type and check."""

    domain: str

    def db_type(self, connection):
        if connection.vendor == "postgresql":
            return self.domain
        return super().db_type(connection)

    def db_check(self, connection):
        if connection.vendor == "postgresql":
            return None  # the domain checks it
        return super().db_check(connection)


class RunStatusField(_DomainType, models.CharField):
    """``durable_run.status``: the domain ``durable_run_status`` (varchar(20), one of
    the run statuses: the ``durable_run_status_valid`` check)."""

    domain = "durable_run_status"


class AttemptStatusField(_DomainType, models.CharField):
    """``durable_step_attempt.status``: the domain ``durable_step_attempt_status``
    (varchar(20), ``durable_step_attempt_status_valid``)."""

    domain = "durable_step_attempt_status"


class RunKeyField(_DomainType, models.CharField):
    """``durable_run.key``: the domain ``durable_run_key`` (varchar(255), 1 to 255
    bytes: ``durable_run_key_length``)."""

    domain = "durable_run_key"


class CounterField(_DomainType, models.PositiveIntegerField):
    """A counter of runs and attempts (step index, attempt, fence, recoveries): the
    domain ``durable_counter`` (an integer, ``durable_counter_not_negative``);
    elsewhere Django's check of a positive integer field."""

    domain = "durable_counter"


class DomainCheck(models.CheckConstraint):
    """A CHECK that a column's domain enforces on PostgreSQL, and the table elsewhere.

    Django validates it in Python as any ``CheckConstraint``; on PostgreSQL the
    table has no such CHECK (the domain's check of the same name refuses the
    value), so there is nothing to create or drop there. A change of the rule
    therefore needs a migration that changes the domain's check as well
    (``ALTER DOMAIN ... DROP CONSTRAINT`` and ``ADD CONSTRAINT``, as 0020 writes
    them): tests/test_constraints.py compares the domains' statuses with the
    model's."""

    def constraint_sql(self, model, schema_editor):
        return self._on_the_table(super().constraint_sql, model, schema_editor)

    def create_sql(self, model, schema_editor):
        return self._on_the_table(super().create_sql, model, schema_editor)

    def remove_sql(self, model, schema_editor):
        return self._on_the_table(super().remove_sql, model, schema_editor)

    @staticmethod
    def _on_the_table(sql, model, schema_editor):
        """``sql`` of the table's CHECK, except on PostgreSQL (None: nothing to run)."""
        if schema_editor.connection.vendor == "postgresql":
            return None
        return sql(model, schema_editor)
