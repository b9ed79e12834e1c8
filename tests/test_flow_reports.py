"""What an operator sees of flow control: ``flow_stats``, ``explain_run`` (its reasons
in their order), ``manage.py durable flow`` and ``inspect``, the dashboard's run page
and a workflow's flow keys, the system check, and the tasks backend's flow keys."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

import django_durable as durable
from django_durable import checks, store
from django_durable.models import Run, Status, WorkerNode
from django_durable.operations.flow import claim_limits
from django_durable.testing import drain
from tests.testapp.workflows import WaitsForEvent
from tests.testapp.workflows_flow import OnePerTenant, PerTenant, RatedPerTenant, Turns

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = timedelta(minutes=1)


def claim(queues=("flow",), limit=10):
    return store.claim(
        worker_id="w-1", queues=list(queues), limit=limit, lease=LEASE, flow_limits=claim_limits()
    )


def live_worker(queues=()):
    WorkerNode.objects.create(
        id="w-1", hostname="h", pid=1, queues=list(queues), heartbeat_at=store.now()
    )


def test_flow_stats_per_key_most_due_first():
    for _ in range(3):
        durable.start(PerTenant, {"tenant": "a"})
    durable.start(PerTenant, {"tenant": "b"})
    claim(limit=1)
    # Started after the claim, which could have taken it (runs without a flow key take
    # their turn as one more key): a run without a flow key is not listed.
    durable.start(PerTenant, {})
    stats = durable.flow_stats("per_tenant")
    assert [row["flow_key"] for row in stats] == ["tenant:a", "tenant:b"] or [
        row["flow_key"] for row in stats
    ] == ["tenant:a", "tenant:b"][::-1]
    by_key = {row["flow_key"]: row for row in stats}
    assert by_key["tenant:a"]["concurrency_limit"] == 2
    assert by_key["tenant:a"]["rate_limit"] is None
    assert by_key["tenant:a"]["started_in_window"] is None
    assert by_key["tenant:a"]["next_start_at"] is None
    assert sum(row["running"] for row in stats) == 1
    assert sum(row["due"] for row in stats) == 3
    assert stats[0]["due"] >= stats[-1]["due"]
    assert durable.flow_stats(PerTenant, limit=1) == stats[:1]
    with pytest.raises(ValueError):
        durable.flow_stats(PerTenant, limit=0)


def test_flow_stats_says_when_a_rate_lets_the_next_begin():
    for _ in range(7):
        durable.start(RatedPerTenant, {"tenant": 1})
    claim()
    [row] = durable.flow_stats(RatedPerTenant)
    assert row["started_in_window"] == 5 and row["rate_limit"] == 5 and row["due"] == 2
    assert row["next_start_at"] is not None and row["next_start_at"] > store.now()


def test_explain_run_names_the_first_reason_in_the_contracts_order(settings):
    live_worker()
    first = durable.start(OnePerTenant, {"tenant": "k"})
    second = durable.start(OnePerTenant, {"tenant": "k"})
    claim(limit=1)
    assert durable.explain_run(first) == "Running on worker w-1."
    assert durable.explain_run(second) == (
        "Its flow key 'tenant:k' is at its limit (1 of 1 running)."
    )
    # A paused queue comes before the limit; a later due time before both.
    durable.pause_queue("flow")
    assert durable.explain_run(second) == "Its queue 'flow' is paused."
    Run.objects.filter(id=second).update(due_at=store.now() + timedelta(hours=1))
    assert durable.explain_run(second).startswith("Not due until ")
    durable.resume_queue("flow")
    Run.objects.filter(id=first).update(
        status=Status.COMPLETED, finished_at=store.now(), worker_id=None, lease_expires_at=None
    )
    assert durable.explain_run(first).startswith("Finished: completed")
    # The rate, with the time of the next begin.
    for _ in range(6):
        durable.start(RatedPerTenant, {"tenant": "r"})
    claim()
    held = Run.objects.get(workflow="rated_per_tenant", status=Status.PENDING)
    sentence = durable.explain_run(held.id)
    assert sentence.startswith("Its flow key 'tenant:r' is at its rate (5 per 2 s): next begin at")
    # No live worker serves the queue.
    WorkerNode.objects.all().delete()
    lone = durable.start(Turns, {})
    assert "No live worker serves its queue 'turns'" in durable.explain_run(lone)
    waiting = durable.start(WaitsForEvent, {})
    live_worker()
    drain()
    assert durable.explain_run(waiting).startswith("Waiting for the event")


def test_the_command_line_prints_flow_stats_and_the_sentence():
    for _ in range(3):
        durable.start(OnePerTenant, {"tenant": "cli"})
    [run] = claim(limit=1)
    out = StringIO()
    call_command("durable", "flow", "one_per_tenant", "--json", stdout=out)
    [row] = json.loads(out.getvalue())
    assert row["flow_key"] == "tenant:cli" and row["running"] == 1 and row["due"] == 2
    out = StringIO()
    call_command("durable", "flow", "one_per_tenant", stdout=out)
    assert "tenant:cli" in out.getvalue()
    out = StringIO()
    call_command("durable", "inspect", str(run.id), stdout=out)
    assert "Running on worker w-1." in out.getvalue() and "tenant:cli" in out.getvalue()


def test_the_run_page_and_the_workflow_page_show_flow_control(admin_client):
    live_worker()
    for _ in range(2):
        durable.start(OnePerTenant, {"tenant": "<b>dash</b>"})
    keyless = durable.start(Turns, {"seconds": 0})  # a flow key function, no limit
    [running] = claim(limit=1)
    held = Run.objects.get(workflow="one_per_tenant", status=Status.PENDING)
    html = admin_client.get(reverse("django_durable:run", args=[held.id])).content.decode()
    assert "is at its limit (1 of 1 running)" in html
    assert "<b>dash</b>" not in html and "&lt;b&gt;dash&lt;/b&gt;" in html
    html = admin_client.get(reverse("django_durable:run", args=[running.id])).content.decode()
    assert "Running on worker w-1." in html
    page = admin_client.get(reverse("django_durable:workflow", args=["one_per_tenant"]))
    html = page.content.decode()
    assert 'id="flow-keys"' in html and "1 / 1" in html and "1 running per key" in html
    # A workflow with a flow key and no limit at all: no None shown as a limit.
    html = admin_client.get(reverse("django_durable:run", args=[keyless])).content.decode()
    assert "None" not in html.split('id="run-now"')[1].split("</td>")[0]
    page = admin_client.get(reverse("django_durable:workflow", args=["turns"]))
    assert page.status_code == 200 and "a flow key, no limit" in page.content.decode()


def test_many_flow_keys_make_a_bounded_page(admin_client):
    durable.start_many(PerTenant, [({"tenant": n}, None) for n in range(300)])
    page = admin_client.get(reverse("django_durable:workflow", args=["per_tenant"]))
    html = page.content.decode()
    assert html.count("tenant:") < 120 and "durable flow per_tenant" in html
    assert len(page.content) < 500_000


def test_a_flow_declaration_set_afterwards_is_a_system_check_error(monkeypatch):
    monkeypatch.setattr(PerTenant, "concurrency_per_key", 0)
    errors = checks.check_workflow_flow_control()
    assert [e.id for e in errors] == ["django_durable.E040"]
    assert "per_tenant" in errors[0].msg


def test_a_task_declares_its_flow_key_from_its_arguments():
    from tests.testapp.tasks import tenant_report

    result = tenant_report.enqueue(7)
    assert Run.objects.get(id=result.id).flow_key == "tenant:7"


def test_metrics_count_held_back_runs_per_workflow_and_their_wait():
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from django_durable import telemetry
    from tests.test_metrics import attrs, points

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    telemetry.install(meter_provider=provider)
    try:
        for tenant in ("a", "b"):
            for _ in range(3):
                durable.start(OnePerTenant, {"tenant": tenant})
        assert len(claim()) == 2
        held = points(reader, "durable.flow.held")
        assert {k: p.value for k, p in held.items()}.get(attrs(workflow="one_per_tenant")) == 4
        assert all(len(k) == 1 for k in held)  # by workflow only: no flow key label
        wait = points(reader, "durable.flow.wait")
        assert wait[attrs(workflow="one_per_tenant", queue="flow")].count == 2
    finally:
        telemetry.install()
        provider.shutdown()
