"""Rerun's record is linear in the steps: what a completed step replaced in the
context is written once, with its attempt (``StepAttempt.replaced``), not kept in the
run's state, which every later step's record writes again; and a rerun from any step
still begins with the context as the steps before it left it (docs/replay-and-repair.md).
"""

import json

import pytest

import django_durable as durable
from django_durable import Workflow, step
from django_durable.models import Run, Status, StepAttempt
from django_durable.testing import drain
from tests.helpers import fresh

pytestmark = pytest.mark.django_db

STEPS = 30
VALUE_CHARS = 20_000


def _effect(index: int, context: dict) -> None:
    """What step ``index`` does to the context: replaces the 20 kB value, adds a name,
    and every third step deletes the name its predecessor added."""
    context["blob"] = f"{index:02d}" * (VALUE_CHARS // 2)
    context[f"n{index}"] = index
    if index % 3 == 2:
        context.pop(f"n{index - 1}", None)


def _step(index: int):
    def method(self, ctx):
        _effect(index, ctx.data)

    method.__name__ = method.__qualname__ = f"s{index:02d}"
    return step(method)


ThirtySteps = type(
    "ThirtySteps",
    (Workflow,),
    {
        "__module__": __name__,
        "name": "replay_thirty_steps",
        **{f"s{index:02d}": _step(index) for index in range(STEPS)},
    },
)


def _expected_before(index: int) -> dict:
    context: dict = {}
    for earlier in range(index):
        _effect(earlier, context)
    return context


@pytest.fixture
def finished_run():
    run_id = durable.start(ThirtySteps)
    drain(max_seconds=120)
    run = fresh(run_id)
    assert run.status == Status.COMPLETED
    return run


def test_the_state_does_not_grow_with_the_steps(finished_run):
    """30 steps each replacing a 20 kB value: the run's state stays small (it grew by
    20 kB a step when it kept what each step replaced), and each completed attempt
    keeps its own step's replaced values, the last step's too."""
    assert len(json.dumps(finished_run.state)) < 1000
    attempts = StepAttempt.objects.filter(
        run_id=finished_run.id, status=StepAttempt.Outcome.COMPLETED
    ).order_by("step_index")
    assert attempts.count() == STEPS
    for attempt in attempts:
        before = _expected_before(attempt.step_index)
        assert attempt.replaced["blob"] == ([before["blob"]] if "blob" in before else [])
        assert attempt.replaced[f"n{attempt.step_index}"] == []


def test_a_rerun_from_each_step_begins_with_the_context_the_steps_before_left(finished_run):
    for index in range(STEPS):
        rerun_id = durable.rerun(finished_run.id, from_step=f"s{index:02d}")
        rerun = fresh(rerun_id)
        assert rerun.step_index == index
        assert rerun.context == _expected_before(index), index
        # The rerun carries what the steps before it replaced (so that it can be rerun
        # from one of them), and nothing of the steps it will run.
        assert set(rerun.state.get("undo", {})) == {str(i) for i in range(index)}
        Run.objects.filter(id=rerun_id).delete()


def test_a_rerun_of_a_rerun_from_an_earlier_or_later_step_is_exact(finished_run):
    first = durable.rerun(finished_run.id, from_step="s20")
    drain(max_seconds=60)
    assert fresh(first).status == Status.COMPLETED
    assert fresh(first).context == fresh(finished_run.id).context
    for index in (0, 5, 19, 20, 25, 29):
        again = durable.rerun(first, from_step=f"s{index:02d}")
        assert fresh(again).context == _expected_before(index), index
        Run.objects.filter(id=again).delete()
