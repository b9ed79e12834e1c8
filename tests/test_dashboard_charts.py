"""The overview's throughput chart and the workers page's counts, for runs finished
at known minutes by known workers (finished_at and worker_id set in the database:
the controlled clock)."""

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils.timezone import localtime

import django_durable as durable
from django_durable import stats, store
from django_durable.dashboard import charts
from django_durable.models import Run, Status, WorkerNode
from tests.testapp.workflows_queues import RunsInOrder

pytestmark = pytest.mark.django_db

MINUTE = timedelta(minutes=1)


def finished(status: str, at, worker: str | None = None) -> None:
    run_id = durable.start(RunsInOrder, {"n": 0})
    Run.objects.filter(id=run_id).update(
        status=status, finished_at=at, due_at=None, worker_id=worker
    )


def known_minutes() -> tuple[list[dict], object]:
    """Runs finished at known minutes of the last hour and outside it; returns
    stats.throughput() and the first minute it covers. Made again if the clock
    passed a minute while they were made (the hour would have moved)."""
    for _ in range(3):
        Run.objects.all().delete()
        first = stats.throughput()[0]["at"]
        for _ in range(3):
            finished(Status.COMPLETED, first + 55 * MINUTE + timedelta(seconds=10))
        finished(Status.FAILED, first + 55 * MINUTE + timedelta(seconds=59))
        finished(Status.COMPLETED, first + timedelta(seconds=1))
        finished(Status.COMPLETED, first)  # the first instant of the hour counts
        finished(Status.COMPENSATED, first + 59 * MINUTE)  # the current minute
        finished(Status.COMPENSATION_FAILED, first + 30 * MINUTE)
        finished(Status.CANCELLED, first + 30 * MINUTE)  # neither
        finished(Status.COMPLETED, first - timedelta(microseconds=1))  # before the hour
        finished(Status.FAILED, first - 10 * MINUTE)
        buckets = stats.throughput()
        if buckets[0]["at"] == first:
            return buckets, first
    raise AssertionError("the minute kept changing")


def test_throughput_counts_completed_and_failed_per_minute():
    buckets, first = known_minutes()
    assert len(buckets) == 60
    assert [b["at"] for b in buckets] == [first + MINUTE * i for i in range(60)]
    busy = {
        i: (b["completed"], b["failed"])
        for i, b in enumerate(buckets)
        if b != {**b, "completed": 0, "failed": 0}
    }
    assert busy == {0: (2, 0), 30: (0, 1), 55: (3, 1), 59: (0, 1)}
    assert first <= store.now() < first + 60 * MINUTE


def test_the_chart_draws_each_minute_to_scale_with_its_numbers_as_text(admin_client):
    _, first = known_minutes()
    chart = charts.throughput()
    assert (chart.completed, chart.failed, chart.peak) == (5, 3, 4)
    assert chart.failure_percent == 37.5
    busiest = chart.minutes[55]
    assert busiest.completed_height == 75 and busiest.failed_height == 25
    assert busiest.failed_y == 0 and busiest.completed_y == 25
    assert chart.minutes[0].completed_height == 50 and chart.minutes[1].completed_height == 0

    html = admin_client.get(reverse("django_durable:overview")).content.decode()
    label = localtime(first + 55 * MINUTE).strftime("%H:%M")
    assert f"<title>{label}: 3 completed, 1 failed</title>" in html
    assert html.count('<g class="durable-minute">') == 60
    assert 'role="img" aria-labelledby="throughput-title throughput-desc"' in html
    assert "<strong>5</strong> completed, <strong>3</strong> failed (37.5% failed)" in html
    table = html.split("Numbers per minute", 1)[1].split("</table>", 1)[0]
    assert table.count("<tr>") == 1 + 4  # the header and the four busy minutes
    assert f"{label}</time></th><td>3</td><td>1</td>" in table


def test_the_chart_says_when_nothing_finished(admin_client):
    html = admin_client.get(reverse("django_durable:overview")).content.decode()
    assert "No run completed or failed in the last 60 minutes." in html
    assert "None in the last hour." in html


def test_the_chart_keeps_its_numbers_unlocalized(admin_client, settings):
    """A German admin writes 75,0 for 75.0: never inside the SVG's coordinates."""
    settings.LANGUAGE_CODE = "de"
    known_minutes()
    html = admin_client.get(reverse("django_durable:overview")).content.decode()
    svg = html.split('<svg class="durable-throughput-chart"', 1)[1].split("</svg>", 1)[0]
    numbers = re.findall(r' (?:x|y|width|height)="([^"]*)"', svg)
    assert len(numbers) > 240 and "75.0" in numbers
    assert all(re.fullmatch(r"[0-9]+(\.[0-9]+)?", n) for n in numbers), numbers
    assert all("," not in left for left in re.findall(r"left: ([^%]*)%", html))
    assert "(37,5% failed)" in html  # the text is German


def test_workers_page_counts_the_runs_each_worker_finished_in_the_last_hour(admin_client):
    at = store.now()
    for worker in ("w-busy", "w-idle"):
        WorkerNode.objects.create(id=worker, hostname="h", pid=1, queues=[], heartbeat_at=at)
    for _ in range(4):
        finished(Status.COMPLETED, at - timedelta(minutes=1), "w-busy")
    finished(Status.FAILED, at - timedelta(minutes=59), "w-busy")
    finished(Status.COMPLETED, at - timedelta(minutes=61), "w-busy")  # outside the hour
    finished(Status.CANCELLED, at, "w-busy")
    finished(Status.COMPLETED, at, "w-gone-long-ago")
    assert stats.worker_counts(["w-busy", "w-idle"]) == {"w-busy": {"completed": 4, "failed": 1}}

    html = admin_client.get(reverse("django_durable:workers")).content.decode()
    busy = html.split('id="worker-w-busy"', 1)[1].split("</tr>", 1)[0]
    idle = html.split('id="worker-w-idle"', 1)[1].split("</tr>", 1)[0]
    assert '<td class="durable-worker-done">4</td>' in busy
    assert '<td class="durable-worker-failed"><strong>1</strong></td>' in busy
    assert '<td class="durable-worker-done">0</td>' in idle
    assert "in the last hour" in html and "Done, 1 h" in html


@pytest.mark.parametrize("workers", [2, 20])
def test_the_workers_page_makes_a_fixed_number_of_queries(
    admin_client, django_assert_num_queries, workers
):
    at = store.now()
    for n in range(workers):
        WorkerNode.objects.create(id=f"w{n}", hostname="h", pid=n, queues=[], heartbeat_at=at)
        finished(Status.COMPLETED, at, f"w{n}")
        finished(Status.FAILED, at, f"w{n}")
    admin_client.get(reverse("django_durable:overview"))  # the first request's checks
    # session, user, the workers, the runs they hold, their finished runs, and the
    # live workers (a worker of every queue is live: no queue to look into).
    with django_assert_num_queries(6):
        html = admin_client.get(reverse("django_durable:workers")).content.decode()
    assert html.count('<td class="durable-worker-done">1</td>') == workers
