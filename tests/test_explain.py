"""PostgreSQL plans: the start path finds a key's holder through the partial unique
index ``durable_run_one_holder_per_key``, and the claim finds due runs through the
partial index ``durable_run_claim``.

The statements explained are the ones a real start and a real claim sent
(captured), on a table seeded with enough rows and ANALYZEd so the planner
chooses by cost, as it would in production.
"""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_durable as durable
from django_durable import store
from django_durable.models import Run, Status

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

SEEDED = 5_000


@pytest.fixture
def seeded():
    """Many finished runs (most holding a key, as under reuse='never'), a few due."""
    at = timezone.now() - timedelta(days=1)
    Run.objects.bulk_create(
        Run(
            id=uuid.uuid4(),
            workflow="sync_account" if n % 2 else "process_article",
            status=Status.COMPLETED,
            key=f"account:{n}",
            holds_key=n % 3 != 0,
            created_at=at,
            started_at=at,
            finished_at=at,
        )
        for n in range(SEEDED)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_run")


def captured(fn) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        fn()
    return [q["sql"] for q in queries.captured_queries]


def explain(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}")
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_start_path_uses_the_one_holder_per_key_index(seeded):
    durable.start("sync_account", {}, key="account:new")
    statements = captured(lambda: durable.start("sync_account", {}, key="account:new"))

    # One statement inserts or, when the key is taken, reads the holder.
    [start] = [s for s in statements if s.startswith('WITH new AS (INSERT INTO "durable_run"')]
    plan = explain(start)
    # Without a conflict target every unique index arbitrates: a probe, never a scan;
    # the holder is read through the partial unique index.
    assert "Conflict Resolution: NOTHING" in plan, plan
    assert "durable_run_one_holder_per_key" in plan, plan
    assert "Seq Scan" not in plan, plan


def test_the_claim_uses_the_claim_index(seeded):
    due = [durable.start("sync_account", {"n": n}) for n in range(3)]
    for queues in (None, ["default"]):
        statements = captured(
            lambda queues=queues: store.claim(
                worker_id="explain", queues=queues, limit=10, lease=timedelta(minutes=1)
            )
        )
        [claim] = [s for s in statements if s.startswith('UPDATE "durable_run"')]
        plan = explain(claim)
        assert "durable_run_claim" in plan, plan
        assert "Seq Scan" not in plan, plan
        Run.objects.filter(id__in=due).update(status=Status.PENDING, due_at=timezone.now())
