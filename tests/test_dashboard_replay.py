"""The dashboard's replay and repair: Rerun from step…, Rerun with this input, the
bulk rerun from a step, the links between a rerun and its original, the admin
history, and the workflow page's retention."""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.messages import get_messages
from django.urls import reverse

import django_durable as durable
from django_durable.models import Run, Status
from django_durable.testing import drain
from tests.helpers import fresh
from tests.test_replay import BROKEN, FourSteps, broken  # noqa: F401 (fixture)
from tests.testapp.workflows import ProcessArticle, SyncAccount

pytestmark = pytest.mark.django_db


def _failed(key="article:1", n=1):
    run_id = durable.start(FourSteps, {"id": n}, key=key)
    drain(run_timers=True)
    assert fresh(run_id).status == Status.FAILED
    return run_id


def _messages(response):
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_a_finished_runs_page_offers_rerun_from_each_step_it_began(admin_client, broken):  # noqa: F811
    run_id = _failed()
    html = admin_client.get(reverse("django_durable:run", args=[run_id])).content.decode()
    assert "Rerun from step…" in html
    form = html.split('class="durable-rerun-step"')[1].split("</form>")[0]
    assert [o for o in ("fetch", "charge", "publish", "notify") if f'"{o}"' in form] == [
        "fetch",
        "charge",
        "publish",
    ]  # notify was never begun


def test_rerun_from_step_confirms_then_reruns_and_links_both_ways(admin_client, broken):  # noqa: F811
    run_id = _failed()
    url = reverse("django_durable:rerun_from_step", args=[run_id])
    html = admin_client.get(url, {"from_step": "publish"}).content.decode()
    assert '<form method="post">' in html and 'value="publish" selected' in html
    assert Run.objects.count() == 1
    BROKEN["charge"] = False
    response = admin_client.post(url, {"from_step": "publish", "reason": "fixed the deploy"})
    new = Run.objects.get(rerun_of_id=run_id)
    assert response.status_code == 302
    assert response["Location"] == reverse("django_durable:run", args=[new.id])
    assert new.rerun_from_step == "publish" and new.step_index == 2
    entries = {e.object_id: e.get_change_message() for e in LogEntry.objects.all()}
    assert entries[str(run_id)] == (
        f"Rerun from step 'publish' as run {new.id} in the durable workflows dashboard. "
        "Reason: fixed the deploy"
    )
    assert entries[str(new.id)].startswith(f"Started by a rerun of run {run_id}")
    new_page = admin_client.get(reverse("django_durable:run", args=[new.id])).content.decode()
    assert 'id="rerun-of"' in new_page and str(run_id) in new_page.split('id="rerun-of"')[1][:300]
    old_page = admin_client.get(reverse("django_durable:run", args=[run_id])).content.decode()
    assert str(new.id) in old_page.split('id="reruns"')[1][:400]


def test_rerun_from_step_refused_shows_why_and_writes_nothing(admin_client, broken):  # noqa: F811
    run_id = _failed()
    url = reverse("django_durable:rerun_from_step", args=[run_id])
    html = admin_client.get(url, {"from_step": "notify"}).content.decode()
    assert "Rerun would be refused: run" in html and "never began step" in html
    response = admin_client.post(url, {"from_step": "notify"})
    assert response.status_code == 302 and "never began step 'notify'" in _messages(response)[0]
    running = durable.start(FourSteps, {"id": 2}, key="article:2")
    response = admin_client.post(
        reverse("django_durable:rerun_from_step", args=[running]), {"from_step": "fetch"}
    )
    assert "rerun takes a finished run" in _messages(response)[-1]
    assert Run.objects.count() == 2 and not LogEntry.objects.exists()


def test_rerun_with_a_dropped_input(admin_client, define):
    articles = define("articles_saved")  # reuse="after_close", on_duplicate="use_existing"
    run_id = durable.start(articles, {"id": 42, "title": "first"}, key="article:42")
    durable.start(articles, {"id": 42, "title": "last save"}, key="article:42")
    page = reverse("django_durable:run", args=[run_id])
    html = admin_client.get(page).content.decode()
    # Still going: the reason is shown, not the button.
    assert "Rerun with this input: refused:" in html and "rerun takes a finished run" in html
    drain()
    assert fresh(run_id).status == Status.COMPLETED
    html = admin_client.get(page).content.decode()
    link = html.split('class="durable-rerun-input"')[1].split('href="')[1].split('"')[0]
    assert "rerun-with-input" in link
    confirm = admin_client.get(link).content.decode()
    assert "last save" in confirm and '<form method="post">' in confirm
    response = admin_client.post(link, {"reason": "the editor's last save"})
    new = Run.objects.get(rerun_of_id=run_id)
    assert response["Location"] == reverse("django_durable:run", args=[new.id])
    assert new.input == {"id": 42, "title": "last save"}
    assert (
        LogEntry.objects.filter(object_id=str(run_id))
        .get()
        .get_change_message()
        .startswith("Rerun with the input of re-add")
    )


def test_rerun_with_a_dropped_input_refused_by_the_key_rules_shows_why(admin_client):
    run_id = durable.start(ProcessArticle, {"id": 7, "title": "first"}, key="article:7")
    durable.start(ProcessArticle, {"id": 7, "title": "last save"}, key="article:7")
    drain()  # completed: reuse="after_failure" keeps the key
    html = admin_client.get(reverse("django_durable:run", args=[run_id])).content.decode()
    offer = html.split('class="durable-rerun-input"')[1].split("</div>")[0]
    assert "refused:" in offer and "rerun-with-input" not in offer


def test_rerun_with_input_of_another_key_is_404(admin_client):
    durable.start(ProcessArticle, {"id": 1}, key="article:1")
    durable.start(ProcessArticle, {"id": 1, "t": 2}, key="article:1")
    other = durable.start(ProcessArticle, {"id": 2}, key="article:2")
    from django_durable import activity

    (readd,) = activity.list(kinds=["key_duplicate"])
    url = reverse("django_durable:rerun_with_input", args=[other, readd.id])
    assert admin_client.get(url).status_code == 404


def _bulk(client, **data):
    return client.post(reverse("django_durable:bulk"), data)


def test_bulk_rerun_from_a_step_counts_confirms_and_reruns(admin_client, broken):  # noqa: F811
    ids = [_failed(key=f"order:{n}", n=n) for n in range(3)]
    html = _bulk(
        admin_client, action="rerun-from-step", scope="selected", ids=[str(i) for i in ids]
    ).content.decode()
    assert "Rerun <strong>3</strong> runs of replay_four_steps" in html
    assert 'id="bulk-rerun-step"' in html and Run.objects.count() == 3
    BROKEN["charge"] = False
    html = _bulk(
        admin_client,
        action="rerun-from-step",
        scope="selected",
        ids=[str(i) for i in ids],
        from_step="publish",
        confirm="yes",
        reason="partner API back",
    ).content.decode()
    assert "<strong>3</strong> of 3 runs" in html
    assert Run.objects.filter(rerun_of_id__in=ids, rerun_from_step="publish").count() == 3
    assert LogEntry.objects.count() == 6


def test_bulk_rerun_of_several_workflows_is_refused(admin_client, broken):  # noqa: F811
    failed = _failed()
    other = durable.start(SyncAccount, {"fail": True}, key="acct:1")
    drain()
    html = _bulk(
        admin_client,
        action="rerun-from-step",
        scope="selected",
        ids=[str(failed), str(other)],
        from_step="publish",
        confirm="yes",
    ).content.decode()
    assert "takes runs of one workflow" in html
    assert Run.objects.count() == 2 and not LogEntry.objects.exists()


def test_the_workflow_page_says_what_is_kept_for_how_long(admin_client, define, settings):
    settings.DURABLE = {"RUN_RETENTION": durable.days(30)}
    define("kept_shown", retention={"completed": durable.days(7), "failed": None})
    html = admin_client.get(reverse("django_durable:workflow", args=["kept_shown"])).content
    section = html.decode().split('id="retention"')[1].split("</table>")[0]
    assert "completed</th><td>kept 7 days after the run finished" in section.replace("\n", "")
    assert "kept until pruned by hand" in section
    assert "(RUN_RETENTION)" in section


def test_the_flow_graph_of_a_rerun_from_a_step_carries_the_earlier_steps_over(
    admin_client,
    broken,  # noqa: F811
):
    run_id = _failed()
    BROKEN["charge"] = False
    new_id = durable.rerun(run_id, from_step="publish")
    drain(run_timers=True)
    assert fresh(new_id).status == Status.COMPLETED
    html = admin_client.get(reverse("django_durable:run", args=[new_id])).content.decode()
    assert "all 4 steps done" in html
    graph = html.split('id="flow-graph"')[1].split("</ol>")[0]
    nodes = graph.split('<li class="durable-node">')[1:]
    assert len(nodes) == 4
    original = reverse("django_durable:run", args=[run_id])
    for node in nodes[:2]:  # fetch and charge: done by the original, not run again
        assert "durable-node-carried" in node and "pending" not in node
        assert f'carried over from <a href="{original}"' in node
        assert f">run {str(run_id)[:8]}</a>" in node
    for node in nodes[2:]:  # publish and notify ran in the rerun
        assert "durable-node-completed" in node and "carried" not in node
    # The original's own graph is what it did: its steps are not carried from anywhere.
    html = admin_client.get(original).content.decode()
    assert "carried" not in html.split('id="flow-graph"')[1].split("</ol>")[0]
