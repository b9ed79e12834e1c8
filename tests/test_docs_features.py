"""The examples of docs/queues.md, of the start_many and explain sections of
docs/keys.md and of "Context values", "Waiting for several events" and "Asking a
person" in docs/waits-and-updates.md run as written."""

import pytest
from django.utils import timezone

import django_durable as durable
from django_durable.testing import drain
from django_durable.workflows.definition import registry
from tests.test_docs_async_and_logs import python_blocks
from tests.testapp.workflows import ProcessArticle

pytestmark = pytest.mark.django_db


@pytest.fixture
def namespace():
    names = {w.name for w in registry.all()}
    yield {"__name__": "docs_example", "durable": durable, "ProcessArticle": ProcessArticle}
    for name in {w.name for w in registry.all()} - names:
        registry.unregister(name)


def test_the_queues_examples_run(namespace, capsys):
    ordering, pausing, stats = python_blocks("queues.md")[:3]
    exec(ordering, namespace)
    assert durable.get_run(namespace["later"]).due_at > timezone.now()
    drain()
    done = [durable.get_run(namespace[n]).finished_at for n in ("urgent", "receipt", "newsletter")]
    assert done == sorted(done)  # priority 50, then 10, then 0
    exec(pausing, namespace)
    exec(stats, namespace)
    assert "emails False" in capsys.readouterr().out


def test_the_start_many_and_explain_examples_run(namespace, capsys):
    many = python_blocks("keys.md", "Many starts at once: `start_many`")
    asking = python_blocks("keys.md", "Asking first: `explain`")
    exec(many[0], namespace)
    exec(asking[0], namespace)
    printed = capsys.readouterr().out
    assert printed.startswith("key_taken ") and "on_duplicate='error' raises KeyTaken" in printed


def test_the_context_values_example_runs(namespace):
    [example] = python_blocks("waits-and-updates.md", "Context values")
    exec("from django_durable import Workflow, step\n" + example, namespace)
    run_id = durable.start(namespace["CountWords"])
    drain()
    run = durable.get_run(run_id)
    assert run.result == 2
    assert run.context == {"log": ["counted"], "words": 2, "lang": "en", "checked": True}


def test_the_several_events_example_runs(namespace):
    definition, sending = python_blocks("waits-and-updates.md", "Waiting for several events")
    exec(definition, namespace)
    exec(sending, namespace)
    review = durable.get_run(namespace["review"])
    assert review.result == {"decision": "rejected", "note": {"why": "off topic"}}
    order = durable.get_run(namespace["order"])
    assert order.result == {"ready": {"paid": {"eur": 30}, "packed": {"box": "M"}}}


def test_the_input_kinds_example_runs(namespace, capsys):
    section = "Asking a person: input kinds"
    definition, answering = python_blocks("waits-and-updates.md", section)
    exec(definition, namespace)
    exec(answering, namespace)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "sign_off approval Publish post 5?"
    assert "an approval input takes true or false" in printed[1]
    post = durable.get_run(namespace["post"])
    assert post.result == {"published": True, "tags": ["django", "ops"]}
