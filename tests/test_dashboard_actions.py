"""The dashboard's actions: confirmation, CSRF, permissions, results and refusals."""

import re

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

import django_durable as durable
from django_durable import activity
from django_durable.models import Run
from django_durable.testing import drain
from tests.testapp.workflows import ProcessArticle, SendInvoice, SlowRetry, SyncAccount

pytestmark = pytest.mark.django_db


def action_url(run_id, action):
    return reverse("django_durable:run_action", args=[run_id, action])


def post(client, run_id, action, **data):
    response = client.post(action_url(run_id, action), data)
    messages = [str(m) for m in get_messages(response.wsgi_request)]
    return response, messages


@pytest.fixture
def failed_run():
    run_id = durable.start(SyncAccount, {"fail": True}, key="account:1")
    drain()
    assert durable.get_run(run_id).status == "failed"
    return run_id


def test_confirmation_of_a_refused_action_says_why_and_has_no_form(admin_client, failed_run):
    html = admin_client.get(action_url(failed_run, "cancel")).content.decode()
    assert "Cancel would be refused: The run already finished (failed)." in html
    assert '<form method="post">' not in html


@pytest.mark.parametrize("action", ["retry", "rerun", "release-key"])
def test_get_shows_a_confirmation_with_a_csrf_protected_form(admin_client, failed_run, action):
    html = admin_client.get(action_url(failed_run, action)).content.decode()
    assert '<form method="post">' in html and "csrfmiddlewaretoken" in html
    assert "Yes," in html and "No, go back" in html
    assert durable.get_run(failed_run).status == "failed"  # nothing happened yet


def test_retry_resumes_a_failed_run(admin_client, failed_run):
    response, messages = post(admin_client, failed_run, "retry", reason="fixed the API key")
    assert response.status_code == 302
    assert response["Location"] == reverse("django_durable:run", args=[failed_run])
    assert messages == [f"Run {failed_run} will be retried."]
    assert durable.get_run(failed_run).status == "pending"
    (entry,) = LogEntry.objects.all()
    assert entry.get_change_message() == (
        "Retry in the durable workflows dashboard. Reason: fixed the API key"
    )


def test_retry_offered_as_refused_when_a_newer_completed_run_keeps_the_key(admin_client):
    failed = durable.start(ProcessArticle, {"id": 8, "fail": True}, key="article:8")
    drain()
    newer = durable.start(ProcessArticle, {"id": 8}, key="article:8")  # after_failure: hand-off
    drain()
    page = admin_client.get(reverse("django_durable:run", args=[failed])).content.decode()
    assert f"Run {newer} (completed) holds the key and keeps it." in page
    _, messages = post(admin_client, failed, "retry")
    assert messages == [f"Retry refused: Run {newer} (completed) holds the key and keeps it."]
    assert durable.get_run(failed).status == "failed"


def test_retry_of_a_run_that_did_not_fail_is_refused_with_the_reason(admin_client):
    run_id = durable.start(SyncAccount, {}, key="account:2")
    response, messages = post(admin_client, run_id, "retry")
    assert response.status_code == 302
    assert messages == ["Retry refused: Only a failed run can be retried; this one is pending."]
    assert durable.get_run(run_id).status == "pending"


def test_rerun_starts_a_new_run_and_shows_it(admin_client):
    run_id = durable.start(ProcessArticle, {"id": 5, "fail": True}, key="article:5")
    drain()
    response, messages = post(admin_client, run_id, "rerun")
    new = Run.objects.exclude(id=run_id).get(key="article:5")
    assert response["Location"] == reverse("django_durable:run", args=[new.id])
    assert messages == [f"Run {run_id} was started again as run {new.id}."]


def test_rerun_refused_while_the_key_is_taken_says_release_first_and_writes_nothing(
    admin_client,
):
    run_id = durable.start(SendInvoice, {"id": 3}, key="invoice:3")
    drain()
    page = admin_client.get(reverse("django_durable:run", args=[run_id])).content.decode()
    assert "release the key first" in page and "disabled" in page  # offered as refused
    before = activity.list()
    response, messages = post(admin_client, run_id, "rerun")
    assert messages == [
        "Rerun refused: The key is held by this run (completed) and reuse='never' "
        "keeps it: release the key first."
    ]
    assert Run.objects.filter(key="invoice:3").count() == 1
    assert activity.list() == before  # no producer's key_duplicate
    assert not LogEntry.objects.exists()


def test_rerun_of_an_active_run_is_refused(admin_client):
    run_id = durable.start(SyncAccount, {}, key="account:3")
    _, messages = post(admin_client, run_id, "rerun")
    assert messages == ["Rerun refused: Only a finished run can be rerun; this one is pending."]


def test_cancel_records_the_reason(admin_client):
    run_id = durable.start(SlowRetry, {}, key="slow:1")
    _, messages = post(admin_client, run_id, "cancel", reason="<b>wrong input</b>")
    assert messages == [f"Run {run_id} was cancelled."]
    run = durable.get_run(run_id)
    assert run.status == "cancelled"
    assert run.error["reason"] == "<b>wrong input</b> (cancelled by admin in the dashboard)"
    (entry,) = LogEntry.objects.all()
    assert entry.user.get_username() == "admin" and entry.object_id == str(run_id)
    assert entry.change_message == (
        "Cancel in the durable workflows dashboard. Reason: <b>wrong input</b>"
    )
    html = admin_client.get(reverse("django_durable:run", args=[run_id])).content.decode()
    assert "<b>wrong input</b>" not in html and "&lt;b&gt;wrong input&lt;/b&gt;" in html


def test_cancel_of_a_finished_run_is_refused(admin_client, failed_run):
    _, messages = post(admin_client, failed_run, "cancel")
    assert messages == ["Cancel refused: The run already finished (failed)."]


def test_release_key_records_the_staff_user_as_by(admin_client, admin_user, failed_run):
    response, messages = post(admin_client, failed_run, "release-key")
    assert messages == [f"Key 'account:1' of run {failed_run} was released."]
    assert not durable.get_run(failed_run).holds_key
    (released,) = activity.list(kinds=["key_released"])
    assert released.details["by"] == admin_user.get_username()
    page = admin_client.get(response["Location"]).content.decode()
    assert f"key_released by {admin_user.get_username()}" in page


def test_release_key_refusals(admin_client):
    active = durable.start(SyncAccount, {}, key="account:4")
    _, messages = post(admin_client, active, "release-key")
    assert messages[0] == (
        "Release key refused: The run is still going: cancel it before releasing its key."
    )
    keyless = durable.start(SyncAccount, {})
    drain()
    _, messages = post(admin_client, keyless, "release-key")
    assert messages[-1] == "Release key refused: The run holds no key."


def test_unknown_action_and_unknown_run_are_404(admin_client, failed_run):
    assert admin_client.post(action_url(failed_run, "explode")).status_code == 404
    missing = "00000000-0000-0000-0000-000000000000"
    assert admin_client.post(action_url(missing, "retry")).status_code == 404


def test_actions_need_a_csrf_token(admin_user, failed_run):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    assert client.post(action_url(failed_run, "retry")).status_code == 403
    assert durable.get_run(failed_run).status == "failed"

    form = client.get(action_url(failed_run, "retry")).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    response = client.post(action_url(failed_run, "retry"), {"csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert durable.get_run(failed_run).status == "pending"


def test_actions_refuse_anonymous_and_non_staff_users(client, django_user_model, failed_run):
    response = client.post(action_url(failed_run, "retry"))
    assert response.status_code == 302 and "/login/" in response["Location"]
    # Not staff: the admin site sends them to its login page, as for its own pages.
    client.force_login(django_user_model.objects.create_user("visitor", password="pw"))
    response = client.post(action_url(failed_run, "retry"))
    assert response.status_code == 302 and "/login/" in response["Location"]
    assert durable.get_run(failed_run).status == "failed"


def test_staff_without_the_change_permission_may_look_but_not_act(
    client, django_user_model, failed_run
):
    staff = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_run"))
    client.force_login(staff)
    page = client.get(reverse("django_durable:run", args=[failed_run])).content.decode()
    assert action_url(failed_run, "retry") not in page  # no button offered
    refused = client.post(action_url(failed_run, "retry"))
    assert refused.status_code == 403
    assert "This needs the django_durable.change_run permission." in refused.content.decode()
    assert 'id="user-tools"' in refused.content.decode()  # a styled admin page
    assert durable.get_run(failed_run).status == "failed"

    staff.user_permissions.add(Permission.objects.get(codename="change_run"))
    client.force_login(django_user_model.objects.get(pk=staff.pk))
    assert client.post(action_url(failed_run, "retry")).status_code == 302
    assert durable.get_run(failed_run).status == "pending"
