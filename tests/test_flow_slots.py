"""The flow limits as database rules (docs/flow-control.md): each limit's unique
index refuses a second running run in a slot, provoked directly; one claim counts a
key's room once whatever the priority levels and queues its runs are in (issue 41,
item 0); a limit lowered below the running count claims nothing from its scope and
leaves the others alone (item 1). Both databases."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction

import django_durable as durable
from django_durable import store
from django_durable.models import FlowRateSlot, FlowTurn, Run, Status
from django_durable.operations.flow import claim_limits
from django_durable.operations.prune import prune
from django_durable.store.flow import FlowLimit
from tests.testapp.workflows_flow import OnePerTenant, PerTenant, RatedPerTenant, Turns

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = timedelta(minutes=1)

# SQLite reports a unique index by its columns, PostgreSQL by its name.
UNIQUE_COLUMNS = {
    "durable_run_flow_slot": "durable_run.workflow, durable_run.flow_key, durable_run.flow_slot",
    "durable_run_workflow_slot": "durable_run.workflow, durable_run.workflow_slot",
    "durable_run_queue_slot": "durable_run.queue, durable_run.queue_slot",
    "durable_flow_rate_slot_key": "durable_flow_rate_slot.workflow,"
    " durable_flow_rate_slot.flow_key, durable_flow_rate_slot.slot",
}


def refused(name: str):
    match = UNIQUE_COLUMNS[name] if connection.vendor == "sqlite" else name
    return pytest.raises(IntegrityError, match=match)


def claim(limit=10, queues=("flow",), **kwargs):
    kwargs.setdefault("flow_limits", claim_limits())  # the declared ones, as a worker's
    return store.claim(worker_id="w", queues=list(queues), limit=limit, lease=LEASE, **kwargs)


def running(**filters) -> int:
    return Run.objects.filter(status=Status.RUNNING, **filters).count()


def holding(**fields) -> Run:
    """A run that holds a worker, with ``fields``."""
    values = {
        "workflow": "per_tenant",
        "queue": "flow",
        "status": Status.RUNNING,
        "worker_id": "w",
        "lease_expires_at": store.now() + LEASE,
        "flow_key": "tenant:1",
        **fields,
    }
    return Run.objects.create(**values)


# --- each rule refused by the database ---------------------------------------------


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        ("durable_run_flow_slot", {"flow_slot": 0}),
        ("durable_run_workflow_slot", {"workflow_slot": 1}),
        ("durable_run_queue_slot", {"queue_slot": 2}),
    ],
)
def test_each_slot_index_refuses_a_second_running_run_in_a_slot(name, fields):
    holding(**fields)
    # A run that holds no worker (pending, finished, or running without a lease)
    # keeps its slot number without taking the slot.
    holding(status=Status.PENDING, lease_expires_at=None, **fields)
    holding(status=Status.COMPLETED, lease_expires_at=None, **fields)
    holding(lease_expires_at=None, **fields)
    holding(flow_key="tenant:2", queue="other", workflow="other", **fields)  # another scope
    with refused(name), transaction.atomic():
        holding(**fields)
    with refused(name), transaction.atomic():
        holding(status=Status.COMPENSATING, **fields)
    # A pending run with the slot cannot be claimed into it behind the claim's back.
    waiting = holding(status=Status.PENDING, lease_expires_at=None, **fields)
    with refused(name), transaction.atomic():
        Run.objects.filter(id=waiting.id).update(
            status=Status.RUNNING, lease_expires_at=store.now() + LEASE
        )


def test_the_rate_slot_is_one_row_per_key_and_slot():
    at = store.now()
    FlowRateSlot.objects.create(workflow="w", flow_key="k", slot=0, begun_at=at)
    FlowRateSlot.objects.create(workflow="w", flow_key="k", slot=1, begun_at=at)
    with refused("durable_flow_rate_slot_key"), transaction.atomic():
        FlowRateSlot.objects.create(workflow="w", flow_key="k", slot=0, begun_at=at)


def test_a_claim_gives_each_limited_scope_distinct_slots_and_none_where_unlimited():
    for tenant in (1, 2):
        for _ in range(3):
            durable.start(PerTenant, {"tenant": tenant})
    got = claim(limits={"flow": 3})
    assert len(got) == 3
    assert sorted(r.queue_slot for r in got) == [0, 1, 2]
    for key in {r.flow_key for r in got}:
        slots = sorted(r.flow_slot for r in got if r.flow_key == key)
        assert slots == list(range(len(slots)))
    assert {r.workflow_slot for r in got} == {None}
    stored = {r.id: r.queue_slot for r in Run.objects.filter(status=Status.RUNNING)}
    assert stored == {r.id: r.queue_slot for r in got}


# --- item 0: a key's room counted once ----------------------------------------------


@pytest.mark.parametrize("priorities", [(5, 0), (9, 5, 0)])
def test_a_keys_runs_at_several_priority_levels_get_its_room_once(priorities):
    for priority in priorities:
        durable.start(OnePerTenant, {"tenant": 1}, priority=priority)
    got = claim()
    assert len(got) == 1
    assert got[0].priority == max(priorities)
    assert running(flow_key="tenant:1") == 1
    assert claim() == []


def test_a_keys_runs_in_several_queues_get_its_room_once():
    for queue in ("flow", "flow2", "flow3"):
        durable.start(OnePerTenant, {"tenant": 1}, queue=queue)
    assert len(claim(queues=("flow", "flow2", "flow3"))) == 1
    assert running(flow_key="tenant:1") == 1
    assert claim(queues=("flow", "flow2", "flow3")) == []


def test_a_rate_split_over_two_levels_begins_its_limit_once():
    for priority in (5, 0):
        for _ in range(4):
            durable.start(RatedPerTenant, {"tenant": 1}, priority=priority)
    got = claim()
    assert len(got) == 5  # Rate(5, per=2 s)
    assert sum(r.priority == 5 for r in got) == 4
    assert claim() == []


def test_a_concurrency_limit_split_over_levels_and_queues():
    for priority, queue in [(9, "flow"), (5, "flow2"), (0, "flow"), (0, "flow2")]:
        durable.start(PerTenant, {"tenant": 1}, priority=priority, queue=queue)
    got = claim(queues=("flow", "flow2"))
    assert sorted(r.priority for r in got) == [5, 9]  # concurrency_per_key = 2
    assert claim(queues=("flow", "flow2")) == []


# --- item 1: a lowered limit ---------------------------------------------------------


def test_a_queue_limit_lowered_below_its_running_runs_claims_nothing_there():
    for _ in range(6):
        durable.start(PerTenant, {"tenant": 1})  # flow-keyed: the claim's flow path
    for _ in range(3):
        durable.start(Turns, {})
    assert len(claim(queues=("flow",), limits={"flow": 4})) == 2  # per key: 2
    for _ in range(4):
        durable.start(OnePerTenant, {"tenant": 9})
    durable.start(PerTenant, {"tenant": 3})
    # The deploy lowers the limit from 4 to 1 while 2 run: the queue gives nothing,
    # the other queue goes on, and no claim fails.
    got = claim(queues=("flow", "turns"), limits={"flow": 1})
    assert {r.queue for r in got} == {"turns"}
    assert running(queue="flow") == 2
    assert claim(queues=("flow",), limits={"flow": 1}) == []
    # Plain runs (the fast path) too.
    for _ in range(2):
        durable.start(Turns, {}, queue="plain")
    assert len(claim(queues=("plain",), limits={"plain": 2})) == 2
    durable.start(Turns, {})
    assert [r.queue for r in claim(queues=("plain", "turns"), limits={"plain": 1})] == ["turns"]
    assert running(queue="plain") == 2


def test_a_key_limit_lowered_below_its_running_runs_claims_nothing_from_that_key():
    for _ in range(5):
        durable.start(PerTenant, {"tenant": 1})
    durable.start(PerTenant, {"tenant": 2})
    three = {"per_tenant": FlowLimit(3, None, None, None)}
    assert len(claim(flow_limits=three)) == 4  # 3 of tenant:1, 1 of tenant:2
    one = {"per_tenant": FlowLimit(1, None, None, None)}
    assert claim(flow_limits=one) == []
    durable.start(PerTenant, {"tenant": 3})
    [other] = claim(flow_limits=one)
    assert other.flow_key == "tenant:3"
    assert running(flow_key="tenant:1") == 3


def test_a_workflow_limit_lowered_below_its_running_runs_claims_nothing_of_it():
    for tenant in range(4):
        durable.start(PerTenant, {"tenant": tenant})
    durable.start(Turns, {"tenant": "x"})
    assert len(claim(flow_limits={"per_tenant": FlowLimit(None, 3, None, None)})) == 3
    lowered = {"per_tenant": FlowLimit(None, 1, None, None)}
    assert [r.workflow for r in claim(queues=("flow", "turns"), flow_limits=lowered)] == ["turns"]
    assert running(workflow="per_tenant") == 3


def test_pruning_deletes_the_flow_rows_of_idle_keys_only():
    """durable.prune() deletes the rate slots begun, and the turns claimed, longer
    ago than a day (the longest ``per`` of the registered workflows is 2 s); a slot
    or turn of the last day stays."""
    at = store.now()
    for key, age in (("tenant:idle", timedelta(days=2)), ("tenant:busy", timedelta(hours=1))):
        FlowRateSlot.objects.create(
            workflow="rated_per_tenant", flow_key=key, slot=0, begun_at=at - age
        )
        FlowTurn.objects.create(queue="flow", flow_key=key, claimed_at=at - age)
    prune()
    assert list(FlowRateSlot.objects.values_list("flow_key", flat=True)) == ["tenant:busy"]
    assert list(FlowTurn.objects.values_list("flow_key", flat=True)) == ["tenant:busy"]


# --- what the room count protects ------------------------------------------------------


def test_a_claim_of_one_run_takes_the_keys_free_slot_past_the_held_one():
    """The slots a key's running runs hold are left out before any is taken: a claim of
    one run whose key holds slot 0 of 2 takes slot 1 (slot 0 would be dropped by the
    claim's last statement on PostgreSQL, and nothing claimed)."""
    holding(flow_slot=0)  # per_tenant, tenant:1
    durable.start(PerTenant, {"tenant": 1})
    [got] = claim(limit=1)
    assert (got.flow_key, got.flow_slot) == ("tenant:1", 1)


def test_a_run_without_a_slot_counts_in_the_keys_room_beside_a_higher_slot_held():
    """A key of 2 with a run holding slot 1 and one holding no slot is full: slot 0 is
    free, but the key's room (its limit less every run holding a worker) is 0."""
    holding(flow_slot=1)  # per_tenant, tenant:1
    holding()  # claimed before the limit was declared: no slot
    durable.start(PerTenant, {"tenant": 1})
    assert claim() == []
    assert running(flow_key="tenant:1") == 2


def test_a_run_claimed_before_its_limit_was_declared_counts_in_the_keys_room():
    """A run claimed before ``concurrency_per_key`` was declared holds a worker but no
    slot: the slots alone would let a second run of its key begin (slot 0 is free);
    the key's room, counted from the runs holding a worker, gives nothing."""
    holding(workflow="one_per_tenant", flow_key="tenant:1")  # no flow_slot
    durable.start(OnePerTenant, {"tenant": 1})
    durable.start(OnePerTenant, {"tenant": 2})
    assert [r.flow_key for r in claim()] == ["tenant:2"]
    assert running(flow_key="tenant:1") == 1
