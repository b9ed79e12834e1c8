"""The schema of django-durable's tables in a database, described so that two databases
can be compared: what the migrations build against what the models declare
(``--nomigrations``), a fresh ``migrate`` against another, a database upgraded from
an intermediate migration against a fresh one. No git: everything is built from the
files of this tree, in processes of their own.

``describe(connection)`` reads the catalog through a Django connection and returns
``{"kind name": "definition"}``, one entry per object, independent of the order the
objects were made in (a column added by a later migration sits at the end of its
table; here it is one more entry):

- PostgreSQL (pg_catalog): each column (type, NOT NULL, default, identity), each
  table's storage options, each constraint (``pg_get_constraintdef``), index
  (``pg_get_indexdef``, its predicate included), trigger, domain, and function (its
  arguments, result type, settings and an MD5 of its body).
- SQLite (sqlite_master): each item of a table's CREATE TABLE (a column with its
  type, NULL, default, CHECK and REFERENCES; a named constraint; an unnamed one),
  each index's and trigger's statement.

The builders (``migrated``, ``without_migrations``, ``upgraded``) make a scratch
database next to the test database (PostgreSQL: ``<test database>_<suffix>``, dropped
afterwards; SQLite: a file in the given folder), run ``migrate`` in a subprocess with
settings of their own, and return its description.

For the release that folds the draft migrations into one squashed migration
(``replaces = [...]``): ``upgraded(folder, "0003_flow_control")`` migrates a scratch
database to that draft with the drafts alone (the package's migrations folder copied
without the migrations that replace others, as main had it before the fold), then to
the latest with the package as it is; ``differences(upgraded(...), migrated(...))``
must be empty for every draft (``draft_names()``).
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

from django.db import connection as test_connection

ROOT = Path(__file__).resolve().parent.parent
MIGRATIONS = ROOT / "django_durable" / "migrations"

# The claims that return durable_run's row type (SETOF durable_run): a column added
# to the table while one runs makes it fail. The claim of issue 41 returns explicit
# columns; tests that add a column expect these to fail.
ROW_TYPE_CLAIMS = frozenset(f"durable_claim_v{n}" for n in (1, 2, 3, 4))

# PostgreSQL: the catalog of the objects of django-durable (named durable...), as rows
# (name, definition) per kind.
POSTGRES_CATALOG = {
    "column": """
        SELECT c.relname || '.' || a.attname,
               format_type(a.atttypid, a.atttypmod)
               || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END
               || COALESCE(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '')
               || CASE a.attidentity WHEN 'd' THEN ' IDENTITY BY DEFAULT'
                                     WHEN 'a' THEN ' IDENTITY ALWAYS' ELSE '' END
        FROM pg_attribute AS a
        JOIN pg_class AS c ON c.oid = a.attrelid
        LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relname LIKE 'durable%' AND c.relkind = 'r' AND a.attnum > 0
          AND NOT a.attisdropped AND pg_table_is_visible(c.oid)
    """,
    "table": """
        SELECT relname, COALESCE(array_to_string(reloptions, ', '), '')
        FROM pg_class
        WHERE relname LIKE 'durable%' AND relkind = 'r' AND pg_table_is_visible(oid)
    """,
    "constraint": """
        SELECT CASE WHEN c.contypid <> 0 THEN 'domain ' || t.typname
                    ELSE c.conrelid::regclass::text END || '.' || conname,
               pg_get_constraintdef(c.oid)
        FROM pg_constraint AS c LEFT JOIN pg_type AS t ON t.oid = c.contypid
        WHERE c.conrelid::regclass::text LIKE 'durable%' OR t.typname LIKE 'durable%'
    """,
    "index": """
        SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid)
        FROM pg_index WHERE indrelid::regclass::text LIKE 'durable%'
    """,
    "trigger": """
        SELECT tgrelid::regclass::text || '.' || tgname, pg_get_triggerdef(oid)
        FROM pg_trigger WHERE NOT tgisinternal AND tgrelid::regclass::text LIKE 'durable%'
    """,
    "domain": """
        SELECT typname, format_type(typbasetype, typtypmod)
        FROM pg_type WHERE typtype = 'd' AND typname LIKE 'durable%'
    """,
    "function": """
        SELECT proname || '(' || pg_get_function_identity_arguments(oid) || ')',
               pg_get_function_result(oid)
               || ' ' || COALESCE(array_to_string(proconfig, ' '), '')
               || ' ' || md5(prosrc)
        FROM pg_proc WHERE proname LIKE 'durable%' AND pg_function_is_visible(oid)
    """,
}


def describe(connection) -> dict[str, str]:
    """The schema of django-durable's objects in ``connection``'s database, as
    ``{"kind name": "definition"}`` (the module's docstring says what is read)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            return _describe_postgres(cursor)
        if connection.vendor == "sqlite":
            return _describe_sqlite(cursor)
    raise ValueError(f"no schema description for {connection.vendor}")


def _describe_postgres(cursor) -> dict[str, str]:
    found = {}
    for kind, query in POSTGRES_CATALOG.items():
        cursor.execute(query)
        for name, definition in cursor.fetchall():
            found[f"{kind} {name}"] = definition
    return found


def _describe_sqlite(cursor) -> dict[str, str]:
    cursor.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master "
        "WHERE tbl_name LIKE 'durable%' AND sql IS NOT NULL"
    )
    found = {}
    for kind, name, table, sql in cursor.fetchall():
        sql = " ".join(sql.split())
        if kind != "table":
            found[f"{kind} {name}"] = sql
            continue
        body = sql[sql.index("(") + 1 : sql.rindex(")")]
        for item in _top_level_items(body):
            named = re.match(r'(CONSTRAINT\s+)?"(\w+)"\s+(.*)', item, re.S)
            if named is None:  # an unnamed constraint: the item is its own name
                found[f"table-constraint {table}.{item}"] = item
            elif named.group(1):
                found[f"constraint {table}.{named.group(2)}"] = named.group(3)
            else:
                found[f"column {table}.{named.group(2)}"] = named.group(3)
    return found


def _top_level_items(body: str) -> list[str]:
    """The comma-separated items of a CREATE TABLE's parentheses (commas inside
    parentheses or quotes belong to their item)."""
    items, depth, quote, start = [], 0, None, 0
    for i, char in enumerate(body):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(body[start:i].strip())
            start = i + 1
    items.append(body[start:].strip())
    return items


def differences(a: dict[str, str], b: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """Each object whose definition differs between ``a`` and ``b``: (a's, b's), None
    where the object is missing."""
    return {
        key: (a.get(key), b.get(key))
        for key in sorted(a.keys() | b.keys())
        if a.get(key) != b.get(key)
    }


# --- scratch databases, migrated in processes of their own ---------------------------

SETTINGS = """
SECRET_KEY = "schema"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django_durable"]
DATABASES = {{"default": {database!r}}}
MIGRATION_MODULES = {modules!r}
"""

# In the subprocess: ``migrate`` with the given arguments, then the description.
MIGRATE = """
import json, sys
import django
django.setup()
import django_durable
assert django_durable.__file__.startswith(sys.argv[1]), django_durable.__file__
from django.core.management import call_command
from django.db import connection
from tests.schema import describe
call_command("migrate", *json.loads(sys.argv[2]), verbosity=0)
print(json.dumps(describe(connection)))
"""

_counter = itertools.count()


def vendor() -> str:
    """The vendor of the test database: scratch databases are made on the same one."""
    return test_connection.vendor


@contextlib.contextmanager
def scratch_database(folder: Path) -> Iterator[dict]:
    """Django's settings of a new, empty database on the test database's server (its
    name: the test database's, a suffix; dropped afterwards), or a new SQLite file in
    ``folder``."""
    settings = test_connection.settings_dict
    suffix = f"s{os.getpid()}_{next(_counter)}"
    if test_connection.vendor == "sqlite":
        yield {"ENGINE": "django.db.backends.sqlite3", "NAME": str(folder / f"{suffix}.db")}
        return
    import psycopg  # PostgreSQL only

    name = f"{settings['NAME']}_{suffix}"
    admin = {
        "dbname": "postgres",
        "user": settings["USER"],
        "host": settings["HOST"],
        "port": settings["PORT"] or "5432",
    }
    with psycopg.connect(**admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": settings["USER"],
            "HOST": settings["HOST"],
            "PORT": settings["PORT"],
        }
    finally:
        with psycopg.connect(**admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_migrate(
    database: dict,
    folder: Path,
    *arguments: str,
    modules: dict | None = None,
    environ: dict | None = None,
) -> dict[str, str]:
    """``migrate *arguments`` on ``database`` in a process of its own (with
    ``MIGRATION_MODULES = modules``; ``environ`` added to its environment); the
    description of the schema it leaves."""
    stem = f"schema_settings_{next(_counter)}"
    (folder / f"{stem}.py").write_text(
        textwrap.dedent(SETTINGS.format(database=database, modules=modules or {}))
    )
    env = {
        **os.environ,
        **(environ or {}),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(folder)]),
        "DJANGO_SETTINGS_MODULE": stem,
    }
    done = subprocess.run(
        [sys.executable, "-c", MIGRATE, str(ROOT), json.dumps(arguments)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.splitlines()[-1])


def migrated(folder: Path, *target: str, environ: dict | None = None) -> dict[str, str]:
    """A fresh database migrated by the package's migrations (to ``target``, the app
    label and a migration name, when given)."""
    with scratch_database(folder) as database:
        return run_migrate(database, folder, *target, environ=environ)


def without_migrations(folder: Path) -> dict[str, str]:
    """A fresh database made from the models (``migrate --run-syncdb`` with the
    migrations turned off, as pytest-django's ``--nomigrations`` makes it), with the
    functions apps.py installs after such a ``migrate``."""
    with scratch_database(folder) as database:
        return run_migrate(database, folder, "--run-syncdb", modules={"django_durable": None})


def _replaced() -> list[str]:
    """The migrations a squashed migration replaces (the drafts of a folded release)."""
    names: list[str] = []
    for path in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "replaces":
                names += [name for _app, name in ast.literal_eval(node.value)]
    return names


def drafts(folder: Path) -> str:
    """A copy of the package's migrations (with their sql/) in ``folder`` holding only
    the drafts a squashed migration replaces: the migrations as main had them before a
    fold (the squash and the later releases' migrations, which depend on it, left
    out). Its module name, for ``MIGRATION_MODULES``."""
    package = folder / "durable_drafts"
    if not package.exists():
        shutil.copytree(MIGRATIONS, package, ignore=shutil.ignore_patterns("__pycache__"))
        kept = set(draft_names())
        for path in package.glob("[0-9][0-9][0-9][0-9]_*.py"):
            if path.stem not in kept:
                path.unlink()
    return package.name


def draft_names() -> list[str]:
    """The names of the draft migrations, oldest first: those a squashed migration
    replaces (every migration, before a fold)."""
    replaced = _replaced()
    if replaced:
        return sorted(replaced)
    return sorted(path.stem for path in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))


def draft_functions() -> list[str]:
    """Every function name the drafts ever installed: the last draft drops the draft
    versions (``DROPPED``) and installs the release's (``FUNCTIONS``)."""
    last = MIGRATIONS / f"{draft_names()[-1]}.py"
    names: list[str] = []
    for node in ast.parse(last.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in (
            "DROPPED",
            "FUNCTIONS",
        ):
            names += ast.literal_eval(node.value)
    return names


def functions_left_installed() -> list[str]:
    """The function versions a fresh ``migrate`` leaves installed: each applied
    migration's ``FUNCTIONS`` less a later one's ``DROPPED`` (the drafts a squashed
    migration replaces are not applied). Beside the code's versions (``CURRENT``), the
    previous ones an expand migration keeps for the previous release's processes."""
    files = sorted(MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))
    lists = {}
    for path in files:
        lists[path.stem] = {  # ``replaces`` is the Migration class's, the lists the module's
            node.targets[0].id: ast.literal_eval(node.value)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Assign)
            and getattr(node.targets[0], "id", "") in ("FUNCTIONS", "DROPPED", "replaces")
        }
    drafts = {name for found in lists.values() for _app, name in found.get("replaces", [])}
    installed: list[str] = []
    for name, found in lists.items():
        if name not in drafts:
            installed += found.get("FUNCTIONS", [])
            installed = [v for v in installed if v not in found.get("DROPPED", [])]
    return installed


def _install_stale_functions(database: dict, names: list[str]) -> None:
    """A function under each of ``names`` with a body the release does not have, as a
    database migrated by main's drafts before the fold held them (the drafts have
    stopped creating their own versions since)."""
    import psycopg  # PostgreSQL only

    with psycopg.connect(
        dbname=database["NAME"],
        user=database["USER"],
        host=database["HOST"],
        port=database["PORT"] or "5432",
        autocommit=True,
    ) as conn:
        for name in names:
            conn.execute(f"CREATE FUNCTION {name}() RETURNS integer LANGUAGE sql AS 'SELECT 1'")


def upgraded(folder: Path, start: str) -> dict[str, str]:
    """A fresh database migrated to the draft ``start`` by the drafts alone (on
    PostgreSQL, holding stale functions under every name a draft installed), then to
    the latest by the package as it is (through the drafts, or a squashed migration's
    remaining ones)."""
    module = drafts(folder)
    with scratch_database(folder) as database:
        run_migrate(database, folder, "django_durable", start, modules={"django_durable": module})
        if vendor() == "postgresql":
            _install_stale_functions(database, draft_functions())
        return run_migrate(database, folder)
