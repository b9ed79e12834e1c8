"""What the dashboard says of flow limits, with runs claimed as a worker claims them:
the workflow page's *Next start* per flow key (why not now, and until when), the
Queues page's due runs held back by flow limits apart from the claimable ones, the
rate's time rounded up (never early), and the runs search by flow key."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

import django_durable as durable
from django_durable import store
from django_durable.operations.flow import claim_limits
from django_durable.operations.flow_holds import ceil_second
from tests.testapp.workflows_flow import FewAtOnce, OnePerTenant, PerTenant, RatedPerTenant

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = timedelta(minutes=1)
QUEUES = reverse("django_durable:queues")


def claim(limit=10):
    return store.claim(
        worker_id="w-1", queues=["flow"], limit=limit, lease=LEASE, flow_limits=claim_limits()
    )


def next_starts(admin_client, workflow: str) -> dict[str, str]:
    """The workflow page's flow keys: key -> the Next start cell's text."""
    html = admin_client.get(reverse("django_durable:workflow", args=[workflow])).content.decode()
    section = html.split('id="flow-keys"', 1)[1].split("</table>", 1)[0]
    found = {}
    for row in section.split("<tr>")[2:]:
        key = re.search(r'title="([^"]*)"', row).group(1)
        cell = row.split('class="durable-next-start">', 1)[1].split("</td>", 1)[0]
        found[key] = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", cell)).strip()
    return found


def queue_row(admin_client, queue: str) -> str:
    html = admin_client.get(QUEUES).content.decode()
    return html.split(f'data-queue="{queue}"', 1)[1].split("</tr>", 1)[0]


def cell(row: str, name: str) -> str:
    return re.sub(r"<[^>]+>", "", row.split(f'class="{name}">', 1)[1].split("</td>", 1)[0])


def test_next_start_says_why_a_key_at_its_limit_waits(admin_client):
    for tenant in ("a", "a", "b"):
        durable.start(OnePerTenant, {"tenant": tenant})
    assert len(claim()) == 2  # a's first and b's only run
    durable.start(OnePerTenant, {"tenant": "c"})
    shown = next_starts(admin_client, "one_per_tenant")
    assert shown["tenant:a"] == "when one of its runs finishes (1 of 1 running)"
    assert shown["tenant:b"] == "nothing due"
    assert shown["tenant:c"] == "now"


def test_next_start_says_when_the_workflow_is_at_its_concurrency(admin_client):
    for tenant in ("a", "b", "c", "c"):
        durable.start(FewAtOnce, {"tenant": tenant})
    assert len(claim()) == 2  # FewAtOnce.concurrency
    shown = next_starts(admin_client, "few_at_once")
    due = [text for text in shown.values() if text != "nothing due"]
    assert due and all(
        text == "when a run of the workflow finishes (workflow at its concurrency, 2 of 2 running)"
        for text in due
    ), shown
    assert "now" not in shown.values()


def test_next_start_of_a_rate_is_its_time_rounded_up(admin_client):
    for _ in range(7):
        durable.start(RatedPerTenant, {"tenant": 1})
    assert len(claim()) == 5  # RatedPerTenant's 5 per 2 s
    [row] = durable.flow_stats(RatedPerTenant)
    at = row["next_start_at"]
    up = timezone.localtime(ceil_second(at))
    assert up >= at and up - at < timedelta(seconds=1)
    shown = next_starts(admin_client, "rated_per_tenant")["tenant:1"]
    assert shown.startswith("at its rate (5 of 5 begun) ")
    assert up.strftime("%Y-%m-%d %H:%M:%S") in shown
    # The run page's sentence names the same second, never the one before.
    held = durable.list_executions(workflow=RatedPerTenant, status="pending")[0]
    sentence = durable.explain_run(held.id)
    assert f"next begin at {up.strftime('%Y-%m-%d %H:%M:%S')}" in sentence, sentence


def test_a_time_already_whole_is_not_moved():
    at = timezone.now().replace(microsecond=0)
    assert ceil_second(at) == at
    assert ceil_second(at + timedelta(microseconds=1)) == at + timedelta(seconds=1)


def test_the_queues_page_holds_flow_limited_runs_apart_from_claimable(admin_client):
    for tenant in ("a", "a", "a", "b"):
        durable.start(OnePerTenant, {"tenant": tenant})
    for tenant in ("x", "y"):
        durable.start(PerTenant, {"tenant": tenant})
    assert len(claim(limit=3)) == 3
    # Due now: a's two left (held by concurrency_per_key 1), and of per_tenant's two
    # the one not claimed (its key has room): claimable.
    assert durable.queue_stats("flow")[0]["due"] == 3
    row = queue_row(admin_client, "flow")
    assert cell(row, "durable-claimable") == "1"
    assert cell(row, "durable-held") == "2 of one_per_tenant"
    link = reverse("django_durable:workflow", args=["one_per_tenant"]) + "#flow-keys"
    assert f'href="{link}"' in row


def test_the_queues_page_counts_a_workflow_at_its_concurrency(admin_client):
    for tenant in ("a", "b", "c", "d", "e"):
        durable.start(FewAtOnce, {"tenant": tenant})
    assert len(claim()) == 2
    row = queue_row(admin_client, "flow")
    assert cell(row, "durable-claimable") == "0"
    assert cell(row, "durable-held") == "3 of few_at_once"


def test_the_queues_page_without_flow_limits_holds_nothing(admin_client):
    for tenant in ("a", "b"):
        durable.start(PerTenant, {"tenant": tenant})
    row = queue_row(admin_client, "flow")
    assert cell(row, "durable-claimable") == "2" and cell(row, "durable-held") == "0"


@pytest.mark.parametrize("term", ["flow:tenant:7", "flow_key:tenant:7", 'flow:"tenant:7"'])
def test_runs_are_searched_by_flow_key(admin_client, term):
    wanted = {durable.start(PerTenant, {"tenant": 7}) for _ in range(2)}
    other = durable.start(PerTenant, {"tenant": 77})
    durable.start(PerTenant, {})  # no flow key
    page = admin_client.get(reverse("django_durable:runs"), {"q": term})
    html = page.content.decode()
    assert all(str(run_id) in html for run_id in wanted)
    assert str(other) not in html
    # The admin's own Run list understands the same.
    html = admin_client.get("/admin/django_durable/run/", {"q": term}).content.decode()
    assert all(str(run_id) in html for run_id in wanted) and str(other) not in html
