"""What a new user sees on the dashboard in the first minutes (issue 32, cases 5 and
10), through Django's test client: runs of a workflow no live worker knows, times
ahead said as ahead, a failed run's error first, keys in natural order, stopped
workers kept for a day. Layout (widths, wrapping, the buttons' style) is checked in
a browser: test_browser_first_hour.py."""

import re
from datetime import timedelta

import pytest
from django.template import Context, Template
from django.urls import reverse
from django.utils import timezone

import django_durable as durable
from django_durable import store
from django_durable.models import Run, Schedule, WorkerNode
from django_durable.runtime import maintenance
from django_durable.testing import drain

pytestmark = pytest.mark.django_db


def get(client, name, *args, **params):
    response = client.get(reverse(f"django_durable:{name}", args=args), params)
    assert response.status_code == 200, response.content[:800]
    return response.content.decode()


def text(html: str) -> str:
    """The page's words, tags dropped, spaces squeezed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


# --- runs of a workflow no live worker knows (case 5) --------------------------------


def a_worker_that_knows(*workflows, id="old-code", queues=()):
    return WorkerNode.objects.create(
        id=id,
        hostname="box",
        pid=7,
        queues=list(queues),
        workflows=list(workflows),
        heartbeat_at=store.now(),
    )


def test_the_overview_names_a_workflow_no_live_worker_knows_and_its_runs(admin_client):
    a_worker_that_knows("sync_account")
    runs = [durable.start("process_article", {"id": n}, key=f"article:{n}") for n in range(3)]
    durable.start("sync_account", {}, key="account:1")
    html = get(admin_client, "overview")
    assert 'id="unknown-workflows"' in html
    banner = text(html[html.index('id="unknown-workflows"') :].split("</p>")[0])
    assert "process_article (3 pending runs)" in banner and "its runs stay pending" in banner
    assert "sync_account" not in banner
    assert "restart" in banner and "new workflow code" in banner

    page = text(get(admin_client, "run", runs[0]))
    assert "No live worker knows workflow process_article" in page
    assert "restart them" in page.lower()
    known = text(get(admin_client, "run", Run.objects.get(key="account:1").id))
    assert "No live worker knows" not in known


def test_no_banner_when_a_live_worker_knows_every_workflow(admin_client):
    a_worker_that_knows("sync_account")
    WorkerNode.objects.create(
        id="new-code", hostname="box", pid=8, queues=[], workflows=None, heartbeat_at=store.now()
    )
    durable.start("process_article", {"id": 1}, key="article:1")
    assert 'id="unknown-workflows"' not in get(admin_client, "overview")


def test_a_prefix_the_worker_serves_counts_as_known(admin_client):
    a_worker_that_knows("process_*")
    durable.start("process_article", {"id": 1}, key="article:1")
    assert 'id="unknown-workflows"' not in get(admin_client, "overview")


def test_a_worker_of_another_queue_does_not_count(admin_client):
    a_worker_that_knows("process_article", queues=["other"])
    run_id = durable.start("process_article", {"id": 1}, key="article:1")
    # No live worker takes the default queue at all: the queue banner says so instead.
    html = get(admin_client, "overview")
    assert 'id="unknown-workflows"' not in html and "no live worker takes it" in html
    assert "No live worker knows" not in text(get(admin_client, "run", run_id))


# --- times ahead said as ahead (case 10) ------------------------------------------------


def render_when(at):
    return Template("{% include 'django_durable/_when.html' %}").render(Context({"at": at}))


def test_a_time_ahead_is_said_as_ahead_and_a_past_one_as_past():
    now = timezone.now()
    ahead = text(render_when(now + timedelta(days=2, minutes=1)))
    assert "in 2 days" in ahead and "ago" not in ahead
    past = text(render_when(now - timedelta(hours=3, minutes=1)))
    assert "3 hours ago" in past and " in " not in past
    assert "ago" not in text(render_when(now + timedelta(seconds=20)))
    assert "in less than a minute" in text(render_when(now + timedelta(seconds=20)))
    assert "less than a minute ago" in text(render_when(now - timedelta(seconds=20)))
    # The absolute time is on hover.
    assert re.search(r'title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d', render_when(now))


def test_a_schedules_next_fire_is_ahead(admin_client):
    durable.schedule("sync_account", "0 3 * * *", name="nightly")
    Schedule.objects.filter(name="nightly").update(
        next_fire_at=timezone.now() + timedelta(days=2, minutes=1)
    )
    rows = get(admin_client, "schedules").split("<tr")
    (row,) = [text(r) for r in rows if 'title="nightly">nightly</span>' in r]
    assert "in 2 days" in row and "ago" not in row


def test_an_inputs_timeout_and_a_runs_due_time_are_ahead(admin_client):
    run_id = durable.start("waits_for_approval", {"timeout": 2 * 24 * 3600 + 60})
    drain()
    assert durable.get_run(run_id).status == "waiting"
    pending = text(get(admin_client, "inputs"))
    assert "times out" in pending
    assert re.search(r"times out \S+ \S+ \(in 2 days\)", pending), pending
    due = text(get(admin_client, "run", run_id)).split(" Due ")[1][:60]
    assert "in 2 days" in due and "ago" not in due


# --- a failed run's error first (case 10) ---------------------------------------------


def test_a_failed_runs_error_is_at_the_top_of_its_page(admin_client):
    run_id = durable.start("sync_account", {"fail": True}, key="account:broken")
    drain()
    html = get(admin_client, "run", run_id)
    error = html.index('id="run-error"')
    assert error < html.index("durable-summary") and error < html.index('id="attempts"')
    assert "RuntimeError: sync failed" in html[error : error + 600]


# --- keys in natural order (case 10) ----------------------------------------------------


def test_keys_are_listed_in_natural_order(admin_client):
    for n in (11, 2, 1, 10, 3):
        durable.start("process_article", {"id": n}, key=f"article:{n}")
    html = get(admin_client, "keys")
    shown = re.findall(r"article:\d+", html[html.index('id="keys-table"') :])
    assert list(dict.fromkeys(shown)) == [f"article:{n}" for n in (1, 2, 3, 10, 11)]
    html = get(admin_client, "workflow", "process_article")
    keys = html[html.index('id="keys"') : html.index("All keys of")]
    shown = re.findall(r"article:\d+", keys)
    assert list(dict.fromkeys(shown)) == [f"article:{n}" for n in (1, 2, 3, 10, 11)]


# --- stopped workers shown as gone for a day (case 10) -------------------------------------


def test_a_worker_that_stopped_cleanly_stays_on_the_workers_page_as_stopped(admin_client):
    stale = store.now() - timedelta(hours=1)
    assert store.register_worker(
        "leaving", hostname="box", pid=9, queues=[], concurrency=2, stale_before=stale
    )
    store.unregister_worker("leaving")
    node = WorkerNode.objects.get(id="leaving")
    assert node.stopping
    # Some time after its last heartbeat, the page says it stopped and when.
    WorkerNode.objects.filter(id="leaving").update(heartbeat_at=store.now() - timedelta(minutes=5))
    row = text(get(admin_client, "workers").split('id="worker-leaving"')[1].split("</tr>")[0])
    assert "stopped" in row and "shut down cleanly" in row and "5 minutes ago" in row
    # The same id may register again at once.
    assert store.register_worker(
        "leaving", hostname="box", pid=10, queues=[], concurrency=2, stale_before=stale
    )


def test_a_worker_that_vanished_is_shown_as_gone_and_forgotten_after_a_day(admin_client):
    WorkerNode.objects.create(
        id="vanished",
        hostname="box",
        pid=9,
        queues=[],
        heartbeat_at=store.now() - timedelta(hours=2),
    )
    WorkerNode.objects.create(
        id="ancient",
        hostname="box",
        pid=9,
        queues=[],
        heartbeat_at=store.now() - timedelta(hours=25),
    )
    html = get(admin_client, "workers")
    row = text(html.split('id="worker-vanished"')[1].split("</tr>")[0])
    assert "gone" in row and "stopped heartbeating" in row and "2 hours ago" in row
    assert "stay listed for 24 hours" in text(html)
    store.forget_dead_workers(store.now() - maintenance.FORGET_AFTER)
    assert set(WorkerNode.objects.values_list("id", flat=True)) == {"vanished"}
    assert maintenance.FORGET_AFTER == store.WORKERS_KEPT == timedelta(hours=24)
