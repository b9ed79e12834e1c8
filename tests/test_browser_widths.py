# ruff: noqa: F811  (the fixtures imported from tests.browser are arguments here)
"""The columns people read fit, in Chromium: at 1280x800 with the admin's sidebar
open, the runs list's *Finished*, the overview's Recent key activity *Key* and the
workers' *Started* lie inside their table's box, header and cells; at 390x844 the
Key view's diff and the Queues page's *Pause* button are on screen, or inside a
box that scrolls sideways and shows that it does (its shadow cue). Screenshots go
to ``DURABLE_SCREENSHOTS`` when it is set."""

from __future__ import annotations

from datetime import timedelta

import pytest

import django_durable as durable
from django_durable.models import WorkerNode
from django_durable.store import now
from django_durable.testing import drain
from tests.browser import chromium, login, shots, staff  # noqa: F401 (fixtures)
from tests.dashboard_workflows import DashOrder
from tests.testapp.workflows import SyncAccount

pytestmark = pytest.mark.django_db(transaction=True)

# Keys and names as a project writes them: long enough to be cut if nothing fits.
KEYS = [f"customer:acme-industries:invoice:2026-12-{n:02d}" for n in range(1, 7)]


@pytest.fixture
def busy():
    """Finished, failed and waiting runs with long keys, a re-add of a key with a
    different input (a diff in the Key view), and two workers."""
    runs = [durable.start(SyncAccount, {"n": n}, key=key) for n, key in enumerate(KEYS)]
    failed = durable.start(SyncAccount, {"fail": True, "n": 99}, key="customer:acme:failing")
    key = "order:2026-12-07:7"
    order = durable.start(DashOrder, {"order": 7, "fail_ship": True}, key=key)
    drain()
    durable.start(DashOrder, {"order": 7, "note": "a different input " * 4}, key=key)
    for n in range(2):
        WorkerNode.objects.create(
            id=f"worker-ip-10-0-12-{n}.eu-west-1.compute.internal-{4242 + n}",
            hostname=f"ip-10-0-12-{n}.eu-west-1.compute.internal",
            pid=4242 + n,
            queues=["default", "flow", "emails"],
            concurrency=8,
            heartbeat_at=now(),
            started_at=now() - timedelta(hours=3),
        )
    return {"runs": runs, "failed": failed, "order": order}


COLUMN = """([table, header]) => {
    const found = document.querySelector(table);
    const heads = [...found.querySelectorAll('thead th')];
    const index = heads.findIndex(th => th.textContent.trim().startsWith(header));
    if (index < 0) return {error: 'no column ' + header};
    const box = found.closest('.durable-scroll') || found.parentElement;
    const right = Math.min(box.getBoundingClientRect().right,
                           document.documentElement.clientWidth);
    const rows = [...found.querySelectorAll('tbody tr')].filter(tr => tr.children.length > index);
    const cells = [heads[index], ...rows.map(tr => tr.children[index])];
    return {
        right,
        cells: cells.map(cell => ({
            text: cell.textContent.trim().slice(0, 40),
            right: cell.getBoundingClientRect().right,
            clipped: [...cell.querySelectorAll('*'), cell].some(
                e => e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflow !== 'visible'
                     && !e.classList.contains('durable-clip')),
        })),
    };
}"""


def assert_column_fits(page, table: str, header: str) -> None:
    found = page.evaluate(COLUMN, [table, header])
    assert "error" not in found, found
    assert len(found["cells"]) > 1, found  # the header and at least one row
    out = [c for c in found["cells"] if c["right"] > found["right"] + 1 or c["clipped"]]
    assert not out, (table, header, found["right"], out)


def sidebar_open(page) -> bool:
    return page.evaluate(
        "() => { const s = document.querySelector('#nav-sidebar');"
        " return !!s && s.getBoundingClientRect().width > 100; }"
    )


@pytest.mark.parametrize(
    ("address", "table", "header"),
    [
        ("/runs/", "#runs-table table", "Finished"),
        ("/", "#key-activity table", "Key"),
        ("/workers/", "#workers-table table", "Started"),
    ],
)
def test_the_columns_people_read_fit_at_1280_with_the_sidebar_open(
    chromium, live_server, staff, busy, shots, address, table, header
):
    context, page = login(chromium, live_server, "staff", width=1280, height=800)
    page.goto(f"{live_server.url}/admin/durable{address}")
    assert sidebar_open(page)
    page.screenshot(path=str(shots / f"width-1280{address.replace('/', '-')}.png"), full_page=True)
    assert_column_fits(page, table, header)
    context.close()


REACHABLE = """(selector) => {
    const target = document.querySelector(selector);
    const width = document.documentElement.clientWidth;
    const rect = target.getBoundingClientRect();
    if (rect.left >= 0 && rect.right <= width + 1) return {visible: true};
    let box = target.parentElement;
    while (box && !(box.scrollWidth > box.clientWidth + 1
                    && ['auto', 'scroll'].includes(getComputedStyle(box).overflowX))) {
        box = box.parentElement;
    }
    if (!box) return {visible: false, scrolls: false, right: rect.right, width};
    // The cue: the box's edge shadows, not hidden under opaque rows.
    const shadows = getComputedStyle(box).backgroundImage.includes('radial-gradient');
    const row = box.querySelector('tbody tr');
    const clear = !row || getComputedStyle(row).backgroundColor === 'rgba(0, 0, 0, 0)';
    return {
        visible: false,
        scrolls: box.getBoundingClientRect().right <= width + 1,
        cue: shadows && clear,
    };
}"""


def test_the_pause_button_and_the_key_views_diff_are_reachable_at_390(
    chromium, live_server, staff, busy, shots
):
    context, page = login(chromium, live_server, "staff", width=390, height=844)
    page.goto(f"{live_server.url}/admin/durable/queues/")
    pause = page.locator("#queues-table a.button", has_text="Pause").first
    pause.wait_for()
    reach = page.evaluate(REACHABLE, "#queues-table a.button")
    assert reach["visible"] or (reach["scrolls"] and reach["cue"]), reach
    page.locator("#queues-table").screenshot(path=str(shots / "width-390-queues-cue.png"))
    pause.scroll_into_view_if_needed()
    assert pause.is_visible()
    page.screenshot(path=str(shots / "width-390-queues.png"), full_page=True)

    page.goto(f"{live_server.url}/admin/durable/runs/{busy['order']}/#key-view")
    diff = page.locator("#key-view .durable-diff").first
    diff.wait_for()
    reach = page.evaluate(REACHABLE, "#key-view .durable-diff")
    assert reach["visible"] or (reach["scrolls"] and reach["cue"]), reach
    page.locator("#key-view").screenshot(path=str(shots / "width-390-key-view.png"))
    context.close()
