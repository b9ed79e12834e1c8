"""A Django project of its own, outside this package's tests, runs its tests with
pytest-django's ``--nomigrations`` (its test database made from the models, not the
migrations): on PostgreSQL django-durable creates its functions after that
``migrate`` too, so a start, a duplicate and a worker's drain work as they do on a
migrated database."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent

WORKFLOWS = """
import django_durable as durable


class Checkout(durable.Workflow):
    @durable.step
    def reserve(self, ctx):
        return "reserved"

    @durable.step
    def charge(self, ctx):
        return "charged"
"""

TESTS = """
import pytest
from django.db import connection

import django_durable as durable
from django_durable.models import Run
from django_durable.testing import drain
from shop.workflows import Checkout


@pytest.mark.django_db
def test_a_keyed_run_starts_is_answered_and_completes():
    run_id = durable.start(Checkout, {"order": 1}, key="order:1")
    assert durable.start(Checkout, {"order": 1}, key="order:1") == run_id
    drain()
    assert Run.objects.get(id=run_id).status == "completed"


@pytest.mark.django_db
def test_the_test_database_was_not_migrated():
    with connection.cursor() as cursor:
        tables = connection.introspection.table_names(cursor)
    assert "durable_run" in tables
    from django.db.migrations.recorder import MigrationRecorder

    applied = MigrationRecorder(connection).applied_migrations()
    assert ("django_durable", "0001_initial") not in applied
"""


def settings_for(vendor: str, tmp: Path) -> str:
    if vendor == "sqlite":
        database = {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp / "shop.sqlite3")}
    else:
        settings = connection.settings_dict
        database = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "postgres",
            "USER": settings["USER"],
            "HOST": settings["HOST"],
            "PORT": settings["PORT"],
            "TEST": {"NAME": f"{settings['NAME']}_nomigrations"},
        }
    return textwrap.dedent(f"""
        SECRET_KEY = "shop"
        USE_TZ = True
        INSTALLED_APPS = ["django.contrib.contenttypes", "django_durable", "shop"]
        DATABASES = {{"default": {database!r}}}
    """)


@pytest.mark.parametrize(
    "vendor", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_a_project_runs_its_tests_with_nomigrations(vendor, tmp_path):
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "workflows.py").write_text(WORKFLOWS)
    (tmp_path / "shop_settings.py").write_text(settings_for(vendor, tmp_path))
    (tmp_path / "test_shop.py").write_text(TESTS)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
        "DJANGO_SETTINGS_MODULE": "shop_settings",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nomigrations",
            "--create-db",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            "test_shop.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "2 passed" in result.stdout, result.stdout[-2000:]
