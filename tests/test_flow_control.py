"""Flow control by key, in this process (API.md §9): the flow key a start stores,
bad flow keys and declarations refused before anything is written, and the claim's
limits and turns, claim by claim, on both databases. The real worker processes are
in test_flow_processes.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured

import django_durable as durable
from django_durable import Workflow, step, store
from django_durable.models import FlowRateSlot, Run, Status
from django_durable.operations.flow import claim_limits
from django_durable.testing import drain
from tests.testapp.workflows_flow import (
    FewAtOnce,
    OnePerTenant,
    PerTenant,
    RatedPerTenant,
    Turns,
)

pytestmark = pytest.mark.django_db

LEASE = timedelta(minutes=1)


def claim(limit=10, queues=("flow",), worker="w"):
    return store.claim(
        worker_id=worker, queues=list(queues), limit=limit, lease=LEASE, flow_limits=claim_limits()
    )


def finish(runs):
    Run.objects.filter(id__in=[r.id for r in runs]).update(
        status=Status.COMPLETED, worker_id=None, lease_expires_at=None
    )


# --- the flow key a start stores -------------------------------------------------------


def test_the_flow_key_comes_from_the_workflow_or_the_start():
    computed = durable.start(PerTenant, {"tenant": 7})
    given = durable.start(PerTenant, {"tenant": 7}, flow_key="tenant:other")
    none = durable.start(PerTenant, {})  # the function says None: no flow key
    assert Run.objects.get(id=computed).flow_key == "tenant:7"
    assert Run.objects.get(id=given).flow_key == "tenant:other"
    assert Run.objects.get(id=none).flow_key is None
    detailed = durable.start_detailed("per_tenant", {"tenant": 1}, key="k:1", flow_key="x")
    assert Run.objects.get(id=detailed.run_id).flow_key == "x"


def test_start_many_takes_pairs_and_triples_mixed():
    results = durable.start_many(
        PerTenant, [({"tenant": 1}, None), ({"tenant": 2}, "k:2", "given"), ({}, None, None)]
    )
    keys = [Run.objects.get(id=r.run_id).flow_key for r in results]
    assert keys == ["tenant:1", "given", None]


@pytest.mark.parametrize(
    ("flow_key", "error"),
    [("", ValueError), ("é" * 128, ValueError), (7, TypeError), (b"tenant", TypeError)],
)
def test_a_bad_flow_key_raises_before_anything_is_written(flow_key, error):
    with pytest.raises(error):
        durable.start(PerTenant, {"tenant": 1}, flow_key=flow_key)
    with pytest.raises(error):
        durable.start_many(PerTenant, [({"tenant": 1}, None), ({}, None, flow_key)])
    assert not Run.objects.exists()


def test_a_flow_key_function_that_raises_or_returns_a_non_str_refuses_the_start():
    class Raises(Workflow):
        flow_key = staticmethod(lambda input: input["missing"])

        @step
        def one(self, ctx): ...

    class ReturnsInt(Workflow):
        flow_key = staticmethod(lambda input: 42)

        @step
        def one(self, ctx): ...

    with pytest.raises(ValueError, match="flow_key raised KeyError"):
        durable.start(Raises, {})
    with pytest.raises(TypeError, match="must be a str"):
        durable.start(ReturnsInt, {})
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"concurrency_per_key": 2}, "needs a flow_key"),
        ({"rate_per_key": durable.Rate(1, per=timedelta(seconds=1))}, "needs a flow_key"),
        ({"flow_key": staticmethod(str), "concurrency_per_key": 0}, "at least 1"),
        ({"concurrency": 0}, "at least 1"),
        ({"concurrency": True}, "must be an int"),
        ({"flow_key": staticmethod(str), "rate_per_key": 5}, "durable.Rate"),
        ({"flow_key": "tenant"}, "function of the input"),
    ],
)
def test_a_bad_declaration_fails_when_the_class_is_defined(attributes, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        type("BadFlow", (Workflow,), {"one": step(lambda self, ctx: None), **attributes})


def test_a_rate_refuses_a_bare_number_and_a_limit_below_one():
    with pytest.raises(TypeError, match="timedelta"):
        durable.Rate(5, per=60)
    with pytest.raises(ValueError, match="positive"):
        durable.Rate(5, per=timedelta(0))
    with pytest.raises(ValueError, match="at least 1"):
        durable.Rate(0, per=timedelta(seconds=1))


# --- the claim's limits --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrency_per_key_holds_claim_after_claim():
    for tenant in (1, 2):
        for _ in range(4):
            durable.start(PerTenant, {"tenant": tenant})
    first = claim()
    by_key = sorted(r.flow_key for r in first)
    assert by_key == ["tenant:1", "tenant:1", "tenant:2", "tenant:2"]
    assert claim() == []  # both keys full: held back, still pending and due
    assert Run.objects.filter(status=Status.PENDING, due_at__isnull=False).count() == 4
    finish([r for r in first if r.flow_key == "tenant:1"][:1])
    [again] = claim()
    assert again.flow_key == "tenant:1"


@pytest.mark.django_db(transaction=True)
def test_a_full_key_never_holds_back_other_keys_workflows_or_runs_without_a_key():
    for _ in range(3):
        durable.start(OnePerTenant, {"tenant": "full"})
    other = durable.start(OnePerTenant, {"tenant": "free"})
    keyless = durable.start(Turns, {})
    [held] = claim(limit=1)
    assert held.flow_key == "tenant:full" or held.id == other
    got = {r.id for r in claim(queues=("flow", "turns"))}
    assert keyless in got
    assert other in got or held.id == other
    assert Run.objects.filter(flow_key="tenant:full", status=Status.RUNNING).count() == 1


@pytest.mark.django_db(transaction=True)
def test_workflow_wide_concurrency_counts_every_key_and_no_key():
    for tenant in (1, 2, 3):
        durable.start(FewAtOnce, {"tenant": tenant})
    durable.start(FewAtOnce, {})
    assert len(claim()) == 2
    assert claim() == []
    assert Run.objects.filter(workflow="few_at_once", status=Status.RUNNING).count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_rate_counts_first_claims_only():
    runs = [durable.start(RatedPerTenant, {"tenant": 1}) for _ in range(7)]
    first = claim()
    assert len(first) == 5  # 5 per 2 s
    assert claim() == []
    # A run handed back (a retry's backoff, a wait) resumes without counting again.
    Run.objects.filter(id=first[0].id).update(
        status=Status.PENDING, worker_id=None, lease_expires_at=None
    )
    assert [r.id for r in claim()] == [first[0].id]
    # Once the window has passed (moved back here, as if 2 s went by), two more begin.
    Run.objects.filter(id__in=runs).update(started_at=store.now() - timedelta(seconds=3))
    FlowRateSlot.objects.update(begun_at=store.now() - timedelta(seconds=3))
    assert len(claim()) == 2


@pytest.mark.django_db(transaction=True)
def test_a_dead_workers_slot_comes_back_with_its_lease():
    for _ in range(2):
        durable.start(OnePerTenant, {"tenant": 1})
    [taken] = claim()
    assert claim() == []
    # Its worker died: recovery returns the run once the lease ran out.
    Run.objects.filter(id=taken.id).update(lease_expires_at=store.now() - timedelta(seconds=1))
    from django_durable.runtime import maintenance

    maintenance.recover()
    assert len(claim()) == 1
    assert Run.objects.filter(flow_key="tenant:1", status=Status.RUNNING).count() == 1


# --- turns -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_new_key_is_claimed_within_a_claim_per_active_key_not_after_the_backlog():
    for _ in range(50):
        durable.start(Turns, {"tenant": "big"})
    order = [claim(limit=1, queues=("turns",))[0].flow_key for _ in range(3)]
    assert order == ["tenant:big"] * 3
    late = [durable.start(Turns, {"tenant": "late"}) for _ in range(5)]
    order = [claim(limit=1, queues=("turns",))[0] for _ in range(10)]
    assert [r.flow_key for r in order] == ["tenant:late", "tenant:big"] * 5
    assert {r.id for r in order if r.flow_key == "tenant:late"} == set(late)


@pytest.mark.django_db(transaction=True)
def test_runs_without_a_flow_key_take_turns_as_one_key_and_priority_comes_first():
    for _ in range(5):
        durable.start(Turns, {"tenant": "a"})
    for _ in range(5):
        durable.start(Turns, {})
    urgent = durable.start(Turns, {"tenant": "a"}, priority=5)
    got = claim(limit=5, queues=("turns",))
    assert got[0].id == urgent
    keys = [r.flow_key for r in claim(limit=1, queues=("turns",)) for _ in [0]]
    keys += [claim(limit=1, queues=("turns",))[0].flow_key for _ in range(3)]
    assert None in keys and "tenant:a" in keys


@pytest.mark.django_db(transaction=True)
def test_drain_honours_the_limits_and_the_rate_window_is_a_timer():
    for _ in range(7):
        durable.start(RatedPerTenant, {"tenant": 1, "seconds": 0})
    drain()
    assert Run.objects.filter(status=Status.COMPLETED).count() == 5
    assert Run.objects.filter(status=Status.PENDING).count() == 2
    drain(run_timers=True)
    assert Run.objects.filter(status=Status.COMPLETED).count() == 7
