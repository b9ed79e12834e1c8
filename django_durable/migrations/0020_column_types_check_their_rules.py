"""On PostgreSQL the rules of a single column of runs and step attempts (a status,
a key's length, the counters) are checked by the column's type, a domain, instead
of a CHECK of the table (``db_types``).

PostgreSQL reads every CHECK of a table back from its text and simplifies it again
at each INSERT and UPDATE; a domain's check is read once per session and is part
of the statement's plan. A new key costs the server about 22 µs less
(docs/benchmarks.md, "Profiles").

Each table changes in one ALTER TABLE: its single-column CHECKs dropped and its
columns given their domains, which at that moment have no check, so PostgreSQL
does not rewrite the table; it does rebuild the indexes that read the status or
the key, holding the table's lock (``migrate`` took about 4 s with a million
runs on the machine of docs/benchmarks.md). The domains' checks are added last,
each validated over the rows already there. On SQLite nothing changes in the
database: only Django's record of the fields and of the constraints
(``DomainCheck``, a CHECK of the table there as before).
"""

import importlib

from django.db import migrations
from django.db.models import Q
from django.db.models.lookups import GreaterThanOrEqual, LessThanOrEqual

import django_durable.db_types
from django_durable.db_functions import AnyOf, OctetLength, text_array

# The statuses as 0019 wrote them into the CHECKs (unchanged since).
_0019 = importlib.import_module("django_durable.migrations.0019_checks_read_one_array_constant")
RUN_STATUSES = _0019.RUN_STATUSES
ATTEMPT_STATUSES = _0019.ATTEMPT_STATUSES

# (domain, its base type, its check's name, the check)
DOMAINS = [
    ("durable_counter", "integer", "durable_counter_not_negative", "VALUE >= 0"),
    (
        "durable_run_status",
        "varchar(20)",
        "durable_run_status_valid",
        f"(VALUE)::text = ANY ('{text_array(RUN_STATUSES)}'::text[])",
    ),
    (
        "durable_step_attempt_status",
        "varchar(20)",
        "durable_step_attempt_status_valid",
        f"(VALUE)::text = ANY ('{text_array(ATTEMPT_STATUSES)}'::text[])",
    ),
    (
        "durable_run_key",
        "varchar(255)",
        "durable_run_key_length",
        "octet_length(VALUE) >= 1 AND octet_length(VALUE) <= 255",
    ),
]

# (table, {column: domain}, the CHECKs 0019 leaves that 0020 takes off the table,
# as 0019 leaves them: name and definition)
TABLES = [
    (
        "durable_run",
        {
            "step_index": "durable_counter",
            "attempt": "durable_counter",
            "fence": "durable_counter",
            "recoveries": "durable_counter",
            "status": "durable_run_status",
            "key": "durable_run_key",
        },
        [
            ("durable_run_step_index_check", "step_index >= 0"),
            ("durable_run_attempt_check", "attempt >= 0"),
            ("durable_run_fence_check", "fence >= 0"),
            ("durable_run_recoveries_check", "recoveries >= 0"),
            (
                "durable_run_status_valid",
                f"(status)::text = ANY ('{text_array(RUN_STATUSES)}'::text[])",
            ),
            (
                "durable_run_key_length",
                '"key" IS NULL OR (octet_length("key") >= 1 AND octet_length("key") <= 255)',
            ),
        ],
    ),
    (
        "durable_step_attempt",
        {
            "step_index": "durable_counter",
            "attempt": "durable_counter",
            "status": "durable_step_attempt_status",
        },
        [
            ("durable_step_attempt_step_index_check", "step_index >= 0"),
            ("durable_step_attempt_attempt_check", "attempt >= 0"),
            (
                "durable_step_attempt_status_valid",
                f"(status)::text = ANY ('{text_array(ATTEMPT_STATUSES)}'::text[])",
            ),
        ],
    ),
]

# The CHECKs of one column of ``table`` among ``columns``, whatever their names:
# the ones Django named (the named constraints) and the ones PostgreSQL named (a
# positive integer field's). A CHECK of two columns (durable_run_holder_has_key)
# stays.
SINGLE_COLUMN_CHECKS = """
SELECT c.conname
FROM pg_constraint AS c
JOIN pg_attribute AS a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
WHERE c.conrelid = %s::regclass AND c.contype = 'c' AND cardinality(c.conkey) = 1
  AND a.attname = ANY (%s)
ORDER BY c.conname
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    for domain, base, _name, _check in DOMAINS:
        schema_editor.execute(f"CREATE DOMAIN {domain} AS {base}")
    for table, columns, _checks in TABLES:
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(SINGLE_COLUMN_CHECKS, [table, list(columns)])
            names = [name for (name,) in cursor.fetchall()]
        changes = [f"DROP CONSTRAINT {quote(name)}" for name in names] + [
            f"ALTER COLUMN {quote(column)} TYPE {domain}" for column, domain in columns.items()
        ]
        schema_editor.execute(f"ALTER TABLE {table} " + ", ".join(changes))
    for domain, _base, name, check in DOMAINS:
        schema_editor.execute(f"ALTER DOMAIN {domain} ADD CONSTRAINT {name} CHECK ({check})")


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.quote_name
    bases = {domain: base for domain, base, _name, _check in DOMAINS}
    for table, columns, checks in TABLES:
        changes = [
            f"ALTER COLUMN {quote(column)} TYPE {bases[domain]}"
            for column, domain in columns.items()
        ] + [f"ADD CONSTRAINT {name} CHECK ({check})" for name, check in checks]
        schema_editor.execute(f"ALTER TABLE {table} " + ", ".join(changes))
    for domain, _base, _name, _check in DOMAINS:
        schema_editor.execute(f"DROP DOMAIN {domain}")


def _choices(statuses):
    """A status field's choices as Django records them (TextChoices' labels)."""
    return [(status, status.replace("_", " ").title()) for status in statuses]


def _constraint_changes():
    """Django's record of the three named CHECKs: a DomainCheck each, the same test
    under the same name."""
    check = django_durable.db_types.DomainCheck
    key_length = Q(key__isnull=True) | Q(
        GreaterThanOrEqual(OctetLength("key"), 1), LessThanOrEqual(OctetLength("key"), 255)
    )
    checks = [
        ("run", check(condition=AnyOf("status", RUN_STATUSES), name="durable_run_status_valid")),
        ("run", check(condition=key_length, name="durable_run_key_length")),
        (
            "stepattempt",
            check(
                condition=AnyOf("status", ATTEMPT_STATUSES),
                name="durable_step_attempt_status_valid",
            ),
        ),
    ]
    changes = []
    for model, constraint in checks:
        changes += [
            migrations.RemoveConstraint(model_name=model, name=constraint.name),
            migrations.AddConstraint(model_name=model, constraint=constraint),
        ]
    return changes


def _fields():
    """Django's record of the fields: each takes its domain on PostgreSQL."""
    types = django_durable.db_types
    run_status = types.RunStatusField(
        choices=_choices(RUN_STATUSES), default="pending", max_length=20
    )
    attempt_status = types.AttemptStatusField(
        choices=_choices(ATTEMPT_STATUSES), default="running", max_length=20
    )
    fields = [
        ("run", "attempt", types.CounterField(default=1)),
        ("run", "fence", types.CounterField(default=0)),
        ("run", "key", types.RunKeyField(blank=True, max_length=255, null=True)),
        ("run", "recoveries", types.CounterField(db_default=0, default=0)),
        ("run", "status", run_status),
        ("run", "step_index", types.CounterField(default=0)),
        ("stepattempt", "attempt", types.CounterField()),
        ("stepattempt", "status", attempt_status),
        ("stepattempt", "step_index", types.CounterField()),
    ]
    return [
        migrations.AlterField(model_name=model, name=name, field=field)
        for model, name, field in fields
    ]


class Migration(migrations.Migration):
    dependencies = [
        ("django_durable", "0019_checks_read_one_array_constant"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(forwards, backwards)],
            state_operations=[*_fields(), *_constraint_changes()],
        ),
    ]
