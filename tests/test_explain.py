"""PostgreSQL plans: the start path finds a key's holder through the partial unique
index ``durable_run_one_holder_per_key``, and the claim finds due runs through the
partial index ``durable_run_claim``.

The statements explained are the ones a real start and a real claim ran: the
statements in the bodies of durable_start and durable_claim, with the arguments
the calls sent (captured), on a table seeded with enough rows and ANALYZEd so the
planner chooses by cost, as it would in production.
"""

import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_durable as durable
from django_durable import store
from django_durable.models import Run, Status
from django_durable.operations.flow import claim_limits
from django_durable.store.functions import CURRENT
from tests import plans
from tests.plans import explain, explain_function, explain_prepared

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


def test_the_start_path_uses_the_one_holder_per_key_index(seeded):
    durable.start("sync_account", {}, key="account:new")
    values = start_arguments(lambda: durable.start("sync_account", {}, key="account:new"))

    # durable_start's insert meets the taken key; its next statement reads the holder.
    # Without a conflict target every unique index arbitrates: a probe, never a scan;
    # the holder is read through the partial unique index.
    insert = explain_function(plans.START_FUNCTION, plans.START_INSERT, values, generic=False)
    assert "Conflict Resolution: NOTHING" in insert, insert
    plan = explain_function(plans.START_FUNCTION, plans.HOLDER, values, generic=False)
    assert "durable_run_one_holder_per_key" in plan, plan
    assert "Seq Scan" not in plan, plan


def test_the_claim_uses_the_claim_index(seeded):
    due = [durable.start("sync_account", {"n": n}) for n in range(3)]
    # A backlog of due runs in another queue: a worker of every queue must not sort
    # all of them to claim a few, and a worker of "default" must not read them at all.
    Run.objects.bulk_create(
        Run(id=uuid.uuid4(), workflow="sync_account", queue="other", due_at=timezone.now())
        for _ in range(SEEDED)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_run")
    for queues in (None, ["default"], ["default", "other"]):
        plan = claim_plan(queues, generic=False)
        # Per queue served, the oldest due runs through the claim index (a worker of
        # every queue finds the queues through it too); only the few picked are sorted.
        assert "durable_run_claim" in plan, plan
        assert "Seq Scan" not in plan, plan
        Run.objects.filter(id__in=due).update(status=Status.PENDING, due_at=timezone.now())


def sent(fn) -> list[tuple[str, list]]:
    """The statements ``fn`` sent, as the cursor got them, with ``$n`` placeholders
    (each named parameter numbered where it first appears) and their values."""
    seen = []

    def wrapper(execute, sql, params, many, context):
        if isinstance(params, dict):
            names: list[str] = []

            def number(match):
                if match.group(1) not in names:
                    names.append(match.group(1))
                return f"${names.index(match.group(1)) + 1}"

            numbered = re.sub(r"%\((\w+)\)s", number, sql)
            seen.append((numbered.strip(), [params[name] for name in names]))
        else:
            numbered = sql
            for n in range(1, len(params or []) + 1):
                numbered = numbered.replace("%s", f"${n}", 1)
            seen.append((numbered.strip(), list(params or [])))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        fn()
    return seen


def generic_plan_of(fn, starting: str) -> str:
    """The generic plan of the one statement ``fn`` sends that starts with ``starting``."""
    [(sql, params)] = [(sql, params) for sql, params in sent(fn) if sql.startswith(starting)]
    return explain_prepared(sql, params)


def call_arguments(fn, function: str) -> list:
    """The arguments of the one call of the store function ``function`` that ``fn``
    sends."""
    [values] = [params for sql, params in sent(fn) if f"{function}(" in sql]
    return values


def start_arguments(fn) -> list:
    return call_arguments(fn, CURRENT["durable_start"])


def claim_plan(queues, *, generic: bool) -> str:
    """The plan of the statement in durable_claim, for a real claim of ``queues``."""
    values = call_arguments(
        lambda: store.claim(
            worker_id="explain",
            queues=queues,
            limit=10,
            lease=timedelta(minutes=1),
            flow_limits=claim_limits(),
        ),
        CURRENT["durable_claim"],
    )
    return explain_function(plans.CLAIM_FUNCTION, plans.CLAIM_QUERY, values, generic=generic)


def generic_holder_plan(fn) -> str:
    """The generic plan (the one durable_start keeps) of the holder look-up of the
    start ``fn`` sends."""
    values = start_arguments(fn)
    return explain_function(plans.START_FUNCTION, plans.HOLDER, values, generic=True)


def test_prepared_start_and_claim_use_the_indexes_with_a_generic_plan(seeded):
    durable.start("sync_account", {}, key="account:generic")
    plan = generic_holder_plan(lambda: durable.start("sync_account", {}, key="account:generic"))
    assert "durable_run_one_holder_per_key" in plan, plan
    assert "Seq Scan" not in plan, plan

    durable.start("sync_account", {"n": 1})
    for queues in (None, ["default"]):
        plan = claim_plan(queues, generic=True)
        # The claimable statuses are literals in the statement, so even the generic
        # plan (the one durable_claim keeps for its session) can tell that the
        # partial claim index covers them.
        assert "durable_run_claim" in plan, plan
        assert "Seq Scan" not in plan, plan


def test_the_holder_lookup_has_one_index_even_with_stale_statistics():
    """Statistics from a table without holders, then thousands of them: the generic plan
    must still find a holder through the unique index, not by scanning an index of
    every holder (which a prepared statement would then keep doing at every start)."""
    at = timezone.now()
    # Analysed when no run held a key (a worker's backlog of unkeyed runs, say).
    Run.objects.bulk_create(
        Run(id=uuid.uuid4(), workflow="noop", status=Status.COMPLETED, created_at=at)
        for _ in range(SEEDED)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_run")
    Run.objects.bulk_create(
        Run(
            id=uuid.uuid4(),
            workflow="sync_account",
            key=f"account:{n}",
            holds_key=True,
            created_at=at,
            due_at=at,
        )
        for n in range(SEEDED)
    )
    plan = generic_holder_plan(lambda: durable.start("sync_account", {}, key="account:7"))
    # An index that starts with (workflow, key): the unique one, or, while the
    # statistics say holders are rare, the index of every keyed run, which reads
    # only that key's runs.
    [holder_scan] = [line for line in plan.splitlines() if "Index Scan using" in line]
    assert "durable_run_one_holder_per_key" in holder_scan or "durable_run_workflow_key" in (
        holder_scan
    ), plan
    assert "durable_run_held_status" not in plan, plan

    # A hand-off releases the finished holder's key by its primary key, not by
    # scanning an index of holders.
    Run.objects.filter(key="account:7").update(status=Status.COMPLETED, due_at=None)
    plan = generic_plan_of(
        lambda: durable.start("sync_account", {}, key="account:7"), "WITH released AS"
    )
    [release_scan] = [line for line in plan.splitlines() if "Scan using" in line]
    assert "durable_run_pkey" in release_scan, plan


def test_the_sweep_of_waiting_parents_reads_only_them(seeded):
    """The maintenance sweep (every heartbeat of every worker) reads the parents
    waiting for their children through their own index, not the runs waiting for
    anything else: at 5 million runs it read the whole table (0.4 s a sweep)."""
    Run.objects.bulk_create(
        Run(id=uuid.uuid4(), workflow="sync_account", status=Status.WAITING, waiting_for=what)
        for what in ["event:x"] * 3_000 + ["children"] * 5
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_run")
    with CaptureQueriesContext(connection) as queries:
        assert len(store.waiting_parents()) == 5
    [sent] = [q["sql"] for q in queries.captured_queries]
    plan = explain(sent)
    assert "durable_run_waiting_parents" in plan, plan
    assert "Seq Scan" not in plan, plan
