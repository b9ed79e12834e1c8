# ruff: noqa: F811  (the fixtures imported from tests.browser are arguments here)
"""The dashboard in a real browser: Playwright drives Debian's Chromium against
pytest-django's live server.

Screenshots of each page go to a temporary directory, or to the directory in
DURABLE_SCREENSHOTS (``DURABLE_SCREENSHOTS=docs/img pytest tests/test_browser.py``
refreshes the README's pictures).
"""

import re

import pytest

import django_durable as durable
from django_durable import activity
from django_durable.dashboard import site
from django_durable.testing import drain
from tests.browser import PASSWORD, chromium, shots  # noqa: F401 (fixtures)
from tests.testapp.workflows import ProcessArticle, SendInvoice, SyncAccount

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def page(chromium, live_server, django_user_model):
    django_user_model.objects.create_superuser("staff", "staff@example.com", PASSWORD)
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/durable/")
    page.fill("#id_username", "staff")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/durable/$"))
    yield page
    context.close()


@pytest.fixture
def traffic():
    article = durable.start(ProcessArticle, {"id": 42, "title": "Draft"}, key="article:42")
    durable.start(ProcessArticle, {"id": 42, "title": "Final title"}, key="article:42")
    durable.start(ProcessArticle, {"id": 43, "title": "Other"}, key="article:43")
    invoice = durable.start(SendInvoice, {"id": 7, "amount": 120}, key="invoice:7")
    with pytest.raises(durable.KeyTaken):
        durable.start(SendInvoice, {"id": 7, "amount": 210}, key="invoice:7")
    failed = durable.start(SyncAccount, {"fail": True}, key="account:acme")
    for n in range(44, 50):
        durable.start(ProcessArticle, {"id": n}, key=f"article:{n}")
    for n in (44, 45, 47):
        durable.start(ProcessArticle, {"id": n, "title": "edited"}, key=f"article:{n}")
    drain()
    durable.start(ProcessArticle, {"id": 47}, key="article:47")
    durable.start(SyncAccount, {"id": 1}, key="account:globex")
    durable.start(SyncAccount, {"id": 1, "plan": "pro"}, key="account:globex")
    return {"article": article, "invoice": invoice, "failed": failed}


def test_keys_page_key_view_diff_and_key_search(page, live_server, traffic, shots):
    page.reload()
    page.screenshot(path=str(shots / "overview.png"), full_page=True)
    assert page.locator("h2", has_text="Runs by status").is_visible()

    page.click("nav.durable-tabs >> text=Keys")
    page.wait_for_url(re.compile(r"/admin/durable/keys/"))
    row = page.locator("#keys-table tr", has_text="article:42")
    cells = row.locator("td")
    assert cells.nth(3).inner_text() == "completed"  # the holder's status
    assert (cells.nth(4).inner_text(), cells.nth(5).inner_text()) == ("1", "1")  # runs, re-adds
    page.screenshot(path=str(shots / "keys.png"), full_page=True)

    # The invoice's holder: its Key view shows the dropped input as a diff.
    page.locator("#keys-table tr", has_text="invoice:7").locator("td").nth(2).locator("a").click()
    page.wait_for_url(re.compile(rf"/runs/{traffic['invoice']}/"))
    diff = page.locator("#key-view pre.durable-diff")
    diff.wait_for()
    assert diff.locator(".diff-remove", has_text='"amount": 120').count() == 1
    assert diff.locator(".diff-add", has_text='"amount": 210').count() == 1
    page.screenshot(path=str(shots / "run.png"), full_page=True)
    page.locator("#key-view").screenshot(path=str(shots / "key-view.png"))

    page.fill("nav.durable-tabs input[name=q]", "key:article:42")
    page.press("nav.durable-tabs input[name=q]", "Enter")
    page.wait_for_url(re.compile(r"/admin/durable/runs/\?q=key"))
    rows = page.locator("#runs-table tbody tr")
    assert rows.count() == 1
    assert str(traffic["article"])[:8] in rows.first.inner_text()
    page.screenshot(path=str(shots / "runs-search.png"), full_page=True)

    page.goto(f"{live_server.url}/admin/durable/workflows/process_article/")
    assert page.locator("#keys code", has_text="article:43").is_visible()
    page.screenshot(path=str(shots / "workflow.png"), full_page=True)


def test_release_a_key_and_see_the_result(page, live_server, traffic, shots):
    page.goto(f"{live_server.url}/admin/durable/runs/{traffic['failed']}/")
    page.click("text=Release key")
    page.wait_for_url(re.compile(r"/release-key/$"))
    page.screenshot(path=str(shots / "confirm-release.png"), full_page=True)
    page.click("input[type=submit][value='Yes, release key']")
    page.wait_for_url(re.compile(rf"/runs/{traffic['failed']}/$"))
    message = page.locator("ul.messagelist li.success")
    assert "was released" in message.inner_text()
    assert page.locator("#key-view", has_text="No run holds this key").is_visible()
    assert page.locator("#key-view .durable-history", has_text="key_released by staff").count()
    page.screenshot(path=str(shots / "released.png"), full_page=True)
    assert not durable.get_run(traffic["failed"]).holds_key
    (released,) = activity.list(kinds=["key_released"])
    assert released.details["by"] == "staff"

    # Releasing again is refused, with the reason.
    page.goto(f"{live_server.url}/admin/durable/runs/{traffic['failed']}/release-key/")
    refusal = page.locator(".durable-confirm .errornote").inner_text()
    assert refusal == "Release key would be refused: The run holds no key."


def test_keys_list_refreshes_itself_without_reloading(page, live_server, monkeypatch):
    monkeypatch.setattr(site, "REFRESH_SECONDS", 1)
    page.goto(f"{live_server.url}/admin/durable/keys/")
    page.evaluate("window.durableMarker = 'still here'")
    durable.start(SyncAccount, {"id": 99}, key="account:new-arrival")
    page.locator("#keys-table code", has_text="account:new-arrival").wait_for()
    assert page.evaluate("window.durableMarker") == "still here"  # no full page load
