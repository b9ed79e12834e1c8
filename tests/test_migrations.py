"""The migrations are the schema's history, frozen: none runs the package's code
(tests/test_architecture.py checks what they import), and the text of every
database function lives in the migration that creates it (a file of
migrations/sql/ it reads by name), under a versioned name that the code calls.
A released function's body cannot change without a new version in a new
migration (migrations/RELEASED.json pins the files at their release's tag:
tests/test_release_rules.py)."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from django_durable.store import functions
from django_durable.store.engines import postgres
from tests import schema

MIGRATIONS = Path(functions.__file__).resolve().parent.parent / "migrations"


def migration_files() -> list[Path]:
    return sorted(MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))


def created_versions() -> dict[str, list[str]]:
    """Each function's versions, in the order the migrations create them: the
    ``<name>_v<N>`` files each migration's ``FUNCTIONS`` list names."""
    versions: dict[str, list[str]] = {}
    for path in migration_files():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "FUNCTIONS":
                for versioned in ast.literal_eval(node.value):
                    name = versioned.rsplit("_v", 1)[0]
                    if versioned not in versions.setdefault(name, []):
                        versions[name].append(versioned)
    return versions


def test_the_code_calls_the_newest_version_a_migration_creates():
    versions = created_versions()
    assert set(versions) == set(functions.CURRENT)
    for name, versioned in functions.CURRENT.items():
        newest = max(versions[name], key=lambda v: int(v.rsplit("_v", 1)[1]))
        assert versioned == newest, name
    calls = {
        "durable_start": postgres.START,
        "durable_claim": postgres.CLAIM,
        "durable_next_due_at": postgres.NEXT_DUE_AT,
        "durable_record_step": postgres.RECORD_STEP,
    }
    for name, call in calls.items():
        called = set(re.findall(r"\b(durable_\w+)\(", call))
        assert called == {functions.CURRENT[name]}, (name, called)


def test_every_function_file_is_created_by_a_migration_and_defines_its_name():
    named = {v for versions in created_versions().values() for v in versions}
    files = {path.stem for path in (MIGRATIONS / "sql").glob("*.sql")}
    assert files == named
    for name in files:
        text = functions.definition(name)
        assert re.findall(r"CREATE OR REPLACE FUNCTION (\w+)\(", text) == [name]


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_database_holds_the_text_of_the_functions_the_code_calls():
    """What ``migrate`` installed is what the files say, byte for byte (the body
    PostgreSQL keeps), under the names the code calls; and nothing else of ours."""
    assert functions.outdated_functions() == {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT proname, prosrc, pg_get_functiondef(oid) FROM pg_proc "
            "WHERE proname LIKE 'durable%%' AND pg_function_is_visible(oid)"
        )
        installed = {name: (source, full) for name, source, full in cursor.fetchall()}
    # The code's versions, and the previous ones an expand migration left installed
    # for the previous release's processes (until a contract migration drops them).
    left = set(schema.functions_left_installed())
    assert set(installed) == set(functions.CURRENT.values()) | left
    for name, (source, full) in installed.items():
        text = functions.definition(name)
        assert source == functions.body(text)
        signature = re.search(r"FUNCTION \w+\((.*?)\)\s*RETURNS", text, re.S).group(1)
        for argument in signature.split(","):
            assert argument.split()[0] in full, (name, argument)


@pytest.mark.postgres
@pytest.mark.django_db
@pytest.mark.parametrize("reuse", ["after_close", "after_failure", "never"])
@pytest.mark.parametrize("policy", ["use_existing", "error"])
def test_durable_start_answers_from_the_key_rules_table(reuse, policy):
    """The start function (durable_start, the version the store calls) notes a
    duplicate (and only answers) in exactly the holder states ``keys.holder_answers``
    computes from the rules table, cell by cell: the database reads the one table,
    passed as its text[] p_answers."""
    import uuid

    from django.utils import timezone

    from django_durable import store
    from django_durable.models import Activity, Run, Status
    from django_durable.operations import keys
    from django_durable.store.starts import DuplicateNote
    from tests.factories import RunFactory

    answers = keys.holder_answers(reuse=reuse, on_duplicate=policy)
    assert answers  # the policies whose duplicates only answer
    for status in Status.values:
        for picked_up in (False, True):
            key = f"{status}:{picked_up}"
            at = timezone.now()
            holder = RunFactory(key=key, status=status, started_at=at if picked_up else None)
            run = store.NewRun(
                id=uuid.uuid4(),
                workflow=holder.workflow,
                queue="default",
                priority=0,
                input={},
                created_at=at,
                key=key,
                holds_key=True,
            )
            found = store.insert_or_get_holder(
                run, note=DuplicateNote(outcome=policy, holder_states=answers)
            )
            assert not found.inserted and found.holder_id == holder.id
            assert found.noted == ((status, picked_up) in answers), (status, picked_up)
            noted = Activity.objects.filter(kind="key_duplicate", key=key).exists()
            assert noted == found.noted
            assert Run.objects.filter(key=key).count() == 1


# A project on SQLite installs django-durable without the [postgres] extra: no psycopg.
# The migrations must import and apply there (one that imports django.contrib.postgres
# at its top would fail: that package needs psycopg).
WITHOUT_PSYCOPG = """
import sys


class NoPsycopg:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("psycopg", "psycopg2"):
            raise ImportError(f"{name} is not installed here")


sys.meta_path.insert(0, NoPsycopg())
import django
from django.conf import settings

settings.configure(
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_durable"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}},
    USE_TZ=True,
)
django.setup()
from django.core.management import call_command
from django.db import connection

call_command("migrate", verbosity=0)
with connection.cursor() as cursor:
    cursor.execute("SELECT name FROM django_migrations WHERE app = 'django_durable'")
    print(",".join(sorted(name for (name,) in cursor.fetchall())))
print("psycopg" in sys.modules)
"""


def test_a_project_on_sqlite_migrates_without_psycopg(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PSYCOPG, str(tmp_path / "db.sqlite3")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    applied, imported = done.stdout.split()
    assert applied.split(",") == sorted(path.stem for path in migration_files())
    assert imported == "False"
