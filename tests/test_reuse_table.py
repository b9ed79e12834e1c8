"""Every cell of the reuse table: a start meets a holder in each status under each
``reuse`` policy, and either gets the holder back (taken) or takes the key (free)."""

import uuid

import pytest

import django_durable as durable
from django_durable.activity import list as list_activity
from django_durable.models import Activity, Run, Status
from django_durable.operations import keys
from tests.helpers import ALL_STATUSES, holder_in

pytestmark = pytest.mark.django_db

ACTIVE = {Status.PENDING, Status.RUNNING, Status.WAITING, Status.COMPENSATING}
FREE = {
    "after_close": {
        Status.COMPLETED,
        Status.FAILED,
        Status.CANCELLED,
        Status.COMPENSATED,
        Status.COMPENSATION_FAILED,
    },
    "after_failure": {
        Status.FAILED,
        Status.CANCELLED,
        Status.COMPENSATED,
        Status.COMPENSATION_FAILED,
    },
    "never": set(),
}
CELLS = [(reuse, status) for reuse in FREE for status in ALL_STATUSES]


def cell_id(cell):
    reuse, status = cell
    return f"{reuse}-{status}-{'free' if status in FREE[reuse] else 'taken'}"


@pytest.mark.parametrize("reuse, status", CELLS, ids=[cell_id(c) for c in CELLS])
def test_use_existing(define, reuse, status):
    workflow = define("keyed", reuse=reuse)
    holder_id = holder_in(workflow, status, "item:1")
    runs_before = Run.objects.count()

    result = durable.start_detailed(workflow, {"value": 2}, key="item:1")

    holder = Run.objects.get(id=holder_id)
    if status in FREE[reuse]:
        assert result.outcome == "handed_off"
        assert result.run_id != holder_id
        new = Run.objects.get(id=result.run_id)
        assert (new.status, new.holds_key, new.input) == (Status.PENDING, True, {"value": 2})
        # The old holder keeps its status and its key as history, but holds nothing.
        assert (holder.status, holder.key, holder.holds_key) == (status, "item:1", False)
        assert Run.objects.count() == runs_before + 1
        assert not Activity.objects.filter(kind="key_duplicate").exists()
    else:
        assert result == durable.StartResult(holder_id, "use_existing")
        assert (holder.status, holder.holds_key) == (status, True)
        assert Run.objects.count() == runs_before
        assert_duplicate_noted(holder_id, "use_existing", {"value": 2})
    assert Run.objects.filter(key="item:1", holds_key=True).count() == 1


def assert_duplicate_noted(holder_id, outcome, input):
    """The duplicate's one activity row (on PostgreSQL written by the start's statement)."""
    noted = Activity.objects.get(kind="key_duplicate")
    holder_input = Run.objects.get(id=holder_id).input
    assert (noted.run_id, noted.workflow, noted.key) == (holder_id, "keyed", "item:1")
    assert noted.details == {
        "key": "item:1",
        "workflow": "keyed",
        "outcome": outcome,
        "input_changed": holder_input != input,
        "input": input,
    }


@pytest.mark.parametrize("reuse, status", CELLS, ids=[cell_id(c) for c in CELLS])
def test_error(define, reuse, status):
    workflow = define("keyed", reuse=reuse, on_duplicate="error")
    holder_id = holder_in(workflow, status, "item:1")
    runs_before = Run.objects.count()

    if status in FREE[reuse]:
        result = durable.start_detailed(workflow, {}, key="item:1")
        assert result.outcome == "handed_off"
        assert Run.objects.get(id=result.run_id).holds_key
    else:
        with pytest.raises(durable.KeyTaken) as raised:
            durable.start(workflow, {}, key="item:1")
        assert isinstance(raised.value.holder_id, uuid.UUID)
        assert raised.value.holder_id == holder_id
        assert Run.objects.count() == runs_before
        assert Run.objects.get(id=holder_id).holds_key
        assert_duplicate_noted(holder_id, "error", {})


@pytest.mark.parametrize("reuse", list(FREE))
@pytest.mark.parametrize(
    "policy", ["cancel_existing", "run_again", ("send_event", "updated")], ids=str
)
def test_a_finished_holder_that_reuse_keeps_answers_other_policies_with_key_taken(
    define, reuse, policy
):
    """Nothing to cancel, wait behind or send to: KeyTaken (use_existing returns it)."""
    workflow = define("keyed", reuse=reuse)
    holder_id = holder_in(workflow, Status.COMPLETED, "item:1")
    if reuse == "never" and policy == "run_again":
        # Refused before the key is looked at: the waiting run could never take it.
        with pytest.raises(ValueError, match="run_again"):
            durable.start(workflow, {}, key="item:1", on_duplicate=policy)
        return
    if Status.COMPLETED in FREE[reuse]:
        assert durable.start_detailed(workflow, {}, key="item:1", on_duplicate=policy).outcome == (
            "handed_off"
        )
        return
    with pytest.raises(durable.KeyTaken) as raised:
        durable.start(workflow, {}, key="item:1", on_duplicate=policy)
    assert raised.value.holder_id == holder_id
    assert Run.objects.count() == 1


def test_a_handoff_is_recorded_as_key_handed_off(define):
    workflow = define("keyed")
    old = holder_in(workflow, Status.COMPLETED, "item:1")
    new = durable.start(workflow, {}, key="item:1")
    [row] = list_activity(kinds=["key_handed_off"])
    assert row.run_id == new
    assert row.details == {
        "key": "item:1",
        "workflow": "keyed",
        "from_run_id": str(old),
        "to_run_id": str(new),
    }


def test_reuse_is_read_at_every_start(define):
    """Changing the class attribute applies to runs that already exist."""
    workflow = define("keyed", reuse="never")
    holder_id = holder_in(workflow, Status.COMPLETED, "item:1")
    assert durable.start(workflow, {}, key="item:1") == holder_id
    workflow.reuse = "after_close"
    assert durable.start_detailed(workflow, {}, key="item:1").outcome == "handed_off"


def test_on_duplicate_is_read_at_every_start(define):
    workflow = define("keyed")
    holder_id = holder_in(workflow, Status.PENDING, "item:1")
    assert durable.start(workflow, {}, key="item:1") == holder_id
    workflow.on_duplicate = "error"
    with pytest.raises(durable.KeyTaken):
        durable.start(workflow, {}, key="item:1")


def test_a_run_between_retry_attempts_still_holds_its_key():
    """SlowRetry waits an hour between attempts: the run is pending, due later, holding."""
    from django_durable.testing import drain

    run_id = durable.start("slow_retry", {}, key="job:1")
    drain()
    run = Run.objects.get(id=run_id)
    assert (run.status, run.attempt, run.holds_key) == (Status.PENDING, 2, True)
    assert durable.start_detailed("slow_retry", {}, key="job:1") == (run_id, "use_existing")


@pytest.mark.parametrize("reuse", list(FREE))
def test_holder_answers_are_the_taken_cells(reuse):
    """The holder states whose duplicates the start's own statement records: exactly the
    taken cells above, less a debounced holder no worker has picked up (it takes the
    newer input instead), and none for the policies that write more."""
    taken = {
        (status, picked_up)
        for status in ALL_STATUSES
        if status not in FREE[reuse]
        for picked_up in (False, True)
    }
    for policy in ("use_existing", "error"):
        assert keys.holder_answers(reuse=reuse, on_duplicate=policy) == taken
        debounced = keys.holder_answers(reuse=reuse, on_duplicate=policy, debounce=True)
        assert debounced == taken - {(Status.PENDING, False)}
    for policy in ("cancel_existing", "run_again", ("send_event", "updated")):
        assert keys.holder_answers(reuse=reuse, on_duplicate=policy) == frozenset()
