"""The dashboard's newer pages and guarantees, with Django's test client: the
timeline and flow graph, pending inputs, schedules, workers, bulk actions,
bounded pages, searches and values, the htmx answer to an expired session and
the system checks. Who may see and do what, URL by URL: test_dashboard_guards.py."""

import json
import logging
import re
import uuid

import pytest
from django.contrib.admin.models import LogEntry
from django.core.checks import run_checks
from django.test import override_settings
from django.urls import reverse

import django_durable as durable
from django_durable import step
from django_durable.dashboard import search, values
from django_durable.models import Run, Schedule, WorkerNode
from django_durable.store import now
from django_durable.testing import drain
from tests.dashboard_workflows import DashAwaitsEvent, DashOrder
from tests.testapp.workflows import SlowRetry, SyncAccount

pytestmark = pytest.mark.django_db

RUN_ID = "00000000-0000-0000-0000-000000000001"


def url(name, *args):
    return reverse(f"django_durable:{name}", args=args)


def get(client, name, *args, **params):
    response = client.get(url(name, *args), params)
    assert response.status_code == 200, response.content[:800]
    return response.content.decode()


@pytest.fixture
def order():
    """A run with a retried step, a wait for input, a child, and a compensation."""
    run_id = durable.start(DashOrder, {"order": 7, "fail_ship": True}, key="order:7")
    drain()
    assert durable.get_run(run_id).waiting_for == "input:approval"
    durable.provide_input(run_id, "approval", True)
    drain()
    assert durable.get_run(run_id).status == "compensated"
    return run_id


def test_timeline_shows_attempts_backoff_wait_and_compensation_as_bars(admin_client, order):
    html = get(admin_client, "run", order)
    timeline = html[html.index('id="timeline"') : html.index('id="attempts"')]
    assert timeline.count("<rect") >= 8
    for label in ("charge #1", "charge #2", "charge: backoff", "approve: wait", "unreserve #1"):
        assert label in timeline, label
    assert "durable-bar-compensation" in timeline and "durable-bar-wait" in timeline
    assert re.search(r"\d+(\.\d)? (ms|s)</td>", timeline)  # durations


def test_flow_graph_shows_steps_statuses_compensation_and_child(admin_client, order):
    html = get(admin_client, "run", order)
    graph = html[html.index('id="flow-graph"') : html.index('id="timeline"')]
    names = re.findall(r'durable-node-name">\d+\. (\w+)', graph)
    assert names == ["reserve", "charge", "approve", "label", "ship"]
    assert "completed, 2 attempts" in graph  # charge
    assert "durable-node-failed" in graph  # ship
    assert "↩ unreserve" in graph
    child = Run.objects.get(parent_id=order)
    assert url("run", child.id) in graph and "child dash_label" in graph


def test_step_counter_counts_from_one(admin_client):
    run_id = durable.start(SyncAccount, {"fail": True})
    drain()
    html = get(admin_client, "run", run_id)
    assert "step 1 of 1, attempt 1" in html
    done = durable.start(SyncAccount, {})
    drain()
    assert "all 1 steps done" in get(admin_client, "run", done)


def test_big_values_are_truncated_with_a_download_of_the_whole(admin_client):
    big = "x" * (values.SHOWN * 3)
    run_id = durable.start(SyncAccount, {"blob": big})
    html = get(admin_client, "run", run_id)
    assert big not in html and f"of {len(json.dumps({'blob': big}))} characters" in html
    assert len(html) < values.SHOWN * 2
    download = admin_client.get(url("value", run_id, "input"))
    assert download.status_code == 200 and download["Content-Disposition"].startswith("attachment")
    assert json.loads(download.content) == {"blob": big}
    assert admin_client.get(url("value", run_id, "password")).status_code == 404


def test_search_terms_are_capped_with_a_message(admin_client):
    durable.start(SyncAccount, {}, key="account:1")
    words = " ".join(f"w{n}" for n in range(2000))
    parsed = search.parse(words)
    assert len(parsed.text) == search.MAX_WORDS and parsed.notes
    html = get(admin_client, "runs", q=" ".join(words.split()[:100]))
    assert f"Only the first {search.MAX_WORDS} words were searched" in html
    # A longer search comes back as the same page with the search cut, said once.
    response = admin_client.get(url("runs"), {"q": "x" * 50_000, "status": "failed"})
    assert response.status_code == 302
    cut = response["Location"]
    assert cut == url("runs") + "?q=" + "x" * search.MAX_CHARS + "&status=failed"
    html = admin_client.get(cut).content.decode()
    assert f"cut to its first {search.MAX_CHARS} characters" in html
    assert "x" * (search.MAX_CHARS + 1) not in html


@pytest.mark.parametrize("number", ["9223372036854775807", "99999999999999999999999", "-3", "x"])
def test_page_numbers_are_bounded(admin_client, number):
    durable.start(SyncAccount, {})
    for name in ("runs", "keys", "inputs", "schedules"):
        assert admin_client.get(url(name), {"page": number}).status_code == 200


def test_admin_run_search_reports_a_bad_status_and_caps_words(admin_client):
    durable.start(SyncAccount, {}, key="account:1")
    changelist = reverse("admin:django_durable_run_changelist")
    html = admin_client.get(changelist, {"q": "status:bogus"}).content.decode()
    assert "unknown status" in html and "0 runs" in html
    words = " ".join(f"w{n}" for n in range(2000))
    html = admin_client.get(changelist, {"q": words}, follow=True).content.decode()
    assert "Only the first" in html and "The search was cut" in html


def every_url(run_id, schedule_name="nightly"):
    return [
        url("overview"),
        url("keys"),
        url("runs"),
        url("run", run_id),
        url("value", run_id, "input"),
        url("run_action", run_id, "cancel"),
        url("workflow", "sync_account"),
        url("inputs"),
        url("schedules"),
        url("workers"),
    ]


def test_an_htmx_poll_without_a_session_is_sent_to_the_login_page(client):
    page = "http://testserver" + url("keys") + "?workflow=sync_account"
    response = client.get(url("keys"), headers={"HX-Request": "true", "HX-Current-URL": page})
    assert response.status_code == 204 and response.content == b""
    login = reverse("admin:login")
    assert (
        response["HX-Redirect"]
        == f"{login}?next=%2Fadmin%2Fdurable%2Fkeys%2F%3Fworkflow%3Dsync_account"
    )


def test_run_page_poll_asks_for_a_reload_when_the_status_changed(admin_client):
    run_id = durable.start(SyncAccount, {})
    response = admin_client.get(
        url("run", run_id), {"_status": "running"}, headers={"HX-Request": "true"}
    )
    assert response.status_code == 204 and response["HX-Refresh"] == "true"


def test_pending_inputs_lists_waits_and_answers_them(admin_client, admin_user):
    waiting = durable.start(DashOrder, {"order": 1}, key="order:1")
    event = durable.start(DashAwaitsEvent, {})
    drain()
    html = get(admin_client, "inputs")
    assert f'id="pending-{waiting}"' in html and f'id="pending-{event}"' in html
    assert "waits for input <code>approval</code>" in html and "Send event" in html
    bad = admin_client.post(
        url("answer", waiting), {"name": "approval", "wait": "input", "json": "{nope"}
    )
    assert bad.status_code == 302 and durable.get_run(waiting).status == "waiting"
    admin_client.post(url("answer", waiting), {"name": "approval", "wait": "input", "json": "true"})
    admin_client.post(url("answer", event), {"name": "paid", "wait": "event", "json": '{"€": 5}'})
    drain()
    assert durable.get_run(event).result == {"€": 5}
    assert durable.get_run(waiting).step_index > 2
    entries = LogEntry.objects.filter(user=admin_user)
    assert {e.object_id for e in entries} == {str(waiting), str(event)}


def test_schedules_page_toggles_and_triggers(admin_client):
    durable.schedule(SyncAccount, "0 3 * * *", key="nightly-sync", name="nightly")
    html = get(admin_client, "schedules")
    assert "nightly" in html and "0 3 * * *" in html and "Trigger now" in html
    admin_client.post(url("schedule_action", "nightly", "disable"))
    assert not Schedule.objects.get(name="nightly").enabled
    admin_client.post(url("schedule_action", "nightly", "enable"))
    assert Schedule.objects.get(name="nightly").enabled
    response = admin_client.post(url("schedule_action", "nightly", "trigger"))
    assert response.status_code == 302
    (fired,) = Run.objects.filter(key="nightly-sync")
    html = get(admin_client, "schedules")
    assert url("run", fired.id) in html
    assert LogEntry.objects.count() == 3
    assert admin_client.post(url("schedule_action", "missing", "trigger")).status_code == 404
    assert admin_client.get(url("schedule_action", "nightly", "trigger")).status_code == 405


def test_workers_page_and_the_banner_for_a_queue_nobody_serves(admin_client):
    durable.start(SyncAccount, {})
    assert "and no live worker takes it" in get(admin_client, "overview")
    WorkerNode.objects.create(
        id="w1", hostname="box", pid=12, queues=["other"], concurrency=4, heartbeat_at=now()
    )
    html = get(admin_client, "workers")
    assert 'title="w1">w1</code>' in html and "live" in html
    assert 'title="other">other</code>' in html
    assert "no live worker takes it" in html
    WorkerNode.objects.create(id="w2", hostname="box", pid=13, queues=[], heartbeat_at=now())
    assert "no live worker" not in get(admin_client, "overview")


def test_bulk_cancel_of_the_runs_a_search_matches(admin_client, admin_user):
    ids = {durable.start(SlowRetry, {"n": n}, key=f"bulk:{n}") for n in range(30)}
    other = durable.start(SyncAccount, {})
    data = {"action": "cancel", "scope": "all", "q": "bulk"}
    confirm = admin_client.post(url("bulk"), data).content.decode()
    assert "<strong>30</strong> runs matching the search" in confirm
    assert {r.status for r in Run.objects.filter(id__in=ids)} == {"pending"}  # not yet
    data["q"] = "workflow:slow_retry"
    confirm = admin_client.post(url("bulk"), data).content.decode()
    assert "<strong>30</strong>" in confirm
    done = admin_client.post(url("bulk"), {**data, "confirm": "yes", "reason": "bad deploy"})
    html = done.content.decode()
    assert "<strong>30</strong> of 30 runs: cancel done." in html
    assert all(str(i) in html for i in ids)
    assert {r.status for r in Run.objects.filter(id__in=ids)} == {"cancelled"}
    assert durable.get_run(other).status == "pending"
    assert LogEntry.objects.filter(user=admin_user).count() == 30
    again = admin_client.post(url("bulk"), {**data, "confirm": "yes"}).content.decode()
    assert "0 of 30 runs" in again and "refused: The run already finished" in again


def test_bulk_retry_of_selected_runs(admin_client):
    failed = [durable.start(SyncAccount, {"fail": True}) for _ in range(3)]
    drain()
    data = {"action": "retry", "scope": "selected", "ids": [str(i) for i in failed[:2]]}
    assert "<strong>2</strong> runs" in admin_client.post(url("bulk"), data).content.decode()
    admin_client.post(url("bulk"), {**data, "confirm": "yes"})
    statuses = [durable.get_run(i).status for i in failed]
    assert statuses == ["pending", "pending", "failed"]


def test_system_checks_for_the_htmx_middleware_and_the_urls(settings):
    assert not [m for m in run_checks() if m.id.startswith("django_durable.E01")]
    middleware = [m for m in settings.MIDDLEWARE if "htmx" not in m]
    with override_settings(MIDDLEWARE=middleware):
        assert "django_durable.E012" in [m.id for m in run_checks()]
    with override_settings(ROOT_URLCONF="tests.urls_without_dashboard"):
        assert "django_durable.E013" in [m.id for m in run_checks()]


@override_settings(
    MIDDLEWARE=[
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ]
)
def test_pages_work_without_the_htmx_middleware(admin_client):
    run_id = durable.start(SyncAccount, {})
    for address in every_url(run_id)[:4]:
        assert admin_client.get(address, headers={"HX-Request": "true"}).status_code == 200


def test_unknown_run_and_bad_ids(admin_client):
    assert admin_client.get(url("run", uuid.UUID(RUN_ID))).status_code == 404
    assert admin_client.get("/admin/durable/runs/not-a-uuid/").status_code == 404


def test_run_page_shows_what_each_attempt_logged(admin_client, define):
    def shouts(self, ctx):
        logging.getLogger("dash.shouter").warning("<b>careful</b>")

    run_id = durable.start(define("dash_shouter", go=step(shouts)))
    drain()
    html = get(admin_client, "run", run_id)
    logs = html[html.index('id="attempt-logs"') :]
    assert "shouts attempt 1: 1 log record" in logs and "&lt;b&gt;careful&lt;/b&gt;" in logs
