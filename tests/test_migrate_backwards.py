"""Backwards: ``migrate django_durable zero`` unapplies everything and ``migrate``
builds it again; going back to the previous migration (and forward again) works, and
``durable doctor`` on the rolled-back database names the migration that creates what
is missing (docs/production.md, "Rolling back"). On both databases."""

import contextlib
import json
import re
from io import StringIO
from pathlib import Path

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from django_durable import conf, store
from django_durable.models import Run, Schedule
from django_durable.store import schema
from django_durable.store.workers import listen_statement
from tests.worker_processes import wait_until

MIGRATIONS = Path(__file__).resolve().parent.parent / "django_durable" / "migrations"


def doctor() -> list[dict]:
    out = StringIO()
    with contextlib.suppress(CommandError):  # exit status 1: the findings say why
        call_command("durable", "doctor", "--json", stdout=out, stderr=StringIO())
    return json.loads(out.getvalue())


def finding(findings: list[dict], check: str) -> dict:
    (found,) = [f for f in findings if f["check"] == check]
    return found


def migrate(*target: str) -> None:
    call_command("migrate", "django_durable", *target, verbosity=0)
    schema.forget()


def tables() -> set[str]:
    return set(connection.introspection.table_names())


def newest_and_previous() -> tuple[str, str]:
    """The newest migration and the one before it (``zero`` when the newest is the
    first: 0.3.0 has one migration)."""
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    ((_, newest),) = graph.leaf_nodes("django_durable")
    parents = graph.node_map[("django_durable", newest)].parents
    previous = [node.key[1] for node in parents if node.key[0] == "django_durable"]
    return newest, (previous[0] if previous else "zero")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_migrate_zero_then_forward_again():
    try:
        migrate("zero")  # crashed when post_migrate wrote schedules into dropped tables
        assert not {Run._meta.db_table, Schedule._meta.db_table} & tables()
    finally:
        migrate()
    assert {Run._meta.db_table, Schedule._meta.db_table} <= tables()
    # The declared schedules are rows again, as after any forward migrate.
    assert Schedule.objects.filter(declared=True).exists()
    assert not finding(doctor(), "indexes")["problem"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_back_to_the_previous_migration_and_forward_again():
    newest, previous = newest_and_previous()
    try:
        migrate(previous)
        findings = doctor()
        assert f"django_durable.{newest}" in finding(findings, "migrations")["data"]["pending"]
        # What the newest migration creates is missing, and doctor says which creates it.
        for check in ("functions", "indexes"):
            found = finding(findings, check)
            if found["problem"]:
                assert f"{newest} creates" in found["fix"], found
    finally:
        migrate()
    findings = doctor()
    for check in ("migrations", "functions", "indexes"):
        assert not finding(findings, check)["problem"], finding(findings, check)


def creator_of(index: str) -> str:
    """The migration whose file names ``index``, read from the files (but the drafts a
    squashed migration replaces: a fresh database never applies them)."""
    files = {p.stem: p.read_text() for p in MIGRATIONS.glob("0*.py")}
    drafts = {
        name
        for text in files.values()
        for name in re.findall(r'"django_durable", "(\w+)"\)', text)
        if "replaces" in text
    }
    (found,) = [n for n, text in files.items() if n not in drafts and f'name="{index}"' in text]
    return found


@pytest.mark.django_db
def test_doctor_names_the_migration_that_creates_a_missing_index():
    """DDL is transactional on both databases: the test's transaction puts it back."""
    assert not finding(doctor(), "indexes")["problem"]
    with connection.cursor() as cursor:
        cursor.execute("DROP INDEX durable_run_flow_busy")
        cursor.execute("DROP INDEX durable_run_claim")
    found = finding(doctor(), "indexes")
    assert found["problem"]
    assert found["data"]["missing"] == ["durable_run_claim", "durable_run_flow_busy"]
    for index in ("durable_run_flow_busy", "durable_run_claim"):
        assert re.search(rf"{creator_of(index)} creates [^;)]*\b{index}\b", found["fix"]), found


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # pg_stat_activity is read once per transaction
def test_doctor_counts_only_this_databases_listening_sessions():
    """A worker of another database on the same server listens with the same statement:
    doctor does not count it."""
    channel = conf.get("NOTIFY_CHANNEL")
    before = store.listening_sessions(channel)
    settings = connection.settings_dict
    other = psycopg.connect(
        dbname="postgres",
        user=settings["USER"],
        host=settings["HOST"],
        port=settings["PORT"] or 5432,
        autocommit=True,
    )
    try:
        other.execute(listen_statement(connection, channel))

        def seen_elsewhere() -> int:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE query = %s AND datname = 'postgres'",
                    [listen_statement(connection, channel)],
                )
                return cursor.fetchone()[0]

        wait_until(seen_elsewhere, 30, "the other database's LISTEN in pg_stat_activity")
        assert store.listening_sessions(channel) == before
    finally:
        other.close()
