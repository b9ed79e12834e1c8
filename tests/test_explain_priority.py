"""PostgreSQL plans of the claim with priorities and limits: on a large table of due
runs in several priorities, the claim reads durable_run_claim (queue, priority DESC,
due_at) in its order (no sort of the queue's due runs), the next due time is found
priority by priority through the same index, and a limited queue's running runs
are counted through durable_run_lease."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_durable import store
from django_durable.models import Run, Status
from django_durable.operations.flow import claim_limits
from django_durable.store.functions import CURRENT
from tests import plans
from tests.plans import FUNCTION_QUERIES, explain, explain_function
from tests.test_explain import call_arguments

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

SEEDED = 8_000


@pytest.fixture
def backlog():
    at = timezone.now() - timedelta(minutes=5)
    Run.objects.bulk_create(
        Run(
            id=uuid.uuid4(),
            workflow="noop",
            queue="default" if n % 4 else "limited",
            priority=n % 5,
            due_at=at + timedelta(milliseconds=n),
            created_at=at,
        )
        for n in range(SEEDED)
    )
    Run.objects.bulk_create(
        Run(id=uuid.uuid4(), workflow="noop", status=Status.COMPLETED, created_at=at)
        for _ in range(SEEDED)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_run")


def plans_of(fn) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        fn()
    return [
        explain(query["sql"])
        for query in queries.captured_queries
        if not query["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]


def claim(queues, limits=None):
    return store.claim(
        worker_id="explain",
        queues=queues,
        limit=10,
        lease=timedelta(minutes=1),
        limits=limits,
        flow_limits=claim_limits(),
    )


def claim_values(queues, limits=None) -> list:
    return call_arguments(lambda: claim(queues, limits), CURRENT["durable_claim"])


@pytest.mark.parametrize("queues", [None, ["default"], ["default", "limited"]])
def test_the_claim_reads_the_claim_index_in_priority_order(backlog, queues):
    values = claim_values(queues)
    plan = explain_function(plans.CLAIM_FUNCTION, plans.CLAIM_QUERY, values, generic=True)
    assert "Index Scan using durable_run_claim" in plan, plan
    assert "Seq Scan on durable_run" not in plan, plan
    # Only the few picked runs are sorted (across queues: "p.priority"), never a
    # queue's backlog: the per-queue scans come out of the index in claim order.
    sorts = [line.strip() for line in plan.splitlines() if "Sort Key" in line]
    assert all(s in ("Sort Key: queue", "Sort Key: p.priority DESC, p.due_at") for s in sorts), plan
    claimed = claim(queues)
    assert [r.priority for r in claimed] == sorted((r.priority for r in claimed), reverse=True)
    assert claimed[0].priority == 4


def test_a_limited_claim_counts_running_runs_through_the_lease_index(backlog):
    values = claim_values(["limited"], {"limited": 3})
    room = explain_function(plans.CLAIM_FUNCTION, plans.CLAIM_ROOM_QUERY, values, generic=True)
    assert "durable_run_lease" in room, room
    assert "Seq Scan on durable_run" not in room, room
    claimed = Run.objects.filter(status=Status.RUNNING)
    assert [r.queue_slot for r in claimed.order_by("queue_slot")] == [0, 1, 2]
    assert len(claim(["limited"], {"limited": 3})) == 0  # the first claim took the room
    # The slots of the last statement: each probe one entry of durable_run_queue_slot.
    ids = [r.id for r in Run.objects.filter(queue="limited", status=Status.PENDING)[:3]]
    slots = explain_function(
        plans.CLAIM_FUNCTION, plans.claim_slots_query(ids), values, generic=True
    )
    assert "durable_run_queue_slot" in slots, slots
    assert "Seq Scan on durable_run" not in slots, slots


def test_the_next_due_time_is_found_priority_by_priority(backlog):
    [plan] = plans_of(lambda: store.next_due_at(None))
    assert "durable_run_claim" in plan, plan
    assert "Seq Scan on durable_run" not in plan, plan
    assert (
        store.next_due_at(None)
        == Run.objects.filter(status=Status.PENDING).order_by("due_at")[0].due_at
    )


@pytest.mark.parametrize("name", [CURRENT["durable_claim"], CURRENT["durable_next_due_at"]])
def test_the_claim_and_the_next_due_time_are_never_compiled_by_jit(backlog, name):
    """Their generic plans do not know how many runs are wanted, so they estimate a
    backlog's worth: a cost above jit_above_cost. Each function turns JIT off for
    itself; compiling at every call cost hundreds of milliseconds a claim."""
    if name == CURRENT["durable_claim"]:
        values = [None, 10, [], [], None, [], "explain", timedelta(minutes=1), [], [], [], [], []]
    else:
        values = [None, 1, [], []]
    create, query = FUNCTION_QUERIES[name]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit_above_cost = 0")  # every plan would be compiled
        cursor.execute("SELECT pg_jit_available()")
        (jit_available,) = cursor.fetchone()
    assert "JIT" not in explain_function(create, query, values, generic=True)
    if jit_available:  # without the function's own setting, the plan would be compiled
        without = create.replace("SET jit = off\n", "")
        assert "JIT" in explain_function(without, query, values, generic=True)
