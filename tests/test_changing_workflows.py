"""A deploy changes a workflow under runs in flight (docs/changing-workflows.md):
no run executes a different step in place of the one it was in."""

import pytest

import django_durable as durable
from django_durable import Workflow
from django_durable.models import Status
from django_durable.testing import drain
from django_durable.workflows.definition import registry, step
from tests.helpers import fresh
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db

NAME = "deployed_twice"


def waiting_step(name):
    def body(self, ctx):
        Execution.objects.create(run_id=ctx.run_id, step=name)
        ctx.wait_for_event(f"go-{name}")

    body.__name__ = name
    return step(body)


def deploy(*names):
    """Define (again) the workflow ``NAME`` with steps ``names``, each waiting for an event."""
    registry.unregister(NAME)
    attrs = {"name": NAME, "__module__": __name__}
    attrs.update({n: waiting_step(n) for n in names})
    return type("Deployed", (Workflow,), attrs)


@pytest.fixture(autouse=True)
def forget_definition():
    yield
    registry.unregister(NAME)


def ran(run_id):
    return list(
        Execution.objects.filter(run_id=run_id).order_by("id").values_list("step", flat=True)
    )


def run_waiting_in(position):
    """A run of a, b, c waiting in the step at ``position``."""
    run_id = durable.start(NAME)
    drain()
    for name in "abc"[:position]:
        durable.send_event(run_id, f"go-{name}")
        drain()
    assert fresh(run_id).step_index == position
    return run_id


@pytest.mark.parametrize(
    "new_steps, position",
    [
        (("a", "charge_card", "b", "c"), 1),  # inserted before the run's step
        (("a", "c"), 1),  # its step removed
        (("a", "b_renamed", "c"), 1),  # its step renamed
        (("a", "c", "b"), 1),  # steps reordered
        (("a", "b"), 2),  # a step ahead of it removed at the end
    ],
)
def test_a_changed_definition_fails_the_run_and_retry_resumes_after_restoring(new_steps, position):
    deploy("a", "b", "c")
    run_id = run_waiting_in(position)
    before = ran(run_id)
    waiting_in = "abc"[position]

    deploy(*new_steps)
    durable.send_event(run_id, f"go-{waiting_in}")
    drain()
    run = fresh(run_id)
    assert (run.status, run.error["type"]) == (Status.FAILED, "DefinitionChanged")
    assert repr(waiting_in) in run.error["message"]
    assert ran(run_id) == before  # no step ran in its place

    deploy("a", "b", "c")
    durable.retry(run_id)
    drain()
    assert ran(run_id)[len(before)] == waiting_in
    for name in "abc"[position + 1 :]:  # its own step got its event before the deploy
        durable.send_event(run_id, f"go-{name}")
        drain()
    assert fresh(run_id).status == Status.COMPLETED


def test_a_step_added_at_the_end_is_run_by_runs_in_flight():
    deploy("a", "b")
    run_id = run_waiting_in(1)
    deploy("a", "b", "c")
    for name in "bc":
        durable.send_event(run_id, f"go-{name}")
        drain()
    assert fresh(run_id).status == Status.COMPLETED
    assert ran(run_id) == ["a", "a", "b", "b", "c", "c"]
