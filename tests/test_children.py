"""Child workflows (ctx.call_workflow) and parallel branches (durable.parallel)."""

import pytest
from django.core.exceptions import ValidationError

import django_durable as durable
from django_durable import store
from django_durable.models import Run, StepAttempt
from django_durable.testing import drain
from tests.testapp.models import SideEffect
from tests.testapp.workflows_engine import (
    CallDouble,
    Double,
    Fanout,
    FanoutCtx,
    SlowChild,
    WaitForChildForever,
)

pytestmark = pytest.mark.django_db


def children_of(run_id):
    return list(Run.objects.filter(parent_id=run_id).order_by("created_at"))


def test_child_result_is_returned_to_the_parent():
    run_id = durable.start(CallDouble, {"n": 21}, key="parent:1")
    drain()
    parent = durable.get_run(run_id)
    assert parent.status == "completed", parent.error
    assert parent.result == 42
    [child] = children_of(run_id)
    assert child.workflow == "double" and child.status == "completed"
    # Keys aren't inherited: the child has none.
    assert child.key is None and not child.holds_key


def test_parent_waits_without_a_worker_and_is_woken_by_the_child():
    run_id = durable.start(CallDouble, {"n": 2})
    # Run only the parent: claim it alone (the child is created pending).
    from datetime import timedelta

    from django_durable.runtime import executor

    [parent] = store.claim(worker_id="w", queues=None, limit=1, lease=timedelta(seconds=30))
    executor.execute(parent)
    parent = durable.get_run(run_id)
    assert parent.status == "waiting"
    assert parent.waiting_for == "children"
    assert parent.worker_id is None and parent.due_at is None
    [child] = children_of(run_id)
    assert child.status == "pending"
    # The child runs and finishing makes the parent due.
    [claimed] = store.claim(worker_id="w", queues=None, limit=1, lease=timedelta(seconds=30))
    assert claimed.id == child.id
    executor.execute(claimed)
    parent = durable.get_run(run_id)
    assert parent.status == "pending" and parent.due_at is not None
    drain()
    assert durable.get_run(run_id).result == 4


def test_child_is_started_once_across_the_parent_step_re_runs():
    run_id = durable.start(CallDouble, {"n": 3})
    drain()
    parent = durable.get_run(run_id)
    assert parent.status == "completed" and parent.result == 6
    # The compute step ran three times (first call, after the child, after the
    # sleep) and found the same child each time.
    runs_of_step = SideEffect.objects.filter(run_id=run_id, step__startswith="compute").count()
    assert runs_of_step == 3
    assert len(children_of(run_id)) == 1
    assert SideEffect.objects.filter(step="double").count() == 1


def test_a_failed_child_raises_in_the_parent_step():
    run_id = durable.start(CallDouble, {"n": 5, "child_fails": True})
    drain()
    parent = durable.get_run(run_id)
    assert parent.status == "failed"
    assert parent.error["type"] == "ChildFailed"
    [child] = children_of(run_id)
    assert child.status == "failed"
    assert str(child.id) in parent.error["message"]
    assert "cannot double 5" in parent.error["message"]


def test_a_retried_parent_step_starts_a_new_child_after_a_failure():
    run_id = durable.start(CallDouble, {"n": 5, "child_fails": True})
    drain()
    first = children_of(run_id)
    assert len(first) == 1
    durable.retry(run_id)
    drain()
    assert len(children_of(run_id)) == 2  # the failed call was forgotten


def test_call_workflow_with_a_key_follows_the_child_workflows_key_rules():
    first = durable.start(CallDouble, {"n": 1, "child_key": "double:7"})
    second = durable.start(CallDouble, {"n": 2, "child_key": "double:7"})
    drain()
    # The first parent's child holds the key while the second parent calls:
    # use_existing (Double's default) gives the second parent that run's result.
    assert durable.get_run(first).result == 2
    assert durable.get_run(second).result == 2
    [child] = Run.objects.filter(workflow="double")
    assert child.parent_id == first and child.key == "double:7"
    assert children_of(second) == []
    from django_durable import activity

    [dupe] = activity.list(kinds=["key_duplicate"], run_id=child.id)
    assert dupe.details["outcome"] == "use_existing"
    assert dupe.details["input"] == {"n": 2, "fail": False}


def test_call_workflow_key_taken_with_error_fails_the_step():
    from tests.testapp.workflows import SendInvoice  # reuse="never", on_duplicate="error"

    holder = durable.start(SendInvoice, {"id": 1}, key="inv:1")
    drain()
    from django_durable import Workflow, step

    class CallInvoice(Workflow):
        @step
        def call(self, ctx):
            return ctx.call_workflow(SendInvoice, {"id": 1}, key="inv:1")

    try:
        run_id = durable.start(CallInvoice)
        drain()
        parent = durable.get_run(run_id)
        assert parent.status == "failed"
        assert parent.error["type"] == "KeyTaken"
        assert Run.objects.filter(workflow="send_invoice").count() == 1
        from django_durable import activity

        [dupe] = activity.list(kinds=["key_duplicate"], run_id=holder)
        assert dupe.details["outcome"] == "error"
    finally:
        from django_durable.workflows.definition import registry

        registry.unregister("call_invoice")


def test_call_workflow_with_a_free_key_starts_a_keyed_child():
    run_id = durable.start(CallDouble, {"n": 4, "child_key": "double:8"})
    drain()
    [child] = children_of(run_id)
    assert child.key == "double:8" and child.holds_key
    assert durable.get_run(run_id).result == 8
    # Double's reuse is after_close: once that child completed, the key is free
    # and the next keyed call starts a new child, which takes the key over.
    other = durable.start(CallDouble, {"n": 9, "child_key": "double:8"})
    drain()
    assert durable.get_run(other).result == 18
    [second] = children_of(other)
    assert second.holds_key and not durable.get_run(child.id).holds_key


def test_call_workflow_rejects_bad_arguments_before_writing():
    from django_durable.runtime.context import Context

    run = Run(id=__import__("uuid").uuid4(), workflow="call_double", input={}, state={})
    ctx = Context(run, waits=[])
    with pytest.raises(ValidationError):
        ctx.call_workflow(Double, {"n": 1}, key="")
    with pytest.raises(TypeError):
        ctx.call_workflow(Double, [1])
    with pytest.raises(LookupError):
        ctx.call_workflow("no_such_workflow")
    assert Run.objects.count() == 0


def test_parallel_returns_results_in_branch_order():
    run_id = durable.start(Fanout, {"ns": [1, 2, 3]})
    drain()
    parent = durable.get_run(run_id)
    assert parent.status == "completed", parent.error
    assert parent.result == [2, 4, 6]
    branches = children_of(run_id)
    assert len(branches) == 3
    assert all(b.key is None for b in branches)


def test_ctx_parallel_accepts_names_and_complete_all():
    run_id = durable.start(FanoutCtx)
    drain()
    assert durable.get_run(run_id).result == [2, 4]


def test_parallel_fail_fast_cancels_the_other_branches():
    run_id = durable.start(Fanout, {"ns": [1, 2], "fail": [2], "slow": True})
    drain()
    parent = durable.get_run(run_id)
    assert parent.status == "failed"
    assert parent.error["type"] == "ParallelFailed"
    statuses = {b.workflow + str(b.input.get("n", "")): b.status for b in children_of(run_id)}
    assert statuses == {"double1": "completed", "double2": "failed", "slow_child": "cancelled"}


def test_parallel_complete_all_waits_for_every_branch():
    run_id = durable.start(
        Fanout, {"ns": [1, 2], "fail": [2], "slow": True, "mode": "complete_all"}
    )
    drain()
    parent = durable.get_run(run_id)
    # The slow branch still sleeps: the parent waits, holding no worker.
    assert parent.status == "waiting" and parent.waiting_for == "children"
    slow = Run.objects.get(parent_id=run_id, workflow="slow_child")
    assert slow.status == "waiting"
    Run.objects.filter(id=slow.id).update(due_at=store.now())
    drain()
    parent = durable.get_run(run_id)
    assert parent.status == "failed"
    assert parent.error["type"] == "ParallelFailed"
    assert "1 of 3 parallel branches" in parent.error["message"]


def test_parallel_failed_exception_carries_every_outcome():
    from django_durable.exceptions import ParallelFailed

    outcomes = [
        {"run_id": 1, "status": "completed", "result": 2, "error": None},
        {"run_id": 2, "status": "failed", "result": None, "error": {"message": "x"}},
    ]
    exc = ParallelFailed(outcomes)
    assert exc.outcomes == outcomes
    assert exc.run_id == 2 and exc.status == "failed"
    assert isinstance(exc, durable.ChildFailed)


def test_parallel_outside_a_step_is_an_error():
    with pytest.raises(RuntimeError, match="inside a step"):
        durable.parallel([Double])
    with pytest.raises(ValueError, match="mode"):
        durable.parallel(object(), [Double], mode="sometimes")


def test_cancelling_a_parent_cancels_its_children():
    run_id = durable.start(WaitForChildForever)
    drain()
    [child] = children_of(run_id)
    assert child.status == "waiting"
    durable.cancel(run_id)
    assert durable.get_run(child.id).status == "cancelled"


def test_a_parent_that_times_out_cancels_its_children():
    run_id = durable.start(WaitForChildForever)
    drain()
    Run.objects.filter(id=run_id).update(timeout_at=store.now(), due_at=store.now())
    drain()
    assert durable.get_run(run_id).status == "failed"
    [child] = children_of(run_id)
    assert child.status == "cancelled"


def test_a_lost_wake_is_repaired_by_the_sweep():
    from django_durable.operations import finish as lifecycle

    run_id = durable.start(WaitForChildForever)
    drain()
    [child] = children_of(run_id)
    # The child finishes without waking its parent (as if the worker died in between).
    Run.objects.filter(id=child.id).update(
        status="completed", result="rested", finished_at=store.now(), due_at=None
    )
    assert durable.get_run(run_id).status == "waiting"
    lifecycle.sweep_waiting()
    assert durable.get_run(run_id).status == "pending"
    drain()
    assert durable.get_run(run_id).result == "rested"


def test_child_attempts_are_recorded_as_suspended_waits():
    run_id = durable.start(CallDouble, {"n": 1})
    drain()
    outcomes = list(
        StepAttempt.objects.filter(run_id=run_id, step="compute").values_list("status", flat=True)
    )
    assert outcomes == ["suspended", "suspended", "completed"]


def test_slow_child_is_a_child():
    assert SlowChild.name == "slow_child"


def test_finishing_a_run_without_parent_or_children_costs_no_query(
    django_assert_num_queries,
):
    from django_durable.operations import finish
    from tests.testapp.workflows import Noop

    run_id = durable.start(Noop)
    drain()
    run = durable.get_run(run_id)
    with django_assert_num_queries(0):
        finish.run_finished(run)
