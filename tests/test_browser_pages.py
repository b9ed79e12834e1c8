# ruff: noqa: F811  (the fixtures imported from tests.browser are arguments here)
"""Every dashboard page and action in Debian's Chromium (one browser for the
module): no page wider than the screen, no script run from a hostile key or
input, an expired session during a poll, opened details kept across refreshes,
the actions (retry, cancel, rerun, bulk cancel of 1,000 runs, answering inputs
and events, schedules), refusals, and the timeline and flow graph
screenshots (``DURABLE_SCREENSHOTS=docs/img`` writes them for the docs)."""

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.contrib.sessions.models import Session
from playwright.sync_api import expect

import django_durable as durable
from django_durable import step
from django_durable.dashboard import site
from django_durable.models import Run, WorkerNode
from django_durable.store import now
from django_durable.testing import drain
from tests.browser import PASSWORD, chromium, login, shots, staff  # noqa: F401 (fixtures)
from tests.dashboard_workflows import DashAwaitsEvent, DashOrder
from tests.testapp.workflows import SlowRetry, SyncAccount

pytestmark = pytest.mark.django_db(transaction=True)

HOSTILE_KEY = "<script>alert('key')</script><img src=x onerror=alert('img')>"
LONG_KEY = (HOSTILE_KEY + "k" * 255).encode()[:255].decode()
LONG_VALUE = "<img src=x onerror=alert('value')>" + "v" * 3000


@pytest.fixture
def order():
    run_id = durable.start(DashOrder, {"order": 7, "fail_ship": True}, key="order:7")
    drain()
    durable.provide_input(run_id, "approval", True)
    drain()
    return run_id


@pytest.fixture
def hostile():
    """A 255-byte key and a 3,000-character input holding script payloads, on a
    run waiting for input, a failed run, and a schedule."""
    waiting = durable.start(DashOrder, {"note": LONG_VALUE}, key=LONG_KEY)
    failed = durable.start(SyncAccount, {"fail": True, "note": LONG_VALUE}, key=HOSTILE_KEY)
    drain()
    durable.start(SyncAccount, {"note": LONG_VALUE + "changed"}, key=HOSTILE_KEY)
    durable.schedule(SyncAccount, "0 3 * * *", key=LONG_KEY, name="hostile <b>schedule</b>")
    WorkerNode.objects.create(
        id="worker-" + "w" * 150, hostname="h" * 200, pid=1, queues=["q" * 90], heartbeat_at=now()
    )
    return {"waiting": waiting, "failed": failed}


def _pages(live_server, runs):
    base = f"{live_server.url}/admin/durable"
    pages = ["/", "/keys/", "/runs/", "/runs/?q=key%3A%3Cscript", "/inputs/", "/schedules/"]
    pages += ["/workers/", "/workflows/dash_order/", "/workflows/sync_account/"]
    for run_id in runs:
        pages += [f"/runs/{run_id}/", f"/runs/{run_id}/retry/", f"/runs/{run_id}/cancel/"]
    return [base + p for p in pages]


@pytest.mark.parametrize("width", [1280, 390])
def test_no_page_is_wider_than_the_screen_or_runs_a_payload(
    chromium, live_server, staff, hostile, order, width
):
    context, page = login(chromium, live_server, "staff", width=width, height=800)
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    for address in _pages(live_server, [hostile["waiting"], hostile["failed"], order]):
        assert page.goto(address).status == 200, address
        widths = page.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        wide = page.evaluate(
            """() => [...document.querySelectorAll('body *')].filter(
                e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1
            ).slice(0, 5).map(e => e.tagName + '.' + e.className + '#' + e.id)"""
        )
        assert widths[0] <= widths[1], (address, widths, wide)
    assert dialogs == []
    context.close()


def test_an_expired_session_during_a_poll_goes_to_the_login_page(
    chromium, live_server, staff, monkeypatch
):
    monkeypatch.setattr(site, "REFRESH_SECONDS", 1)
    durable.start(SyncAccount, {}, key="account:1")
    context, page = login(chromium, live_server, "staff")
    page.goto(f"{live_server.url}/admin/durable/keys/?workflow=sync_account")
    page.locator("#keys-table code", has_text="account:1").wait_for()
    Session.objects.all().delete()
    page.wait_for_url(re.compile(r"/admin/login/\?next=%2Fadmin%2Fdurable%2Fkeys%2F"))
    assert page.locator("#id_username").is_visible()
    assert page.locator("#keys-table").count() == 0  # no login form swapped into a table
    page.fill("#id_username", "staff")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/durable/keys/\?workflow=sync_account$"))
    context.close()


def test_opened_details_stay_open_while_the_page_refreshes(
    chromium, live_server, staff, monkeypatch
):
    monkeypatch.setattr(site, "REFRESH_SECONDS", 1)
    run_id = durable.start(SlowRetry, {})
    drain()  # the first attempt failed; the next is an hour away
    context, page = login(chromium, live_server, "staff")
    page.goto(f"{live_server.url}/admin/durable/runs/{run_id}/")
    details = page.locator("#attempt-errors details").first
    details.locator("summary").click()
    assert details.evaluate("d => d.open")
    page.evaluate("window.durableMarker = 'same page'")
    Run.objects.filter(id=run_id).update(due_at=now().replace(year=2031))
    page.locator("#durable-live", has_text="2031-").wait_for()  # the live part was swapped
    assert details.evaluate("d => d.open")
    assert page.evaluate("window.durableMarker") == "same page"
    context.close()


def test_timeline_and_flow_graph(chromium, live_server, staff, order, shots):
    context, page = login(chromium, live_server, "staff")
    page.goto(f"{live_server.url}/admin/durable/runs/{order}/")
    graph = page.locator("#flow-graph")
    assert graph.locator(".durable-node-name").all_inner_texts() == [
        "1. reserve",
        "2. charge",
        "3. approve",
        "4. label",
        "5. ship",
    ]
    assert graph.locator(".durable-node-compensation", has_text="unreserve").is_visible()
    assert graph.locator(".durable-node-child", has_text="dash_label").is_visible()
    timeline = page.locator("#timeline")
    assert timeline.locator("svg rect").count() >= 8
    assert timeline.locator("td", has_text="charge: backoff").count() == 1
    assert timeline.locator("td", has_text="approve: wait").count() == 1
    graph.screenshot(path=str(shots / "flow-graph.png"))
    timeline.screenshot(path=str(shots / "timeline.png"))
    page.screenshot(path=str(shots / "run-timeline.png"), full_page=True)
    graph.locator(".durable-node-child").click()
    page.wait_for_url(re.compile(r"/runs/[0-9a-f-]+/$"))
    assert "dash_label" in page.locator("#durable-static").inner_text()
    context.close()


def test_run_actions_with_reasons(chromium, live_server, staff):
    failed = durable.start(SyncAccount, {"fail": True}, key="account:f")
    active = durable.start(SlowRetry, {}, key="slow:1")
    drain()
    context, page = login(chromium, live_server, "staff")
    base = f"{live_server.url}/admin/durable/runs"

    page.goto(f"{base}/{failed}/")
    page.click(".durable-actions >> text=Retry")
    page.fill("input[name=reason]", "upstream fixed")
    page.click("input[type=submit][value='Yes, retry']")
    assert "will be retried" in page.locator("ul.messagelist li.success").inner_text()
    assert durable.get_run(failed).status == "pending"

    page.goto(f"{base}/{active}/")
    page.click(".durable-actions >> text=Cancel")
    page.fill("input[name=reason]", "wrong input")
    page.click("input[type=submit][value='Yes, cancel']")
    assert "was cancelled" in page.locator("ul.messagelist li.success").inner_text()
    assert (
        durable.get_run(active).error["reason"]
        == "wrong input (cancelled by staff in the dashboard)"
    )

    page.click(".durable-actions >> text=Rerun")
    page.click("input[type=submit][value='Yes, rerun']")
    assert "was started again as run" in page.locator("ul.messagelist li.success").inner_text()
    assert Run.objects.filter(key="slow:1").count() == 2

    page.goto(f"{live_server.url}/admin/django_durable/run/{active}/history/")
    history = page.locator("#change-history").inner_text()
    assert "Cancel in the durable workflows dashboard. Reason: wrong input" in history
    assert "staff" in history
    context.close()


def test_bulk_cancel_of_1000_runs_matching_a_search(chromium, live_server, staff, shots):
    ids = {durable.start(SlowRetry, {"n": n}) for n in range(1000)}
    durable.start(SyncAccount, {})
    context, page = login(chromium, live_server, "staff")
    page.goto(f"{live_server.url}/admin/durable/runs/?q=workflow%3Aslow_retry")
    page.select_option("select[name=scope]", "all")
    page.click("button[name=action][value=cancel]")
    assert page.locator("#bulk-count strong").inner_text() == "1000"
    page.screenshot(path=str(shots / "bulk-confirm.png"))
    page.fill("input[name=reason]", "bad deploy")
    page.set_default_timeout(180_000)
    page.click("input[type=submit][value='Yes, cancel 1000 runs']")
    assert page.locator("#bulk-summary").inner_text() == "1000 of 1000 runs: cancel done."
    # The summary comes before the table in the page: wait for the whole table
    # (a 1,000-row answer may still be arriving when the summary shows).
    expect(page.locator("#bulk-outcomes tbody tr.durable-done")).to_have_count(1000, timeout=60_000)
    assert {r.status for r in Run.objects.filter(id__in=ids)} == {"cancelled"}
    assert Run.objects.filter(status="pending").count() == 1
    context.close()


def test_selected_runs_and_the_pause_while_selecting(chromium, live_server, staff, monkeypatch):
    monkeypatch.setattr(site, "REFRESH_SECONDS", 1)
    failed = [durable.start(SyncAccount, {"fail": True, "n": n}) for n in range(3)]
    drain()
    context, page = login(chromium, live_server, "staff")
    page.goto(f"{live_server.url}/admin/durable/runs/?status=failed")
    for run_id in failed[:2]:
        page.check(f"input[name=ids][value='{run_id}']")
    durable.start(SyncAccount, {"new": True})  # would change the list; the poll waits
    page.wait_for_timeout(2500)
    assert page.locator("input[name=ids]:checked").count() == 2
    page.click("button[name=action][value=retry]")
    assert page.locator("#bulk-count strong").inner_text() == "2"
    page.click("input[type=submit][value='Yes, retry 2 runs']")
    assert page.locator("#bulk-summary").inner_text() == "2 of 2 runs: retry done."
    assert [durable.get_run(i).status for i in failed] == ["pending", "pending", "failed"]
    context.close()


def test_answering_inputs_and_events_and_driving_schedules(
    chromium, live_server, staff, shots, define
):
    waiting = durable.start(DashOrder, {"order": 3}, key="order:3")
    event = durable.start(DashAwaitsEvent, {})

    def sign_off(self, ctx):
        return ctx.wait_for_input("sign_off", kind="approval", prompt="Ship order 3?")

    approval = durable.start(define("dash_sign_off", sign_off=step(sign_off)))
    drain()
    durable.schedule(SyncAccount, "0 3 * * *", key="nightly-sync", name="nightly")
    WorkerNode.objects.create(id="w1", hostname="box", pid=7, queues=[], heartbeat_at=now())
    ago = now() - timedelta(hours=2)
    WorkerNode.objects.create(
        id="w0", hostname="box", pid=6, queues=[], heartbeat_at=ago, started_at=ago, stopping=True
    )
    WorkerNode.objects.create(
        id="w-emails", hostname="box2", pid=9, queues=["emails"], heartbeat_at=ago, started_at=ago
    )
    context, page = login(chromium, live_server, "staff")

    page.goto(f"{live_server.url}/admin/durable/inputs/")
    page.screenshot(path=str(shots / "inputs.png"), full_page=True)
    card = page.locator(f"#pending-{waiting}")
    card.locator("textarea[name=json]").fill("true")
    card.locator("input[type=submit]").click()
    assert "got its input 'approval'" in page.locator("ul.messagelist li.success").inner_text()
    card = page.locator(f"#pending-{event}")
    card.locator("textarea[name=json]").fill('{"amount": 5}')
    card.locator("input[type=submit][value='Send event']").click()
    drain()
    assert durable.get_run(event).result == {"amount": 5}
    assert durable.get_run(waiting).waiting_for != "input:approval"
    card = page.locator(f"#pending-{approval}")
    assert card.locator(".durable-prompt").inner_text() == "Ship order 3?"
    card.locator("button[value=reject]").click()
    assert "got its input 'sign_off'" in page.locator("ul.messagelist li.success").inner_text()
    drain()
    assert durable.get_run(approval).result is False

    page.goto(f"{live_server.url}/admin/durable/schedules/")
    page.click("button:text('Disable')")
    assert "is disabled" in page.locator("ul.messagelist li.success").inner_text()
    page.click("button:text('Enable')")
    page.click("button:text('Trigger now')")
    assert "fired: run" in page.locator("ul.messagelist li.success").inner_text()
    page.screenshot(path=str(shots / "schedules.png"), full_page=True)

    page.goto(f"{live_server.url}/admin/durable/workers/")
    assert page.locator("#workers-table", has_text="every queue").is_visible()
    assert "shut down cleanly" in page.locator("#worker-w0").inner_text()
    assert "stopped heartbeating" in page.locator("#worker-w-emails").inner_text()
    page.screenshot(path=str(shots / "workers.png"), full_page=True)
    context.close()


def test_refused_users_see_the_login_page_or_a_styled_refusal(
    chromium, live_server, django_user_model
):
    run_id = durable.start(SyncAccount, {}, key="account:secret")
    django_user_model.objects.create_user("visitor", password=PASSWORD)
    viewer = django_user_model.objects.create_user("viewer", password=PASSWORD, is_staff=True)
    context = chromium.new_context()
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "viewer")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/$"))
    for address in _pages(live_server, [run_id]):
        response = page.goto(address)
        assert response.status == 403, address
        assert re.search(r"needs the django_durable\.(view|change)_run permission", page.content())
        assert "account:secret" not in page.content()
    viewer.user_permissions.add(Permission.objects.get(codename="view_run"))
    page.goto(f"{live_server.url}/admin/durable/runs/{run_id}/")
    assert page.locator(".durable-actions").count() == 0  # view_run only: nothing to click
    assert page.locator("#nav-sidebar").count() == 1  # the admin's own sidebar
    context.close()

    context = chromium.new_context()  # signed in, not staff: the admin's login page
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "visitor")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    for address in _pages(live_server, [run_id]):
        page.goto(address)
        assert "/admin/login/" in page.url and "account:secret" not in page.content()
    context.close()


def test_polls_pause_while_the_tab_is_hidden(chromium, live_server, staff, monkeypatch):
    monkeypatch.setattr(site, "REFRESH_SECONDS", 1)
    context, page = login(chromium, live_server, "staff")
    page.goto(f"{live_server.url}/admin/durable/keys/")
    polls = []
    page.on("request", lambda r: polls.append(r.url) if r.headers.get("hx-request") else None)
    with page.expect_request(lambda r: r.headers.get("hx-request") == "true"):
        pass  # polling while visible
    assert page.locator("#durable-refreshing.htmx-indicator").count() == 1
    hidden = "{configurable: true, get: () => 'hidden'}"
    page.evaluate(f"Object.defineProperty(document, 'visibilityState', {hidden})")
    page.wait_for_timeout(1500)  # a poll already on its way ends
    polls.clear()
    page.wait_for_timeout(3500)  # three ticks of the timer
    assert polls == []
    with page.expect_request(lambda r: r.headers.get("hx-request") == "true"):
        page.evaluate("delete document.visibilityState")  # visible again: polling resumes
    context.close()
