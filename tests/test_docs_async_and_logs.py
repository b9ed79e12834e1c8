"""The examples of docs/async-steps.md and of the "Step logs" section of
docs/observability.md run as written."""

import re
import textwrap
from pathlib import Path

import pytest

import django_durable as durable
from django_durable.models import StepAttempt
from django_durable.testing import drain
from django_durable.workflows.definition import registry

DOCS = Path(__file__).resolve().parent.parent / "docs"
WORKER_RAN_IT = "# ...once a worker ran it:"


def python_blocks(page: str, section: str | None = None) -> list[str]:
    text = (DOCS / page).read_text()
    if section is not None:
        text = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.finditer(r"^( *)```python\n(.*?)^\1```", text, re.S | re.M)
    return [textwrap.dedent(m.group(2)) for m in blocks]


@pytest.fixture
def namespace():
    names = {w.name for w in registry.all()}
    yield {"__name__": "docs_example"}
    for name in {w.name for w in registry.all()} - names:
        registry.unregister(name)


@pytest.mark.django_db
def test_the_async_steps_example_runs(namespace):
    definition, starting = python_blocks("async-steps.md")
    exec(definition, namespace)
    exec(starting, namespace)
    run_id = namespace["run_id"]
    drain()
    assert durable.get_run(run_id).waiting_for == "event:reviewed"
    durable.send_event(run_id, "reviewed", "looks good")
    drain()
    run = durable.get_run(run_id)
    assert (run.status, run.result) == ("completed", "looks good")
    fetch = StepAttempt.objects.get(run_id=run_id, step="fetch")
    assert fetch.output == [200, 200, 200]
    assert [(r["logger"], r["message"]) for r in fetch.logs] == [
        ("docs_example", "fetched 3 feeds")
    ]


@pytest.mark.django_db
def test_the_step_logs_example_runs(namespace):
    definition, reading, logging_setting = python_blocks("observability.md", "Step logs")
    exec(definition, namespace)
    before, after = reading.split(WORKER_RAN_IT)
    exec(before, namespace)
    drain()
    exec(after, namespace)
    (record,) = namespace["attempt"].logs
    assert (record["level"], record["logger"], record["message"]) == (
        "WARNING",
        "shop.invoices",
        "reminding customer 42 (attempt 1)",
    )
    exec(logging_setting, namespace)
    assert namespace["LOGGING"]["loggers"]["shop"] == {"level": "INFO"}
