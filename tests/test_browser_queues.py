# ruff: noqa: F811  (the fixtures imported from tests.browser are arguments here)
"""The Queues page, the overview's throughput chart and the workers' counts in
Debian's Chromium, at a desktop's width and a phone's (390 px): Pause → the
confirmation → the queue shown paused (and not claimed), then Resume; no page
wider than the screen. ``DURABLE_SCREENSHOTS=docs/img`` writes the docs' pictures
(queues.png, queue-confirm.png, throughput.png, workers.png)."""

import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry

import django_durable as durable
from django_durable import store
from django_durable.models import QueueState, Run, Status, WorkerNode
from django_durable.testing import drain
from tests.browser import chromium, login, shots, staff  # noqa: F401 (fixtures)
from tests.testapp.workflows_queues import Limited, RunsInOrder, Unlimited

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def traffic():
    """Runs due on two queues, and an hour of runs finished by two workers: a few
    a minute, some failed."""
    at = store.now()
    for worker in ("worker-a", "worker-b"):
        WorkerNode.objects.create(
            id=worker, hostname="app-1", pid=100, queues=[], concurrency=4, heartbeat_at=at
        )
    minute = at.replace(second=0, microsecond=0)
    for back in range(0, 60, 2):
        done = 2 + (back * 7) % 5
        failed = 1 if back % 12 == 4 else 0
        for n in range(done + failed):
            run_id = durable.start(RunsInOrder, {"n": back})
            Run.objects.filter(id=run_id).update(
                status=Status.FAILED if n < failed else Status.COMPLETED,
                finished_at=minute - timedelta(minutes=back, seconds=-n),
                due_at=None,
                worker_id="worker-a" if n % 3 else "worker-b",
            )
    limited = [durable.start(Limited, {"seconds": 0}) for _ in range(4)]
    durable.start(Unlimited, {"seconds": 0})
    return limited


def assert_not_wider_than_the_screen(page):
    widths = page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], (page.url, widths)


@pytest.mark.parametrize("width", [1280, 390])
def test_pause_confirm_see_it_paused_then_resume(
    chromium, live_server, staff, traffic, shots, width
):
    context, page = login(chromium, live_server, "staff", width=width, height=900)
    suffix = "" if width > 1000 else "-390"

    chart = page.locator("#throughput")
    assert "completed" in chart.locator(".durable-chart-summary").inner_text()
    assert chart.locator("svg g.durable-minute").count() == 60
    box = chart.locator("svg").bounding_box()
    assert box["width"] > 200 and box["x"] + box["width"] <= width
    assert_not_wider_than_the_screen(page)
    chart.screenshot(path=str(shots / f"throughput{suffix}.png"))
    chart.locator("summary", has_text="Numbers per minute").click()
    assert chart.locator("table tbody tr").count() == 30  # every other minute
    assert_not_wider_than_the_screen(page)

    page.click("nav.durable-tabs >> text=Queues")
    page.wait_for_url(re.compile(r"/admin/durable/queues/$"))
    row = page.locator("#queues-table tr[data-queue=limited]")
    assert row.locator(".durable-queue-state").inner_text() == "running"
    assert row.locator("td").nth(1).inner_text() == "4"  # due
    assert_not_wider_than_the_screen(page)

    row.locator("a", has_text="Pause").click()
    page.wait_for_url(re.compile(r"/admin/durable/queues/limited/pause/$"))
    assert page.locator("h2", has_text="Pause queue").is_visible()
    assert not QueueState.objects.exists()  # nothing happens before the confirmation
    assert_not_wider_than_the_screen(page)
    page.fill("input[name=reason]", "partner API down")
    page.locator(".durable-confirm").screenshot(path=str(shots / f"queue-confirm{suffix}.png"))
    page.click("input[type=submit][value='Yes, pause']")
    page.wait_for_url(re.compile(r"/admin/durable/queues/$"))
    assert "is paused" in page.locator("ul.messagelist li.success").inner_text()
    row = page.locator("#queues-table tr[data-queue=limited]")
    assert row.locator(".durable-queue-state").inner_text() == "paused"
    assert row.locator("a", has_text="Resume").is_visible()
    assert_not_wider_than_the_screen(page)
    page.screenshot(path=str(shots / f"queues{suffix}.png"), full_page=True)
    entry = LogEntry.objects.get()
    assert entry.object_id == "limited" and "Reason: partner API down" in entry.change_message

    drain(max_seconds=5)  # the other queue runs; the paused one waits
    assert Run.objects.filter(queue="other", status=Status.COMPLETED).count() == 1
    assert Run.objects.filter(id__in=traffic, status=Status.PENDING).count() == 4

    row.locator("a", has_text="Resume").click()
    page.wait_for_url(re.compile(r"/admin/durable/queues/limited/resume/$"))
    page.click("input[type=submit][value='Yes, resume']")
    page.wait_for_url(re.compile(r"/admin/durable/queues/$"))
    row = page.locator("#queues-table tr[data-queue=limited]")
    assert row.locator(".durable-queue-state").inner_text() == "running"
    drain(max_seconds=5)
    assert Run.objects.filter(id__in=traffic, status=Status.COMPLETED).count() == 4

    page.click("nav.durable-tabs >> text=Workers")
    page.wait_for_url(re.compile(r"/admin/durable/workers/$"))
    done = page.locator("#worker-worker-a .durable-worker-done").inner_text()
    assert int(done) == Run.objects.filter(worker_id="worker-a", status=Status.COMPLETED).count()
    assert_not_wider_than_the_screen(page)
    page.screenshot(path=str(shots / f"workers{suffix}.png"), full_page=True)
    context.close()
