# ruff: noqa: F811  (the fixtures imported from tests.browser are arguments here)
"""A run's progress and stream items in Debian's Chromium: written while its page is
open, they appear without a reload (the live part's poll), as text, never run."""

import pytest
from playwright.sync_api import expect

import django_durable as durable
from django_durable.dashboard import site
from django_durable.testing import drain
from tests.browser import chromium, login, staff  # noqa: F401 (fixtures)
from tests.helpers import DbThread
from tests.stream_workflows import HOSTILE, DashStreams

pytestmark = pytest.mark.django_db(transaction=True)


def work() -> None:
    """The due steps, run by a worker thread beside the page (Playwright's event loop
    holds this thread, where a step's sync stream write is refused)."""
    DbThread(drain).outcome_after_start(60)


def test_items_and_progress_written_while_the_page_is_open_appear_live(
    chromium, live_server, staff, monkeypatch
):
    monkeypatch.setattr(site, "REFRESH_SECONDS", 1)
    run_id = durable.start(DashStreams, {"tokens": ["Durable", " workflows", HOSTILE], "total": 4})
    work()  # the first step wrote three items and progress 2 of 4; the run waits
    context, page = login(chromium, live_server, "staff")
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto(f"{live_server.url}/admin/durable/runs/{run_id}/")
    streams = page.locator("#run-streams")
    expect(streams).to_contain_text("3 items")
    expect(streams.locator("progress")).to_have_attribute("value", "2")
    expect(streams).to_contain_text(f'"{HOSTILE}"')  # shown as its JSON text
    page.evaluate("window.durableMarker = 'same page'")

    durable.provide_input(run_id, "more", True)
    work()  # the next steps write an item and progress 3 of 4; the run waits again

    expect(streams).to_contain_text('"the second part"', timeout=20_000)
    expect(streams).to_contain_text("4 items")
    expect(streams.locator("progress")).to_have_attribute("value", "3")
    expect(streams).to_contain_text("writing the second part")
    assert page.evaluate("window.durableMarker") == "same page"  # no reload
    assert page.locator("#run-streams script").count() == 0
    assert dialogs == []

    page.goto(f"{live_server.url}/admin/durable/runs/")
    row = page.locator("tr", has=page.locator(f"a[title='{run_id}']"))
    expect(row.locator("progress")).to_have_attribute("value", "3")
    expect(row).to_contain_text("75%")
    context.close()
