"""Workflow definitions: checked when the class is created, found by autodiscovery."""

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured

import django_durable as durable
from django_durable import Workflow, step
from django_durable.workflows.definition import registry
from tests.testapp import workflows as testapp_workflows


def one_step(self, ctx):
    return None


@pytest.fixture
def forget():
    """Names to unregister after the test, whatever it defined."""
    names = []
    yield names.append
    for name in names:
        registry.unregister(name)


def test_autodiscovery_registers_the_workflows_of_installed_apps():
    assert registry.get("process_article") is testapp_workflows.ProcessArticle
    assert registry.get("sync_account") is testapp_workflows.SyncAccount


def test_default_name_is_the_snake_case_of_the_class_name(forget):
    class RebuildSearchIndex(Workflow):
        work = step(one_step)

    forget(RebuildSearchIndex.name)
    assert RebuildSearchIndex.name == "rebuild_search_index"
    assert registry.get("rebuild_search_index") is RebuildSearchIndex


def test_defaults_of_a_definition(forget):
    class Plain(Workflow):
        work = step(one_step)

    forget(Plain.name)
    assert (Plain.reuse, Plain.on_duplicate, Plain.queue) == (
        "after_close",
        "use_existing",
        "default",
    )
    assert (Plain.debounce, Plain.timeout) == (None, None)


def test_steps_keep_definition_order_and_options(forget):
    class Ordered(Workflow):
        @step
        def c(self, ctx): ...

        @step(retries=3, backoff=durable.seconds(2))
        def a(self, ctx): ...

        @step
        def b(self, ctx): ...

    forget(Ordered.name)
    assert [s.name for s in Ordered.steps] == ["c", "a", "b"]
    assert (Ordered.steps[0].retries, Ordered.steps[1].retries) == (0, 3)
    assert Ordered.steps[1].backoff == timedelta(seconds=2)


def test_backoff_grows_exponentially_and_is_capped(forget):
    class Backoff(Workflow):
        @step(retries=10, backoff=durable.seconds(1), max_backoff=durable.seconds(5))
        def work(self, ctx): ...

    forget(Backoff.name)
    delays = [Backoff.steps[0].delay_before(attempt) for attempt in range(2, 7)]
    assert delays == [timedelta(seconds=s) for s in (1, 2, 4, 5, 5)]


def test_a_subclass_inherits_its_bases_steps(forget):
    class Base(Workflow):
        abstract = True

        @step
        def first(self, ctx): ...

    class Child(Base):
        @step
        def second(self, ctx): ...

    forget(Child.name)
    assert [s.name for s in Child.steps] == ["first", "second"]
    with pytest.raises(LookupError):
        registry.get("base")


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"reuse": "sometimes"}, "reuse must be one of"),
        ({"reuse": None}, "reuse must be one of"),
        ({"on_duplicate": "ignore"}, "on_duplicate must be one of"),
        ({"on_duplicate": ("send_event", "")}, "on_duplicate must be one of"),
        ({"on_duplicate": ("send_event",)}, "on_duplicate must be one of"),
        ({"on_duplicate": "run_again", "reuse": "never"}, "cannot be used with reuse='never'"),
        ({"queue": ""}, "queue must be"),
        ({"timeout": "soon"}, "timeout"),
        ({"debounce": 30}, "debounce must be"),
    ],
)
def test_a_bad_policy_fails_at_class_creation(attrs, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        type("BadPolicy", (Workflow,), {"work": step(one_step), **attrs})
    with pytest.raises(LookupError):
        registry.get("bad_policy")


def test_a_workflow_without_steps_fails():
    with pytest.raises(ImproperlyConfigured, match="has no step"):

        class NoSteps(Workflow):
            def not_a_step(self, ctx): ...

    with pytest.raises(LookupError):
        registry.get("no_steps")


def test_two_workflows_with_one_name_fail():
    with pytest.raises(ImproperlyConfigured, match="two workflows are named 'process_article'"):

        class AnotherProcessArticle(Workflow):
            name = "process_article"
            work = step(one_step)

    # The first definition stays registered.
    assert registry.get("process_article") is testapp_workflows.ProcessArticle


@pytest.mark.parametrize(
    "options",
    [{"retries": -1}, {"retries": 1.5}, {"retries": True}, {"backoff": "1s"}],
)
def test_bad_step_options_fail(options):
    with pytest.raises(ImproperlyConfigured):
        step(**options)(one_step)


def test_a_compensation_must_be_a_method():
    with pytest.raises(ImproperlyConfigured, match="compensates with 'undo'"):
        type("Uncompensated", (Workflow,), {"work": step(compensate="undo")(one_step)})


def test_unregister_forgets_a_workflow(forget):
    class Temporary(Workflow):
        work = step(one_step)

    registry.unregister("temporary")
    with pytest.raises(LookupError):
        registry.get("temporary")


@pytest.mark.parametrize(
    "policy, stored",
    [
        ("use_existing", "use_existing"),
        ("error", "error"),
        ("cancel_existing", "cancel_existing"),
        ("run_again", "run_again"),
        (("send_event", "updated"), ("send_event", "updated")),
        (["send_event", "updated"], ("send_event", "updated")),
    ],
)
@pytest.mark.parametrize("reuse", ["after_close", "after_failure"])
def test_every_documented_policy_is_accepted(forget, policy, stored, reuse):
    cls = type(
        "Accepted", (Workflow,), {"work": step(one_step), "on_duplicate": policy, "reuse": reuse}
    )
    forget(cls.name)
    assert (cls.reuse, cls.on_duplicate) == (reuse, stored)
