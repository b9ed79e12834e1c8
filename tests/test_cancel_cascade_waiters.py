"""Cancelling a parent whose keyed children have runs waiting behind them (``run_again``).

The cascade is the one path every ending takes (``finish.run_finished``): every
descendant it cancels is announced (``run_finished`` signal, telemetry span), the
run waiting behind each cancelled child's key is promoted (a ``key_handed_off``
activity), and a parent whose child ended is woken. On PostgreSQL and SQLite.
"""

from __future__ import annotations

import pytest
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import django_durable as durable
from django_durable import signals, step, telemetry
from django_durable.models import Activity, Run, Status
from django_durable.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def leaf(self, ctx):
    ctx.wait_for_event("never")  # stays going until cancelled


def middle(self, ctx):
    return ctx.call_workflow("cascade_leaf", {"n": ctx.input["n"]}, key=f"leaf:{ctx.input['n']}")


def root(self, ctx):
    return ctx.parallel(
        [("cascade_middle", {"n": n}) for n in (1, 2)],
        mode="complete_all",
    )


def top(self, ctx):
    return ctx.call_workflow("cascade_middle", {"n": 3}, key="middle:3")


@pytest.fixture
def tree(define):
    """``cascade_root`` -> 2 ``cascade_middle`` branches -> each a keyed ``cascade_leaf``."""
    define("cascade_leaf", work=step(leaf))
    define("cascade_middle", work=step(middle))
    define("cascade_root", work=step(root))
    define("cascade_top", work=step(top))


@pytest.fixture
def announced():
    finished: dict = {}

    def receiver(sender, run_id, status, **kwargs):
        finished.setdefault(run_id, []).append(status)

    signals.run_finished.connect(receiver, weak=False)
    yield finished
    signals.run_finished.disconnect(receiver)


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.install(tracer_provider=provider)
    yield exporter
    telemetry.install()
    provider.shutdown()


def descendants(run_id) -> list[Run]:
    found, level = [], list(Run.objects.filter(parent_id=run_id))
    while level:
        found += level
        level = list(Run.objects.filter(parent_id__in=[r.id for r in level]))
    return found


def run_spans(exporter, status: str) -> set[str]:
    return {
        s.attributes["durable.run_id"]
        for s in exporter.get_finished_spans()
        if s.name.startswith("durable.run ") and s.attributes.get("durable.status") == status
    }


def test_cancelling_a_parent_announces_every_descendant_and_promotes_every_waiter(
    tree, announced, spans
):
    root_id = durable.start("cascade_root")
    drain()
    tree_runs = descendants(root_id)
    assert len(tree_runs) == 4  # 2 middles, 2 keyed leaves
    assert {r.status for r in tree_runs} == {Status.WAITING}
    keyed = [r for r in tree_runs if r.key is not None]
    assert sorted(r.key for r in keyed) == ["leaf:1", "leaf:2"]
    # A run waits behind each keyed child.
    waiters = {
        r.key: durable.start("cascade_leaf", {"again": True}, key=r.key, on_duplicate="run_again")
        for r in keyed
    }
    for r in keyed:
        waiter = Run.objects.get(id=waiters[r.key])
        assert (waiter.status, waiter.holds_key, waiter.runs_after_id) == ("pending", False, r.id)

    durable.cancel(root_id, reason="stop the tree")

    cancelled = {root_id} | {r.id for r in tree_runs}
    assert set(Run.objects.filter(id__in=cancelled).values_list("status", flat=True)) == {
        Status.CANCELLED
    }
    # Every run of the tree announced once, cancelled: signal and span.
    assert {run_id: announced[run_id] for run_id in cancelled} == {
        run_id: [Status.CANCELLED] for run_id in cancelled
    }
    assert {str(run_id) for run_id in cancelled} <= run_spans(spans, Status.CANCELLED)
    # Every waiter behind a cancelled child took its key, and the hand-off was recorded.
    for key, waiter_id in waiters.items():
        waiter = Run.objects.get(id=waiter_id)
        assert (waiter.status, waiter.holds_key) == (Status.PENDING, True), key
        assert waiter_id not in announced
    handoffs = Activity.objects.filter(kind="key_handed_off", run_id__in=waiters.values())
    assert handoffs.count() == 2
    # The promoted waiters run (and wait, as leaves do): the key moved on for real.
    drain()
    assert set(Run.objects.filter(id__in=waiters.values()).values_list("status", flat=True)) == {
        Status.WAITING
    }


def test_cancelling_a_keyed_child_wakes_its_parent_and_promotes_the_waiters(tree, announced):
    top_id = durable.start("cascade_top")
    drain()
    (middle_run,) = Run.objects.filter(parent_id=top_id)
    (leaf_run,) = Run.objects.filter(parent_id=middle_run.id)
    assert (middle_run.key, leaf_run.key) == ("middle:3", "leaf:3")
    behind_middle = durable.start(
        "cascade_middle", {"n": 4}, key="middle:3", on_duplicate="run_again"
    )
    behind_leaf = durable.start("cascade_leaf", {}, key="leaf:3", on_duplicate="run_again")

    durable.cancel(middle_run.id)

    assert announced[middle_run.id] == [Status.CANCELLED]
    assert announced[leaf_run.id] == [Status.CANCELLED]
    for waiter_id in (behind_middle, behind_leaf):
        waiter = Run.objects.get(id=waiter_id)
        assert (waiter.status, waiter.holds_key) == (Status.PENDING, True)
    # The parent waiting for the cancelled child was woken: it is due now, and its
    # call raises ChildFailed, which fails it.
    top = Run.objects.get(id=top_id)
    assert top.status == Status.PENDING and top.waiting_for is None
    drain()
    top = Run.objects.get(id=top_id)
    assert top.status == Status.FAILED and top.error["type"] == "ChildFailed"
    assert announced[top_id] == [Status.FAILED]
