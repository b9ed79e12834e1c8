"""Context operations: ctx.delete, append, increment, merge; values that are not JSON
are refused at the call, with TypeError, before anything is recorded."""

import datetime

import pytest

import django_durable as durable
from django_durable import step
from django_durable.models import Status
from django_durable.testing import drain
from tests.helpers import fresh

pytestmark = pytest.mark.django_db


def test_the_operations_change_the_saved_context(define):
    def first(self, ctx):
        ctx.put("gone", 1)
        ctx.append("seen", "a")
        ctx.append("seen", {"b": 2})
        assert ctx.increment("count") == 1
        assert ctx.increment("count", by=41) == 42
        ctx.merge({"x": 1, "y": [1, 2]})

    def second(self, ctx):
        ctx.delete("gone")
        ctx.delete("never_there")
        ctx.append("seen", None)
        return ctx.increment("count", by=-2)

    workflow = define("ctx_ops", first=step(first), second=step(second))
    run_id = durable.start(workflow)
    drain()
    run = fresh(run_id)
    assert run.status == Status.COMPLETED, run.error
    assert run.result == 40
    assert run.context == {"seen": ["a", {"b": 2}, None], "count": 40, "x": 1, "y": [1, 2]}


@pytest.mark.parametrize(
    "call",
    [
        lambda ctx: ctx.put("when", datetime.date(2026, 1, 1)),
        lambda ctx: ctx.put("nan", float("nan")),
        lambda ctx: ctx.put(1, "name not a str"),
        lambda ctx: ctx.append("items", object()),
        lambda ctx: ctx.merge({"ok": 1, "bad": {1, 2}}),
        lambda ctx: ctx.merge([("not", "a dict")]),
        lambda ctx: ctx.increment("count", by=1.5),
        lambda ctx: ctx.increment("count", by=True),
        lambda ctx: (ctx.put("text", "a"), ctx.increment("text")),
        lambda ctx: (ctx.put("text", "a"), ctx.append("text", 1)),
    ],
    ids=[
        "put-date",
        "put-nan",
        "put-name",
        "append-object",
        "merge-set",
        "merge-list",
        "increment-float",
        "increment-bool",
        "increment-str",
        "append-to-str",
    ],
)
def test_bad_values_raise_type_error_at_the_call(define, call):
    caught = []

    def only(self, ctx):
        try:
            call(ctx)
        except TypeError as exc:
            caught.append(str(exc))
        return ctx.data

    workflow = define("ctx_bad", only=step(only))
    run_id = durable.start(workflow)
    drain()
    run = fresh(run_id)
    assert run.status == Status.COMPLETED, run.error
    assert len(caught) == 1, caught
    # A refused merge sets nothing, not even its good items.
    assert "ok" not in run.result and "bad" not in run.result
