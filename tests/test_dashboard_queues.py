"""The dashboard's Queues page (each queue's numbers, Pause and Resume with a
confirmation and an entry in the admin history), and what pausing there does: a
paused queue's runs are not claimed, by drain() nor by a real worker process,
and are claimed again once it is resumed."""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.urls import reverse

import django_durable as durable
from django_durable.models import QueueState, Run, Status
from django_durable.testing import drain
from tests.helpers import fresh
from tests.testapp.workflows_queues import Limited, RunsInOrder, Unlimited
from tests.worker_processes import wait_until

pytestmark = pytest.mark.django_db

QUEUES = reverse("django_durable:queues")


def action_url(queue: str, action: str) -> str:
    return reverse("django_durable:queue_action", args=[queue, action])


def rows(html: str) -> dict[str, str]:
    """Each queue's row of the page, by name (the row's HTML)."""
    found = {}
    for part in html.split('<tr id="queue-')[1:]:
        name = part.split('data-queue="', 1)[1].split('"', 1)[0]
        found[name] = part.split("</tr>", 1)[0]
    return found


def test_every_queue_appears_from_settings_runs_and_pauses(admin_client, settings):
    settings.DURABLE = {"QUEUES": {"emails": {"concurrency": 5}, "reports": {}}}
    finished = durable.start(RunsInOrder, {"n": 1}, queue="bygone")
    drain(max_seconds=5)
    assert fresh(finished).status == Status.COMPLETED
    for _ in range(3):
        durable.start(Limited, {"seconds": 0})
    durable.pause_queue("frozen")

    html = admin_client.get(QUEUES).content.decode()
    shown = rows(html)
    # limited: runs due; bygone: only a finished run; frozen: paused, no run at all;
    # emails and reports: settings; other: a defined workflow's queue.
    assert {"limited", "bygone", "frozen", "emails", "reports", "other"} <= set(shown)
    assert '<td class="durable-claimable">3</td>' in shown["limited"]
    assert "paused" in shown["frozen"] and "Resume" in shown["frozen"]
    assert "Pause" in shown["limited"] and "paused" not in shown["limited"]
    assert "History" in shown["frozen"] and "History" not in shown["limited"]
    assert "<td>5</td>" in shown["emails"]  # its limit
    assert "none" in shown["reports"]  # configured without a limit
    assert 'href="/admin/durable/queues/"' in html and 'aria-current="page">Queues' in html


def test_the_overview_links_to_the_queues_page(admin_client):
    html = admin_client.get(reverse("django_durable:overview")).content.decode()
    assert f'href="{QUEUES}"' in html


def test_pause_asks_first_then_pauses_and_writes_the_history(admin_client, admin_user):
    durable.start(Limited, {"seconds": 0})
    page = admin_client.get(action_url("limited", "pause"))
    html = page.content.decode()
    assert page.status_code == 200
    assert "Pause queue" in html and "Yes, pause" in html and "No, go back" in html
    assert not QueueState.objects.filter(paused=True).exists()  # asking changes nothing

    done = admin_client.post(action_url("limited", "pause"), {"reason": "partner API down"})
    assert done.status_code == 302 and done["Location"] == QUEUES
    assert durable.queue_stats("limited")[0]["paused"] is True
    entry = LogEntry.objects.get()
    assert entry.user_id == admin_user.pk and entry.object_id == "limited"
    assert entry.change_message == (
        "Paused queue in the durable workflows dashboard. Reason: partner API down"
    )
    shown = rows(admin_client.get(QUEUES).content.decode())
    assert "paused" in shown["limited"] and "Resume" in shown["limited"]

    admin_client.post(action_url("limited", "resume"))
    assert durable.queue_stats("limited")[0]["paused"] is False
    assert LogEntry.objects.count() == 2
    assert LogEntry.objects.latest("id").change_message == (
        "Resumed queue in the durable workflows dashboard."
    )
    history = reverse("admin:django_durable_queuestate_history", args=["limited"])
    assert "Paused queue" in admin_client.get(history).content.decode()


def test_pausing_needs_change_run_and_seeing_needs_view_run(client, django_user_model):
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_run"))
    client.force_login(user)
    durable.start(Limited, {"seconds": 0})

    html = client.get(QUEUES).content.decode()
    assert "limited" in html and "Pause" not in html  # no button without change_run
    for method in (client.get, client.post):
        refused = method(action_url("limited", "pause"))
        assert refused.status_code == 403
        assert "django_durable.change_run" in refused.content.decode()
    assert not QueueState.objects.exists() and not LogEntry.objects.exists()

    user.user_permissions.add(Permission.objects.get(codename="change_run"))
    client.force_login(django_user_model.objects.get(pk=user.pk))
    assert client.post(action_url("limited", "pause")).status_code == 302
    assert durable.queue_stats("limited")[0]["paused"] is True


def test_anonymous_users_go_to_the_login_page(client):
    for url in (QUEUES, action_url("limited", "pause")):
        response = client.post(url) if "pause" in url else client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]
    assert not QueueState.objects.exists()


def test_a_bad_action_or_queue_name_is_404(admin_client):
    assert admin_client.get(action_url("limited", "drop")).status_code == 404
    assert admin_client.post(action_url("q" * 101, "pause")).status_code == 404
    assert not QueueState.objects.exists()


def test_a_queue_name_is_escaped(admin_client):
    hostile = "<script>alert(1)</script>"
    durable.pause_queue(hostile)
    for url in (QUEUES, action_url(hostile, "resume")):
        html = admin_client.get(url).content.decode()
        assert hostile not in html and "&lt;script&gt;" in html


def test_a_queue_paused_in_the_dashboard_is_not_drained_until_resumed(admin_client):
    admin_client.post(action_url("limited", "pause"))
    held = durable.start(Limited, {"seconds": 0})
    other = durable.start(Unlimited, {"seconds": 0})
    drain(max_seconds=5)
    assert fresh(other).status == Status.COMPLETED  # other queues keep flowing
    assert fresh(held).status == Status.PENDING

    admin_client.post(action_url("limited", "resume"))
    drain(max_seconds=5)
    assert fresh(held).status == Status.COMPLETED


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_leaves_a_paused_queue_alone_until_resumed(admin_client, workers):
    worker = workers.start("--worker-id", "pausing", "--queues", "limited,other", poll_seconds=0.2)
    assert admin_client.post(action_url("limited", "pause")).status_code == 302
    held = durable.start(Limited, {"seconds": 0})
    # Started after the held run: once the worker finished these, it has looked
    # for due runs since the held run was due, more than once.
    others = [durable.start(Unlimited, {"seconds": 0}) for _ in range(3)]
    for run_id in others:
        wait_until(
            lambda run_id=run_id: fresh(run_id).status == Status.COMPLETED,
            60,
            f"run {run_id} of the other queue to complete\n{worker.output()}",
        )
    later = durable.start(Unlimited, {"seconds": 0})
    wait_until(lambda: fresh(later).status == Status.COMPLETED, 60, "a later run to complete")
    run = fresh(held)
    assert (run.status, run.worker_id, run.started_at) == (Status.PENDING, None, None)

    assert admin_client.post(action_url("limited", "resume")).status_code == 302
    wait_until(lambda: fresh(held).status == Status.COMPLETED, 60, "the resumed run to complete")
    assert fresh(held).worker_id == "pausing"
    assert Run.objects.filter(status=Status.PENDING).count() == 0
