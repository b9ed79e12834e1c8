# ruff: noqa: F811  (the fixtures imported from tests.browser are arguments here)
"""The dashboard's layout in Chromium, as a new user meets it (issue 32, case 10):
the run page, its Key view and the runs list fit a 390-px phone (tables scroll in
their own box), keys, ids, queues and workflow names never wrap mid-word (each is
on one line, its full value on hover when cut), and the Release key button looks
like its neighbours on whichever Django runs (6.0 underlines links by default).

``DURABLE_SCREENSHOTS=docs/img`` writes the docs' pictures of these pages."""

import pytest

import django_durable as durable
from django_durable.models import WorkerNode
from django_durable.store import now
from django_durable.testing import drain
from tests.browser import chromium, login, shots, staff  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def traffic():
    """Articles 1 to 19 (some edited twice, a few failed), an invoice that keeps its key."""
    ids = {}
    for n in range(1, 20):
        ids[n] = durable.start(
            "process_article", {"id": n, "title": f"Article {n}"}, key=f"article:{n}"
        )
    for n in (2, 11, 19):
        durable.start("process_article", {"id": n, "title": "edited"}, key=f"article:{n}")
    failed = durable.start(
        "sync_account", {"fail": True, "note": "a long note " * 20}, key="account:acme-corp"
    )
    invoice = durable.start("send_invoice", {"id": 7, "amount": 120}, key="invoice:2026-12-07")
    drain()
    durable.start("process_article", {"id": 19, "title": "again"}, key="article:19")
    WorkerNode.objects.create(
        id="web-1.example.internal-4242-abcdef",
        hostname="web-1.example.internal",
        pid=4242,
        queues=["default", "emails"],
        heartbeat_at=now(),
    )
    return {"article": ids[19], "failed": failed, "invoice": invoice}


def fits(page) -> list:
    """What sticks out of the window: the page's own width, and any table whose right
    edge is past the window with no scrolling box of its own around it."""
    return page.evaluate(
        """() => {
            const width = document.documentElement.clientWidth;
            const found = [];
            if (document.documentElement.scrollWidth > width) {
                found.push('page ' + document.documentElement.scrollWidth + ' > ' + width);
            }
            for (const table of document.querySelectorAll('#content table')) {
                if (table.getBoundingClientRect().right <= width + 1) continue;
                let box = table.parentElement, scrolls = false;
                while (box && box !== document.body) {
                    const overflow = getComputedStyle(box).overflowX;
                    if (['auto', 'scroll', 'hidden'].includes(overflow)) {
                        scrolls = box.getBoundingClientRect().right <= width + 1;
                        break;
                    }
                    box = box.parentElement;
                }
                if (!scrolls) found.push('table ' + table.className + ' ' +
                    Math.round(table.getBoundingClientRect().right));
            }
            return found;
        }"""
    )


NAMES = (
    ".durable-runs td.durable-key code, .durable-runs td a[href*='/workflows/'], "
    ".durable-runs td a[href*='/runs/'], .durable-runs td .durable-clip, "
    "#keys-table td.durable-key code, #keys-table td a[href*='/workflows/'], "
    "#workers-table td:first-child code, #workers-table td:nth-child(5) code"
)


def broken_names(page, selector=NAMES) -> list:
    """Names (keys, ids, workflows, queues) whose text runs over more than one line,
    or is cut without the full value on hover."""
    return page.evaluate(
        """(selector) => {
            const found = [];
            for (const el of document.querySelectorAll(selector)) {
                const text = el.textContent.trim();
                if (!text) continue;
                const range = document.createRange();
                range.selectNodeContents(el);
                const tops = new Set([...range.getClientRects()]
                    .filter(r => r.width > 0).map(r => Math.round(r.top)));
                if (tops.size > 1) found.push('wrapped: ' + text);
                const cut = el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0;
                if (cut && el.title !== text && el.closest('[title]')?.title !== text) {
                    found.push('cut without title: ' + text);
                }
            }
            return found;
        }""",
        selector,
    )


@pytest.mark.parametrize("width", [1400, 1024])
def test_names_never_wrap_mid_word(chromium, live_server, staff, traffic, width):
    context, page = login(chromium, live_server, "staff", width=width, height=900)
    base = f"{live_server.url}/admin/durable"
    for path in ("/runs/", "/keys/", "/workers/", f"/runs/{traffic['article']}/"):
        page.goto(base + path)
        checked = page.evaluate(f"document.querySelectorAll({NAMES!r}).length")
        assert checked > 0, path
        assert broken_names(page) == [], (width, path)
    context.close()


def test_the_run_page_key_view_and_runs_list_fit_a_390px_phone(
    chromium, live_server, staff, traffic, shots
):
    context, page = login(chromium, live_server, "staff", width=390, height=844)
    base = f"{live_server.url}/admin/durable"
    for path in (
        f"/runs/{traffic['article']}/",
        f"/runs/{traffic['article']}/#key-view",
        f"/runs/{traffic['failed']}/",
        "/runs/",
        "/keys/",
        "/",
        "/workers/",
        "/workflows/process_article/",
    ):
        page.goto(base + path)
        assert fits(page) == [], path
        assert page.evaluate("document.documentElement.scrollWidth") <= 390, path
    page.goto(f"{base}/runs/{traffic['article']}/")
    page.screenshot(path=str(shots / "run-390.png"), full_page=True)
    page.locator("#key-view").screenshot(path=str(shots / "key-view-390.png"))
    page.goto(f"{base}/runs/{traffic['failed']}/")
    # The error is the first thing under the tabs, above the fold.
    error = page.locator("#run-error").bounding_box()
    assert error is not None and error["y"] < 844
    page.screenshot(path=str(shots / "failed-run-390.png"))
    context.close()


BUTTON = """(el) => {
    const s = getComputedStyle(el), box = el.getBoundingClientRect();
    return {decoration: s.textDecorationLine, top: Math.round(box.top),
            height: Math.round(box.height), middle: Math.round(box.top + box.height / 2),
            padding: s.paddingTop + ' ' + s.paddingLeft, display: s.display};
}"""


def test_the_release_key_button_is_styled_like_its_neighbours(
    chromium, live_server, staff, traffic, shots
):
    context, page = login(chromium, live_server, "staff", width=1280, height=900)
    page.goto(f"{live_server.url}/admin/durable/runs/{traffic['invoice']}/")
    actions = page.locator(".durable-actions .button")
    styles = [actions.nth(i).evaluate(BUTTON) for i in range(actions.count())]
    labels = [actions.nth(i).inner_text() for i in range(actions.count())]
    assert "Release key" in labels
    release = styles[labels.index("Release key")]
    assert release["decoration"] == "none", release
    assert {s["height"] for s in styles} | {release["height"]} == {release["height"]}, styles
    assert max(s["middle"] for s in styles) - min(s["middle"] for s in styles) <= 1, styles
    page.locator(".durable-summary").screenshot(path=str(shots / "run-actions.png"))

    page.click("text=Release key")
    page.wait_for_url("**/release-key/")
    submit = page.locator(".durable-confirm input[type=submit]").evaluate(BUTTON)
    back = page.locator(".durable-confirm a.button").evaluate(BUTTON)
    assert back["decoration"] == "none", back
    assert abs(submit["height"] - back["height"]) <= 1, (submit, back)
    assert abs(submit["middle"] - back["middle"]) <= 1, (submit, back)
    page.locator(".durable-confirm").screenshot(path=str(shots / "confirm-release-buttons.png"))
    context.close()


def test_the_banner_for_runs_no_live_worker_knows(chromium, live_server, staff, shots):
    WorkerNode.objects.create(
        id="web-1-old-code",
        hostname="web-1",
        pid=4242,
        queues=[],
        workflows=["sync_account", "send_invoice"],
        heartbeat_at=now(),
    )
    run_id = durable.start("process_article", {"id": 1}, key="article:1")
    durable.start("process_article", {"id": 2}, key="article:2")
    context, page = login(chromium, live_server, "staff", width=1280, height=900)
    banner = page.locator("#unknown-workflows")
    assert "process_article (2 pending runs)" in banner.inner_text()
    assert "restart them" in banner.inner_text()
    content, shown = page.locator("#content").bounding_box(), banner.bounding_box()
    top = shown["y"] + shown["height"] + 12 - content["y"]
    clip = {"x": content["x"], "y": content["y"], "width": content["width"], "height": top}
    page.screenshot(path=str(shots / "unknown-workflow.png"), clip=clip)
    page.goto(f"{live_server.url}/admin/durable/runs/{run_id}/")
    assert "No live worker knows workflow process_article" in page.inner_text("#content")
    context.close()
