"""Replay and repair: ``rerun(run_id, from_step=..., input=...)`` begins at a step with
the context the original had when that step began, and runs none of the steps
before it again (docs/replay-and-repair.md)."""

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction

import django_durable as durable
from django_durable import Workflow, signals, step
from django_durable.models import Activity, Run, Status, StepAttempt
from django_durable.testing import drain
from tests.helpers import fresh
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db

# Step 3 fails while this is in the input and the module's switch is on: a deploy
# that broke step 3, then the fix.
BROKEN = {"charge": True}


def _ran(ctx, name):
    Execution.objects.create(run_id=ctx.run_id, step=name)


class FourSteps(Workflow):
    name = "replay_four_steps"
    reuse = "after_close"

    @step
    def fetch(self, ctx):
        _ran(ctx, "fetch")
        ctx.put("body", f"article {ctx.input['id']}")
        ctx.put("tries", [])

    @step
    def charge(self, ctx):
        _ran(ctx, "charge")  # the side effect that must not happen twice
        ctx.put("charged", ctx.input.get("amount", 10))
        ctx.delete("tries")

    @step(retries=1, backoff=durable.seconds(0))
    def publish(self, ctx):
        _ran(ctx, "publish")
        seen = dict(ctx.data)
        Execution.objects.create(run_id=ctx.run_id, step=f"publish saw {sorted(seen.items())}")
        ctx.put("published", True)
        if BROKEN["charge"]:
            ctx.put("body", "overwritten by a failed attempt")  # never seen by a rerun
            raise RuntimeError("the deploy broke step 3")
        return seen

    @step
    def notify(self, ctx):
        _ran(ctx, "notify")
        return {"notified": ctx.get("body"), "input": ctx.input}


class Guarded(Workflow):
    name = "replay_guarded"
    reuse = "never"

    @step
    def one(self, ctx):
        ctx.put("one", 1)

    @step
    def two(self, ctx):
        return ctx.get("one")


@pytest.fixture
def broken():
    BROKEN["charge"] = True
    yield
    BROKEN["charge"] = True


def _executions(run_id, name):
    return Execution.objects.filter(run_id=run_id, step=name).count()


def _failed_at_step_3(key="article:1"):
    run_id = durable.start(FourSteps, {"id": 1}, key=key)
    drain(run_timers=True)
    run = fresh(run_id)
    assert run.status == Status.FAILED and run.step_index == 2
    return run


def test_rerun_from_step_3_runs_neither_step_1_nor_2_and_gives_step_3_its_first_context(broken):
    original = _failed_at_step_3()
    first_seen = Execution.objects.filter(run_id=original.id, step__startswith="publish saw")
    assert first_seen.count() == 2  # two attempts, the same context each time
    attempts_before = StepAttempt.objects.filter(run_id=original.id).count()
    BROKEN["charge"] = False  # the fix is deployed

    new_id = durable.rerun(original.id, from_step="publish")
    assert drain(run_timers=True) == 2  # publish and notify, nothing else
    new = fresh(new_id)
    assert new.status == Status.COMPLETED
    assert new.rerun_of_id == original.id and new.rerun_from_step == "publish"
    assert _executions(new_id, "fetch") == 0 and _executions(new_id, "charge") == 0
    assert _executions(new_id, "publish") == 1
    (seen,) = Execution.objects.filter(run_id=new_id, step__startswith="publish saw")
    assert seen.step == first_seen.first().step
    assert seen.step == "publish saw " + str(sorted({"body": "article 1", "charged": 10}.items()))
    assert new.result == {"notified": "article 1", "input": {"id": 1}}
    assert [a.step for a in StepAttempt.objects.filter(run_id=new_id)] == ["publish", "notify"]
    # The original is unchanged, but for the key the rerun took.
    again = fresh(original.id)
    assert again.status == Status.FAILED and not again.holds_key
    assert StepAttempt.objects.filter(run_id=original.id).count() == attempts_before
    assert again.context == original.context and again.state == original.state
    assert new.holds_key and new.key == "article:1"


def test_rerun_with_a_new_input(broken):
    original = _failed_at_step_3()
    BROKEN["charge"] = False
    new_id = durable.rerun(original.id, from_step="charge", input={"id": 1, "amount": 25})
    drain(run_timers=True)
    new = fresh(new_id)
    assert new.input == {"id": 1, "amount": 25}
    assert _executions(new_id, "fetch") == 0 and _executions(new_id, "charge") == 1
    (seen,) = Execution.objects.filter(run_id=new_id, step__startswith="publish saw")
    assert "('charged', 25)" in seen.step
    assert new.result["input"] == {"id": 1, "amount": 25}


def test_a_rerun_without_a_step_is_a_fresh_copy(broken):
    original = _failed_at_step_3()
    BROKEN["charge"] = False
    new_id = durable.rerun(original.id)
    drain(run_timers=True)
    new = fresh(new_id)
    assert new.status == Status.COMPLETED
    assert new.rerun_of_id == original.id and new.rerun_from_step is None
    assert _executions(new_id, "fetch") == 1


def test_a_rerun_of_a_rerun_from_an_earlier_step(broken):
    original = _failed_at_step_3()
    BROKEN["charge"] = False
    first = durable.rerun(original.id, from_step="publish")
    drain(run_timers=True)
    second = durable.rerun(first, from_step="charge")
    drain(run_timers=True)
    run = fresh(second)
    assert run.status == Status.COMPLETED and run.rerun_of_id == first
    assert _executions(second, "charge") == 1 and _executions(second, "fetch") == 0
    (seen,) = Execution.objects.filter(run_id=second, step__startswith="publish saw")
    assert seen.step == "publish saw " + str(sorted({"body": "article 1", "charged": 10}.items()))


def test_reuse_never_refuses_until_release_key():
    run_id = durable.start(Guarded, {}, key="once")
    drain()
    assert fresh(run_id).status == Status.COMPLETED
    count = Run.objects.count()
    with pytest.raises(durable.KeyTaken) as taken:
        durable.rerun(run_id, from_step="two")
    assert taken.value.holder_id == run_id
    assert Run.objects.count() == count
    # The refusal is recorded as a start's is: a key_duplicate with outcome "error".
    (refused,) = Activity.objects.filter(kind=Activity.Kind.KEY_DUPLICATE)
    assert (refused.run_id, refused.key, refused.details["outcome"]) == (run_id, "once", "error")
    durable.release_key(run_id, by="ops@example.com")
    new_id = durable.rerun(run_id, from_step="two")
    drain()
    new = fresh(new_id)
    assert new.result == 1 and new.holds_key
    assert fresh(run_id).status == Status.COMPLETED


def test_a_refused_rerun_inside_a_transaction_keeps_it_usable_and_records_the_refusal(
    django_capture_on_commit_callbacks,
):
    run_id = durable.start(Guarded, {}, key="once")
    drain()
    heard = []

    def receiver(sender, **kwargs):
        heard.append((kwargs["run_id"], kwargs["outcome"]))

    signals.key_duplicate.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
            with pytest.raises(durable.KeyTaken):
                async_to_sync(durable.arerun)(run_id)
            durable.start(Guarded, {}, key="other")  # the caller's transaction goes on
    finally:
        signals.key_duplicate.disconnect(receiver)
    assert Activity.objects.filter(
        kind=Activity.Kind.KEY_DUPLICATE, run_id=run_id, details__outcome="error"
    ).exists()
    assert Run.objects.count() == 2
    assert heard == [(run_id, "error")]  # the key_duplicate signal, after commit


def _counts():
    return (Run.objects.count(), StepAttempt.objects.count(), Activity.objects.count())


def test_an_unknown_step_or_one_never_begun_is_refused_writing_nothing(broken):
    original = _failed_at_step_3()
    before = _counts()
    with pytest.raises(ValueError, match="no step 'nope'"):
        durable.rerun(original.id, from_step="nope")
    with pytest.raises(ValueError, match="never began step 'notify'"):
        durable.rerun(original.id, from_step="notify")
    with pytest.raises(TypeError):
        durable.rerun(original.id, from_step="publish", input=["not", "a", "dict"])
    assert _counts() == before
    assert fresh(original.id).holds_key


def test_an_unfinished_run_is_refused_before_the_step_and_the_key(broken):
    run_id = durable.start(FourSteps, {"id": 2}, key="article:2")
    before = _counts()
    with pytest.raises(durable.NotFinished):
        durable.rerun(run_id, from_step="nope")  # NotFinished first, before the step
    with pytest.raises(durable.NotFinished):
        durable.rerun(run_id)
    assert _counts() == before


class Waiting(Workflow):
    """A step that puts, then waits: what it saved before the wait is its own."""

    name = "replay_waiting"

    @step
    def first(self, ctx):
        ctx.put("a", 1)

    @step
    def second(self, ctx):
        ctx.put("b", ctx.get("b", 0) + 1)
        ctx.put("a", 2)
        ctx.sleep(durable.seconds(1))
        raise RuntimeError("fails after the wait")


def test_what_a_step_saved_at_a_wait_is_not_in_the_rerun_context():
    run_id = durable.start(Waiting, {})
    drain(run_timers=True)
    run = fresh(run_id)
    assert run.status == Status.FAILED
    assert run.context == {"a": 2, "b": 1}  # saved at the wait
    new_id = durable.rerun(run_id, from_step="second")
    assert fresh(new_id).context == {"a": 1}
    first_id = durable.rerun(run_id, from_step="first")
    assert fresh(first_id).context == {}


def test_arerun_takes_the_same_arguments(broken):
    original = _failed_at_step_3("article:async")
    new_id = async_to_sync(durable.arerun)(original.id, from_step="charge", input={"id": 1})
    run = fresh(new_id)
    assert run.rerun_from_step == "charge" and run.step_index == 1
    assert run.context == {"body": "article 1", "tries": []}


COMPENSATED = []


class Undone(Workflow):
    """A compensation that changes the context: not in a rerun's context either."""

    name = "replay_undone"

    @step(compensate="unreserve")
    def reserve(self, ctx):
        ctx.put("reserved", 3)

    @step
    def charge(self, ctx):
        ctx.put("charged", True)
        raise durable.NonRetryable("card declined")

    def unreserve(self, ctx):
        COMPENSATED.append(ctx.run_id)
        ctx.put("reserved", 0)
        ctx.put("released", True)


def test_what_a_compensation_changed_is_not_in_the_rerun_context():
    run_id = durable.start(Undone, {})
    drain(run_timers=True)
    run = fresh(run_id)
    assert run.status == Status.COMPENSATED
    assert run.context == {"reserved": 0, "released": True}
    new_id = durable.rerun(run_id, from_step="charge")
    assert fresh(new_id).context == {"reserved": 3}
    drain(run_timers=True)
    # The rerun carries on the original's work: failing, it compensates step 1 too.
    assert fresh(new_id).status == Status.COMPENSATED and COMPENSATED[-1] == new_id
