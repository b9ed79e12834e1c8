"""A database migrated by the code before 0.2's single initial migration (0001-0020,
commit 35f21b4) and one migrated by today's 0001 have the same schema, but for the
differences listed here on purpose: the catalog of each is read and compared,
table by table, column by column, constraint, index and function by name.

Nothing was released before 0.2, so no database moves from the old history to the
new one: a development database of that time is recreated (docs/production.md,
"Upgrading"). This test shows what such a database had, against what 0.2 makes."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import psycopg
import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
# The last commit with migrations 0001-0020.
BEFORE = "35f21b4"

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

SETTINGS = """
SECRET_KEY = "schema-history"
USE_TZ = True
INSTALLED_APPS = ["django_durable"]
DATABASES = {{"default": {{
    "ENGINE": "django.db.backends.postgresql", "NAME": {name!r}, "USER": {user!r},
    "HOST": {host!r}, "PORT": {port!r},
}}}}
"""

MIGRATE = (
    "import django; django.setup(); import django_durable, sys; "
    "from django.core.management import call_command; "
    "assert django_durable.__file__.startswith(sys.argv[1]), django_durable.__file__; "
    "call_command('migrate', *sys.argv[2:], verbosity=0)"
)

# The catalog of the django-durable objects, as rows (kind, name, description).
CATALOG = {
    "column": """
        SELECT c.relname || '.' || a.attname,
               format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
               || COALESCE(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
        FROM pg_attribute AS a
        JOIN pg_class AS c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relname LIKE 'durable%%' AND c.relkind = 'r' AND a.attnum > 0
          AND NOT a.attisdropped
    """,
    "table": """
        SELECT relname, COALESCE(array_to_string(reloptions, ', '), '')
        FROM pg_class WHERE relname LIKE 'durable%%' AND relkind = 'r'
    """,
    "constraint": """
        SELECT CASE WHEN c.contypid <> 0 THEN 'domain ' || t.typname
                    ELSE c.conrelid::regclass::text END || '.' || conname,
               pg_get_constraintdef(c.oid)
        FROM pg_constraint AS c LEFT JOIN pg_type AS t ON t.oid = c.contypid
        WHERE c.conrelid::regclass::text LIKE 'durable%%' OR t.typname LIKE 'durable%%'
    """,
    "index": """
        SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid)
        FROM pg_index WHERE indrelid::regclass::text LIKE 'durable%%'
    """,
    "domain": """
        SELECT typname, format_type(typbasetype, typtypmod)
        FROM pg_type WHERE typtype = 'd' AND typname LIKE 'durable%%'
    """,
    "function": """
        SELECT proname || '(' || pg_get_function_identity_arguments(oid) || ')',
               pg_get_function_result(oid) || ' ' || COALESCE(array_to_string(proconfig, ' '), '')
               || ' ' || md5(prosrc)
        FROM pg_proc WHERE proname LIKE 'durable%%'
    """,
}


def catalog(conninfo: dict) -> dict[tuple[str, str], str]:
    with psycopg.connect(**conninfo) as conn:
        found = {}
        for kind, query in CATALOG.items():
            for name, description in conn.execute(query.replace("%%", "%")).fetchall():
                if kind == "index":
                    description = status_sets(description)
                found[(kind, name)] = description
        return found


def status_sets(definition: str) -> str:
    """An index's definition with each array of statuses in its condition written as
    the sorted set of its values. PostgreSQL writes the same ``IN`` list back in two
    ways (``ARRAY[('a'::character varying)::text, ...]`` for an index that 0020
    rebuilt over a domain column, ``(ARRAY['a'::character varying, ...])::text[]``
    for one made over a plain varchar), and a frozenset's order (the finished
    statuses) is the process's hash order."""

    def canonical(match: re.Match) -> str:
        return "{" + ",".join(sorted(re.findall(r"'(\w+)'", match.group(0)))) + "}"

    sets = re.sub(r"ARRAY\[[^\]]*\]", canonical, definition)
    return re.sub(r"\((\{[\w,]*\})\)::text\[\]", r"\1", sets)


def _conninfo(name: str) -> dict:
    settings = connection.settings_dict
    return {
        "dbname": name,
        "user": settings["USER"],
        "host": settings["HOST"],
        "port": settings["PORT"] or "5432",
    }


def migrated(package: Path, name: str, tmp: Path, *target: str) -> dict:
    """A fresh database ``name`` migrated by the django_durable of ``package`` (the
    folder holding it) in a process of its own (to ``target``: the app label and
    migration name, when given); its connection settings."""
    admin = _conninfo("postgres")
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    info = _conninfo(name)
    settings = tmp / f"settings_{name}.py"
    settings.write_text(
        SETTINGS.format(name=name, user=info["user"], host=info["host"], port=info["port"])
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(package), str(tmp)]),
        "DJANGO_SETTINGS_MODULE": settings.stem,
    }
    result = subprocess.run(
        [sys.executable, "-c", MIGRATE, str(package), *target],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return info


def drop(name: str) -> None:
    with psycopg.connect(**_conninfo("postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def old_package(tmp: Path) -> Path:
    """django_durable as it was at BEFORE, from git (no checkout of the work tree)."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", BEFORE, "django_durable"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    folder = tmp / "before"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


# The differences made on purpose, each (kind, name): (before, now); None where the
# object is not there. Everything else is the same, object by object.
RUN_STATUSES = (
    "'pending', 'running', 'waiting', 'compensating', 'completed', 'failed', "
    "'cancelled', 'compensated', 'compensation_failed'"
)
ATTEMPT_STATUSES = "'running', 'completed', 'failed', 'suspended', 'cancelled', 'lost'"


def _in_check(column: str, statuses: str) -> str:
    """A ``status IN (...)`` CHECK as PostgreSQL writes it back."""
    values = ", ".join(f"{s}::character varying" for s in statuses.split(", "))
    return f"CHECK ((({column})::text = ANY ((ARRAY[{values}])::text[])))"


def expected_differences() -> dict:
    differences = {}
    # 0020's domains are gone: each column has its base type, and each rule is a
    # named CHECK of its table again (the counters' by Django's positive integer
    # field names, as before 0020).
    domains = {
        "durable_counter": "integer",
        "durable_run_status": "character varying(20)",
        "durable_step_attempt_status": "character varying(20)",
        "durable_run_key": "character varying(255)",
    }
    for domain, base in domains.items():
        differences[("domain", domain)] = (base, None)
    domain_checks = {
        "durable_counter": ("durable_counter_not_negative", "CHECK ((VALUE >= 0))"),
        "durable_run_status": (
            "durable_run_status_valid",
            "CHECK (((VALUE)::text = ANY ('{"
            + RUN_STATUSES.replace("'", "").replace(" ", "")
            + "}'::text[])))",
        ),
        "durable_step_attempt_status": (
            "durable_step_attempt_status_valid",
            "CHECK (((VALUE)::text = ANY ('{"
            + ATTEMPT_STATUSES.replace("'", "").replace(" ", "")
            + "}'::text[])))",
        ),
        "durable_run_key": (
            "durable_run_key_length",
            "CHECK (((octet_length((VALUE)::text) >= 1) AND (octet_length((VALUE)::text) <= 255)))",
        ),
    }
    for domain, (name, check) in domain_checks.items():
        differences[("constraint", f"domain {domain}.{name}")] = (check, None)
    columns = {
        "durable_run": {
            "status": ("durable_run_status NOT NULL", "character varying(20) NOT NULL"),
            "key": ("durable_run_key", "character varying(255)"),
            "step_index": ("durable_counter NOT NULL", "integer NOT NULL"),
            "attempt": ("durable_counter NOT NULL", "integer NOT NULL"),
            "fence": ("durable_counter NOT NULL", "integer NOT NULL"),
            "recoveries": ("durable_counter NOT NULL DEFAULT 0", "integer NOT NULL DEFAULT 0"),
        },
        "durable_step_attempt": {
            "status": ("durable_step_attempt_status NOT NULL", "character varying(20) NOT NULL"),
            "step_index": ("durable_counter NOT NULL", "integer NOT NULL"),
            "attempt": ("durable_counter NOT NULL", "integer NOT NULL"),
        },
    }
    for table, changed in columns.items():
        for column, change in changed.items():
            differences[("column", f"{table}.{column}")] = change
    checks = {
        "durable_run.durable_run_status_valid": _in_check("status", RUN_STATUSES),
        "durable_run.durable_run_key_length": (
            "CHECK (((key IS NULL) OR ((octet_length((key)::text) >= 1) AND "
            "(octet_length((key)::text) <= 255))))"
        ),
        "durable_step_attempt.durable_step_attempt_status_valid": _in_check(
            "status", ATTEMPT_STATUSES
        ),
    }
    for table, columns_ in (
        ("durable_run", ("step_index", "attempt", "fence", "recoveries")),
        ("durable_step_attempt", ("step_index", "attempt")),
    ):
        for column in columns_:
            checks[f"{table}.{table}_{column}_check"] = f"CHECK (({column} >= 0))"
    for name, check in checks.items():
        differences[("constraint", name)] = (None, check)
    return differences


def differences(before: dict, now: dict) -> dict:
    return {
        key: (before.get(key), now.get(key))
        for key in before.keys() | now.keys()
        if before.get(key) != now.get(key)
    }


@pytest.mark.django_db
def test_the_schema_of_0_2_is_the_one_migrations_0001_to_0020_built(tmp_path):
    base = connection.settings_dict["NAME"]
    old_name, new_name = f"{base}_before", f"{base}_now"
    try:
        before = catalog(migrated(old_package(tmp_path), old_name, tmp_path))
        # 0.2's schema: migration 0001 (later migrations add to it).
        now = catalog(migrated(ROOT, new_name, tmp_path, "django_durable", "0001"))
    finally:
        drop(old_name)
        drop(new_name)
    found = differences(before, now)
    # The functions: each under a versioned name now (durable_start_v1), with its
    # text from migrations/sql/; durable_start_v1 takes the holder states as a
    # text[] (p_answers) instead of a comma-separated text, and reads the holder
    # from one statement in a loop instead of two copies of it. The others' bodies
    # are the same statements.
    functions = {key: value for key, value in found.items() if key[0] == "function"}
    before_functions = sorted(name for (_kind, name), (was, _now) in functions.items() if was)
    now_functions = sorted(name for (_kind, name), (_was, is_) in functions.items() if is_)
    assert [n.split("(")[0] for n in before_functions] == [
        "durable_claim",
        "durable_next_due_at",
        "durable_record_step",
        "durable_start",
    ]
    assert [n.split("(")[0] for n in now_functions] == [
        "durable_claim_v1",
        "durable_next_due_at_v1",
        "durable_record_step_v1",
        "durable_start_v1",
    ]
    for was, is_ in zip(before_functions, now_functions, strict=True):
        arguments_before = was.split("(", 1)[1]
        arguments_now = is_.split("(", 1)[1]
        if was.startswith("durable_start"):
            arguments_before = arguments_before.replace("p_answers text)", "p_answers text[])")
        assert arguments_before == arguments_now, (was, is_)
        result_before = functions[("function", was)][0].rsplit(" ", 1)[0]
        result_now = functions[("function", is_)][1].rsplit(" ", 1)[0]
        assert result_before == result_now, (was, result_before, result_now)
    rest = {key: value for key, value in found.items() if key[0] != "function"}
    assert rest == expected_differences()
