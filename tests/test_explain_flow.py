"""PostgreSQL plans of the claim's flow path (the current durable_claim with
flow-keyed runs due): its walk of a queue's keys in turns and its pick from the keys
it took. The walk reads one entry per key of ``durable_run_flow``, the pick a key's
runs through it too and the runs without a flow key through
``durable_run_claim_no_flow``; never ``durable_run_claim`` (another key's runs sit
behind a backlog there) and never a scan of the table, even when the statistics say
nearly every claimable run has a flow key (the plan that made the claim grow with a
key's backlog)."""

import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_durable import store
from django_durable.models import Run, Status
from django_durable.operations.flow import claim_limits
from tests import plans
from tests.plans import explain_function
from tests.test_explain import call_arguments

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

BACKLOG = 5_000


def backlog(count: int, flow_key: str = "tenant:big", priority: int = 0) -> None:
    at = timezone.now() - timedelta(minutes=5)
    Run.objects.bulk_create(
        Run(
            id=uuid.uuid4(),
            workflow="per_tenant",
            queue="flow",
            status=Status.PENDING,
            flow_key=flow_key,
            priority=priority,
            due_at=at + timedelta(milliseconds=n),
            created_at=at,
        )
        for n in range(count)
    )


def claim_arguments() -> list:
    """The arguments of a real claim of one run of the queue "flow" (which it makes)."""
    return call_arguments(
        lambda: store.claim(
            worker_id="explain",
            queues=["flow"],
            limit=1,
            lease=timedelta(minutes=1),
            flow_limits=claim_limits(),
        ),
        plans.CURRENT["durable_claim"],
    )


def flow_claim_plans() -> tuple[str, str]:
    """The generic plans (the ones the function keeps) of the flow path's walk of the
    queue "flow"'s keys and its pick from both keys and the runs without one, with the
    arguments of a real claim of that queue."""
    values = claim_arguments()
    walk = explain_function(
        plans.CLAIM_FUNCTION, plans.claim_walk_query("flow"), values, generic=True
    )
    chosen = [("flow", "tenant:big", "per_tenant"), ("flow", "tenant:small", "per_tenant"),
              ("flow", None, None)]  # fmt: skip
    claim = explain_function(
        plans.CLAIM_FUNCTION, plans.claim_flow_query(chosen), values, generic=True
    )
    return walk, claim


def test_the_flow_path_reads_by_index_when_nearly_every_run_has_a_flow_key():
    backlog(BACKLOG)
    backlog(10, "tenant:small")
    backlog(500, "tenant:big", priority=5)  # a second priority level, above
    Run.objects.create(
        workflow="per_tenant", queue="flow", status=Status.PENDING, due_at=timezone.now()
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_run")
    walk, claim = flow_claim_plans()
    assert "durable_run_flow" in walk, walk  # the keys in turns
    assert "durable_run_flow" in claim, claim  # a key's runs
    assert "durable_run_claim_no_flow" in claim, claim
    for plan in (walk, claim):
        assert not re.search(r"using durable_run_claim on durable_run\b", plan), plan
        assert not re.search(r"Seq Scan on durable_run\b", plan), plan


def test_a_walk_from_a_key_with_a_big_backlog_reads_a_few_pages_not_its_backlog():
    """The walk starts after the queue's pointer, the key its last claim took: by the
    key alone. (Compared as the row (key, NULL), the index was read through every
    entry of the pointer's key: a claim's cost grew with that key's backlog, 8 ms at
    100,000 runs.)"""
    with connection.cursor() as cursor:  # 20,000 runs of one key, in one statement
        cursor.execute(
            """INSERT INTO durable_run (id, workflow, queue, status, priority, input, context,
                   state, step_index, attempt, fence, due_at, created_at, flow_key, holds_key,
                   recoveries, step_names, inputs)
               SELECT gen_random_uuid(), 'per_tenant', 'flow', 'pending', 0, '{}', '{}', '{}',
                   0, 1, 0, now() - interval '1 hour' + g * interval '1 ms', now(), 'tenant:big',
                   false, 0, '[]', '[]'
               FROM generate_series(1, 20000) AS g"""
        )
    backlog(10, "tenant:small")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_run")
    values = claim_arguments()  # it takes "tenant:big": the queue's pointer is there
    assert Run.objects.get(worker_id="explain").flow_key == "tenant:big"
    walk = explain_function(
        plans.CLAIM_FUNCTION, plans.claim_walk_query("flow"), values, generic=True, analyze=True
    )
    hit, read = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", walk).groups()  # the total
    assert int(hit) + int(read or 0) < 60, walk  # the backlog's index entries fill ~200 pages
