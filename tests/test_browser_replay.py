# ruff: noqa: F811  (the fixtures imported from tests.browser are arguments here)
"""The bulk rerun from a step in Debian's Chromium: select failed runs of one
workflow, choose the step, confirm the count, see each run's outcome."""

import pytest

import django_durable as durable
from django_durable.models import Run, Status
from django_durable.testing import drain
from tests.browser import chromium, login, shots, staff  # noqa: F401 (fixtures)
from tests.test_replay import BROKEN, FourSteps, broken  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def test_bulk_rerun_from_a_step(chromium, live_server, staff, shots, broken):
    failed = [durable.start(FourSteps, {"id": n}, key=f"order:{n}") for n in range(4)]
    drain(run_timers=True)
    assert {Run.objects.get(id=i).status for i in failed} == {Status.FAILED}
    BROKEN["charge"] = False  # the fix is deployed
    context, page = login(chromium, live_server, "staff")
    page.goto(f"{live_server.url}/admin/durable/runs/?q=workflow%3Areplay_four_steps")
    for run_id in failed[:3]:
        page.check(f"input[name=ids][value='{run_id}']")
    page.click("button[name=action][value=rerun-from-step]")
    assert page.locator("#bulk-count strong").inner_text() == "3"
    page.select_option("#bulk-rerun-step", "publish")
    page.fill("input[name=reason]", "the deploy broke step 3")
    page.screenshot(path=str(shots / "bulk-rerun-confirm.png"))
    page.click("input[type=submit][value='Yes, rerun 3 runs']")
    assert page.locator("#bulk-summary").inner_text() == "3 of 3 runs: rerun from step done."
    reruns = Run.objects.filter(rerun_of_id__in=failed)
    assert reruns.count() == 3 and {r.rerun_from_step for r in reruns} == {"publish"}
    # From a rerun's page to its original.
    rerun = reruns.first()
    page.goto(f"{live_server.url}/admin/durable/runs/{rerun.id}/")
    page.click(f"#rerun-of a[href*='{rerun.rerun_of_id}']")
    assert str(rerun.id) in page.locator("#reruns").inner_text()
    context.close()
    drain()
    assert {r.status for r in Run.objects.filter(rerun_of_id__in=failed)} == {Status.COMPLETED}


def test_bulk_rerun_of_runs_of_several_workflows_is_refused(chromium, live_server, staff):
    runs = [durable.start(FourSteps, {"id": 1}, key="o:1"), durable.start("sync_account", {})]
    context, page = login(chromium, live_server, "staff")
    page.goto(f"{live_server.url}/admin/durable/runs/")
    for run_id in runs:
        page.check(f"input[name=ids][value='{run_id}']")
    page.click("button[name=action][value=rerun-from-step]")
    assert "takes runs of one workflow" in page.locator(".errornote").first.inner_text()
    context.close()
