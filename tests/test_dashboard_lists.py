"""What the run lists and the run page show: step N of M, the attempt and error
columns, sorting, times in the user's timezone with relative times and
durations, bounded searches of any length (dashboard and admin), big values
on a keyed run, and bulk reruns."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

import django_durable as durable
from django_durable import step
from django_durable.dashboard import search, values
from django_durable.models import Activity, Run
from django_durable.testing import drain
from tests.testapp.workflows import SendInvoice, SyncAccount

pytestmark = pytest.mark.django_db

TEN_THOUSAND_WORDS = " ".join(f"w{n}" for n in range(10_000))


def url(name, *args):
    return reverse(f"django_durable:{name}", args=args)


def html_of(client, name, *args, **params):
    response = client.get(url(name, *args), params)
    assert response.status_code == 200, response.content[:800]
    return response.content.decode()


def row_of(html, run_id):
    """The runs-table row of ``run_id``, as a list of its cells' text."""
    row = re.search(rf"<tr[^>]*>(?:(?!</tr>).)*?{run_id}(?:(?!</tr>).)*</tr>", html, re.S)
    assert row, f"no row for {run_id}"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(0), re.S)
    return [re.sub(r"<[^>]+>", "", c).strip() for c in cells]


@pytest.fixture
def second_step_fails(define):
    def first(self, ctx):
        return 1

    def second(self, ctx):
        raise RuntimeError("the second step broke")

    return define("dash_two_steps", first=step(first), second=step(second))


def test_a_run_that_failed_in_its_second_step_is_at_step_2_of_2(admin_client, second_step_fails):
    run_id = durable.start(second_step_fails, {})
    drain()
    assert durable.get_run(run_id).status == "failed"
    html = html_of(admin_client, "run", run_id)
    assert "step 2 of 2, attempt 1" in html
    # The runs list: Run, Workflow, Key, Status, Step (the attempt under it when more
    # than one), Error, Queue, Created, Finished.
    cells = row_of(html_of(admin_client, "runs"), run_id)[1:]  # after the checkbox
    assert cells[3:6] == ["failed", "2/2", "RuntimeError: the second step broke"]
    assert re.fullmatch(r"\S+ \S+took \d+(\.\d)? m?s", cells[8]), cells[8]


def test_a_completed_run_shows_every_step_done(admin_client):
    run_id = durable.start(SyncAccount, {})
    drain()
    assert "all 1 steps done" in html_of(admin_client, "run", run_id)
    assert row_of(html_of(admin_client, "runs"), run_id)[5] == "1/1"


def test_runs_list_sorts_by_creation_both_ways(admin_client):
    ids = [durable.start(SyncAccount, {"n": n}) for n in range(3)]
    for n, run_id in enumerate(ids):  # distinct creation times, oldest first
        Run.objects.filter(id=run_id).update(created_at=timezone.now() - timedelta(hours=3 - n))

    def order(html):
        found = [m for m in re.findall(r"/admin/durable/runs/([0-9a-f-]{36})/", html)]
        return [uuid for uuid in dict.fromkeys(found) if uuid in map(str, ids)]

    newest_first = html_of(admin_client, "runs")
    assert order(newest_first) == [str(i) for i in reversed(ids)]
    assert 'href="/admin/durable/runs/?o=created"' in newest_first and "Created ▼" in newest_first
    oldest_first = html_of(admin_client, "runs", o="created")
    assert order(oldest_first) == [str(i) for i in ids] and "Created ▲" in oldest_first
    assert order(html_of(admin_client, "runs", o="bogus")) == [str(i) for i in reversed(ids)]


@override_settings(TIME_ZONE="Asia/Kolkata")
def test_times_are_shown_in_the_current_timezone_with_relative_times(admin_client):
    run_id = durable.start(SyncAccount, {}, key="account:tz")
    durable.start(SyncAccount, {"again": True}, key="account:tz")
    created = timezone.now() - timedelta(hours=2)
    Run.objects.filter(id=run_id).update(created_at=created)
    local = timezone.localtime(created, timezone.get_current_timezone())
    assert local.utcoffset() == timedelta(hours=5, minutes=30)
    shown = local.strftime("%Y-%m-%d %H:%M:%S")
    html = html_of(admin_client, "run", run_id)
    assert "(times in IST)" in html
    assert f'title="{shown}.' in html and " IST" in html  # Created, with the zone
    assert "(2\xa0hours ago)" in html
    runs = html_of(admin_client, "runs")
    assert shown in runs and "2\xa0hours ago" in runs
    overview = html_of(admin_client, "overview")  # the key activity rows carry dates
    readd = Activity.objects.get(kind="key_duplicate")
    day = timezone.localtime(readd.created_at).strftime("%Y-%m-%d %H:%M")
    activity = overview[overview.index("Recent key activity") :]
    assert day in activity and "ago" in activity


def test_a_10000_word_search_runs_the_same_queries_as_one_word(admin_client):
    """The dashboard's runs search: cut to MAX_CHARS by a redirect, then one
    statement with at most MAX_WORDS words."""
    durable.start(SyncAccount, {}, key="w1-account")
    with CaptureQueriesContext(connection) as one:
        html_of(admin_client, "runs", q="w1")
    cut = admin_client.get(url("runs"), {"q": TEN_THOUSAND_WORDS})
    assert cut.status_code == 302  # the same page, the search cut to MAX_CHARS
    assert len(cut["Location"]) < 2 * search.MAX_CHARS
    with CaptureQueriesContext(connection) as many:
        html = admin_client.get(cut["Location"]).content.decode()
    assert len(many) == len(one)
    assert len(html) < 100_000 and "was cut to its first" in html
    biggest = max(len(q["sql"]) for q in many.captured_queries)
    assert biggest < 10 * max(len(q["sql"]) for q in one.captured_queries)
    likes = max(q["sql"].upper().count("LIKE") for q in many.captured_queries)
    assert likes <= 2 * search.MAX_WORDS
    assert f"Only the first {search.MAX_WORDS} words were searched" in html


def test_the_admin_run_search_is_bounded_and_refuses_a_bad_status(admin_client):
    durable.start(SyncAccount, {}, key="w1-account")
    changelist = reverse("admin:django_durable_run_changelist")
    with CaptureQueriesContext(connection) as one:
        admin_client.get(changelist, {"q": "w1"})
    cut = admin_client.get(changelist, {"q": TEN_THOUSAND_WORDS})
    assert cut.status_code == 302 and len(cut["Location"]) < 2 * search.MAX_CHARS
    with CaptureQueriesContext(connection) as many:
        html = admin_client.get(cut["Location"]).content.decode()
    assert len(many) == len(one)
    # The admin repeats the search in each filter link: bounded by the cut.
    assert len(html) < 300_000 and "Search: The search was cut to its first" in html
    likes = max(q["sql"].upper().count("LIKE") for q in many.captured_queries)
    assert likes <= 2 * search.MAX_WORDS
    assert f"Only the first {search.MAX_WORDS} words were searched" in html
    html = admin_client.get(changelist, {"q": "status:bogus"}).content.decode()
    assert "Search: unknown status &#x27;bogus&#x27;" in html and "No run is shown." in html
    assert "w1-account" not in html.split('id="result_list"')[-1]
    huge_page = admin_client.get(changelist, {"p": "9223372036854775807"})
    assert huge_page.status_code in (200, 302)  # the admin's own bound, never a 500


def test_a_keyed_run_with_a_32_mb_result_makes_a_small_page(admin_client):
    run_id = durable.start(SendInvoice, {"id": 1}, key="invoice:big")
    with pytest.raises(durable.KeyTaken):
        durable.start(SendInvoice, {"id": 1, "big": "y" * 100_000}, key="invoice:big")
    huge = {"blob": "z" * (32 * 1024 * 1024)}
    Run.objects.filter(id=run_id).update(result=huge, status="completed")
    html = html_of(admin_client, "run", run_id)
    assert len(html) < 4 * values.SHOWN + 200_000
    assert "Download the whole result" in html
    assert "too long to show as a diff" in html  # the dropped 100,000-character input
    download = admin_client.get(url("value", run_id, "result"))
    assert len(download.content) > 32 * 1024 * 1024


def test_event_payloads_are_shown_as_the_head_of_their_json(admin_client):
    run_id = durable.start(SyncAccount, {})
    durable.send_event(run_id, "big", {"text": "e" * 200_000}, buffer=True)
    durable.send_event(run_id, "small", [1, "<b>x</b>"], buffer=True)
    html = html_of(admin_client, "run", run_id)
    assert "e" * 200_000 not in html and "e" * 400 in html
    assert "&quot;&lt;b&gt;x&lt;/b&gt;&quot;]" in html and "<b>x</b>" not in html  # escaped
    assert len(html) < 100_000


def test_bulk_rerun_of_selected_runs(admin_client):
    finished = [durable.start(SyncAccount, {"n": n}, key=f"rerun:{n}") for n in range(2)]
    drain()
    for run_id in finished:
        durable.release_key(run_id, by="test")
    data = {"action": "rerun", "scope": "selected", "ids": [str(i) for i in finished]}
    assert "<strong>2</strong> runs" in admin_client.post(url("bulk"), data).content.decode()
    html = admin_client.post(url("bulk"), {**data, "confirm": "yes"}).content.decode()
    assert "<strong>2</strong> of 2 runs: rerun done." in html
    for n in range(2):
        assert Run.objects.filter(key=f"rerun:{n}").count() == 2
        assert Run.objects.get(key=f"rerun:{n}", holds_key=True).status == "pending"


def test_free_text_looks_through_the_newest_runs_only(admin_client, monkeypatch):
    monkeypatch.setattr(search, "TEXT_WINDOW", 3)
    ids = [durable.start(SyncAccount, {"n": n}, key=f"window:{n}") for n in range(5)]
    for n, run_id in enumerate(ids):  # window:0 is the oldest
        Run.objects.filter(id=run_id).update(created_at=timezone.now() - timedelta(hours=5 - n))
    html = html_of(admin_client, "runs", q="window")
    assert "Free text looks through the newest 3 runs" in html
    assert [str(i)[:8] in html for i in ids] == [False, False, True, True, True]
    exact = html_of(admin_client, "runs", q="key:window:0")  # filters search every run
    assert str(ids[0])[:8] in exact and "Free text" not in exact
    by_id = html_of(admin_client, "runs", q=str(ids[0]))  # so does a run id
    assert str(ids[0])[:8] in by_id and "Free text" not in by_id
    changelist = reverse("admin:django_durable_run_changelist")
    admin = admin_client.get(changelist, {"q": "window"}).content.decode()
    assert "Free text looks through the newest 3 runs" in admin
    assert [str(i) in admin for i in ids] == [False, False, True, True, True]
    # Outside the dashboard's pages (``durable list --query``) free text reads every run.
    assert search.parse("window").apply(Run.objects.all()).count() == 5
