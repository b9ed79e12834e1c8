"""The dashboard's progress and streams (API §10): a run's page shows its progress bar
and each stream's count and latest items as escaped JSON text, its live part changes
when an item is written; the runs list shows the progress of unfinished runs in one
query; the stream view sends Server-Sent Events to users who may see the run only."""

import html

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import django_durable as durable
from django_durable.dashboard import streams
from django_durable.testing import drain
from tests.stream_workflows import HOSTILE, DashStreams

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}


def streaming(total=4, tokens=("Durable", " workflows", HOSTILE), **extra):
    """A run that wrote ``tokens`` and progress and now waits for the input "more"."""
    run_id = durable.start(DashStreams, {"tokens": list(tokens), "total": total, **extra})
    drain()
    assert durable.get_run(run_id).status == "waiting"
    return run_id


def run_page(client, run_id, **params):
    return client.get(reverse("django_durable:run", args=[run_id]), params)


def section(page: str) -> str:
    """The page's "Progress and streams" module (the input shows the tokens too)."""
    return page.split('id="run-streams"', 1)[1].split('<div class="module', 1)[0]


def test_the_run_page_shows_progress_and_the_latest_items_as_escaped_json(admin_client):
    run_id = streaming()
    whole = run_page(admin_client, run_id).content.decode()
    assert HOSTILE not in whole
    page = section(whole)
    assert '<progress value="2" max="4"' in page and "2 of 4 (50%)" in page
    assert "writing the first part" in page
    assert "<code>text</code>" in page and "3 items" in page
    assert html.escape('"Durable"') in page and html.escape('" workflows"') in page
    # The value's JSON, escaped: the script is text on the page, never an element.
    assert html.escape(f'"{HOSTILE}"') in page
    events = reverse("django_durable:stream", args=[run_id, "text"])
    assert f'href="{events}"' in page


def test_progress_without_a_total_is_a_count(admin_client):
    page = section(run_page(admin_client, streaming(total=None)).content.decode())
    assert "<progress" not in page and "2 done" in page


def test_a_run_without_streams_shows_no_section(admin_client):
    run_id = durable.start(DashStreams, {"tokens": []})
    page = run_page(admin_client, run_id).content.decode()
    assert 'id="run-streams"' not in page


def test_the_live_part_changes_when_an_item_is_written(admin_client):
    run_id = streaming()
    poll = {"_status": "waiting", "_seen": "an older fingerprint"}
    address = reverse("django_durable:run", args=[run_id])
    before = admin_client.get(address, poll, headers=HTMX).content.decode()
    assert '<progress value="2" max="4"' in before and "the second part" not in before
    durable.provide_input(run_id, "more", True)
    drain()  # the step writes an item and progress; the run waits again
    after = admin_client.get(address, poll, headers=HTMX)
    assert after.status_code == 200  # the same status: the live part, not a reload
    assert "HX-Refresh" not in after
    part = section(after.content.decode())
    assert html.escape('"the second part"') in part and '<progress value="3" max="4"' in part


def test_only_the_latest_items_of_each_stream_are_shown(admin_client):
    tokens = [f"token {i}" for i in range(25)]
    page = section(run_page(admin_client, streaming(tokens=tokens)).content.decode())
    assert "25 items" in page and f"the latest {streams.ITEMS_SHOWN}" in page
    assert html.escape('"token 24"') in page and html.escape('"token 15"') in page
    assert html.escape('"token 14"') not in page


def test_a_long_value_is_cut(admin_client):
    page = section(run_page(admin_client, streaming(tokens=["x" * 5000])).content.decode())
    # The head of the JSON text: its quote and ITEM_CHARS - 1 characters.
    assert '"' + "x" * (streams.ITEM_CHARS - 1) + "…" in html.unescape(page)
    assert "x" * streams.ITEM_CHARS not in page


def test_the_run_page_reads_streams_in_two_queries_whatever_their_number(admin_client):
    one = streaming()
    many = streaming(others=[f"s{i}" for i in range(8)], tokens=[str(i) for i in range(40)])
    run_page(admin_client, one)  # the process's first page checks migrations
    counts = {}
    for label, run_id in (("one", one), ("many", many)):
        with CaptureQueriesContext(connection) as queries:
            page = run_page(admin_client, run_id).content.decode()
        counts[label] = [q["sql"] for q in queries.captured_queries]
        reads = [q for q in counts[label] if "durable_stream" in q]
        assert len(reads) == 2, reads  # the streams' rows, then their latest items
    assert len(counts["one"]) == len(counts["many"])
    assert "<code>s7</code>" in page and "40 items" in page


def test_the_runs_list_shows_the_progress_of_unfinished_runs_in_one_query(
    admin_client, django_assert_num_queries
):
    going = streaming()
    finished = durable.start(DashStreams, {"tokens": ["x"], "total": 4})
    drain()
    durable.provide_input(finished, "more", True)
    drain()
    durable.cancel(finished)
    runs = reverse("django_durable:runs")
    admin_client.get(runs)
    with django_assert_num_queries(4):
        page = admin_client.get(runs).content.decode()
    assert page.count('<progress value="2" max="4"') == 1  # the cancelled run shows none
    for _ in range(20):
        streaming()
    with django_assert_num_queries(4):
        page = admin_client.get(runs).content.decode()
    assert page.count('<progress value="2" max="4"') == 21
    assert going


def test_the_stream_view_sends_events_as_json(admin_client):
    run_id = streaming()
    durable.cancel(run_id)  # a finished run's streams are closed: the response ends
    response = admin_client.get(reverse("django_durable:stream", args=[run_id, "text"]))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    body = b"".join(response.streaming_content).decode()
    assert 'data: "Durable"' in body
    # JSON text with no markup in it (<, > as JSON escapes): the same value once parsed.
    assert 'id: 2\nevent: value\ndata: "\\u003cscript\\u003ealert(1)\\u003c/script\\u003e"' in body
    assert "<" not in body
    assert body.endswith("event: close\ndata: \n\n")
    resumed = admin_client.get(
        reverse("django_durable:stream", args=[run_id, "text"]), headers={"Last-Event-ID": "1"}
    )
    assert "id: 0" not in b"".join(resumed.streaming_content).decode()


def test_the_stream_view_answers_404_for_an_unknown_run_or_a_bad_name(admin_client):
    run_id = streaming()
    unknown = "00000000-0000-0000-0000-000000000000"
    assert admin_client.get(f"/admin/durable/runs/{unknown}/stream/text/").status_code == 404
    long_name = "n" * 101
    assert admin_client.get(f"/admin/durable/runs/{run_id}/stream/{long_name}/").status_code == 404


@pytest.mark.parametrize("who", ["anonymous", "staff without view_run", "staff with view_run"])
def test_the_stream_view_needs_the_run_pages_permission(client, django_user_model, who):
    run_id = streaming()
    durable.cancel(run_id)
    if who != "anonymous":
        user = django_user_model.objects.create_user("someone", password="pw", is_staff=True)
        if who == "staff with view_run":
            user.user_permissions.add(Permission.objects.get(codename="view_run"))
        client.force_login(user)
    address = reverse("django_durable:stream", args=[run_id, "text"])
    response = client.get(address)
    if who == "anonymous":
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))
    elif who == "staff without view_run":
        assert response.status_code == 403
        assert "This needs the django_durable.view_run permission." in response.content.decode()
    else:
        assert response.status_code == 200
        assert 'data: "Durable"' in b"".join(response.streaming_content).decode()
