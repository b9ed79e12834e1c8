"""Every URL the dashboard has, walked by name: who may see it, who may act, and
the headers that forbid framing.

The names come from the URL patterns themselves, so a page added without an
entry in ``EXAMPLES`` fails here: each URL is asked as a full page and as an
htmx partial, by an anonymous user, a signed-in user who is not staff, staff
without ``view_run``, staff with ``view_run`` only, and a superuser."""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.urls import reverse

import django_durable as durable
from django_durable.admin import dashboard_admin
from django_durable.dashboard.urls import patterns
from django_durable.models import Run, Schedule
from django_durable.testing import drain
from tests.dashboard_workflows import DashOrder
from tests.testapp.workflows import SyncAccount

pytestmark = pytest.mark.django_db

SECRET = "account:secret-9"
HTMX = {"HX-Request": "true", "HX-Current-URL": "http://testserver/admin/durable/runs/"}

# name -> (arguments, POST data or None for a page, the permission it needs).
# "RUN" stands for a waiting run's id.
EXAMPLES = {
    "overview": ([], None, "view"),
    "keys": ([], None, "view"),
    "runs": ([], None, "view"),
    "run": (["RUN"], None, "view"),
    "value": (["RUN", "input"], None, "view"),
    "stream": (["RUN", "default"], None, "view"),
    "workflow": (["sync_account"], None, "view"),
    "inputs": ([], None, "view"),
    "schedules": ([], None, "view"),
    "workers": ([], None, "view"),
    "queues": ([], None, "view"),
    "run_action": (["RUN", "cancel"], {"reason": "x"}, "change"),
    "rerun_from_step": (["RUN"], {"from_step": "ship", "reason": "x"}, "change"),
    "rerun_with_input": (["RUN", 1], {"reason": "x"}, "change"),
    "bulk": ([], {"action": "cancel", "scope": "all", "confirm": "yes"}, "change"),
    "answer": (["RUN"], {"name": "approval", "wait": "input", "json": "true"}, "change"),
    "schedule_action": (["nightly", "disable"], {}, "change"),
    "queue_action": (["default", "pause"], {"reason": "x"}, "change"),
}


def test_every_url_name_has_an_example():
    names = {p.name for p in patterns(dashboard_admin())}
    assert names == set(EXAMPLES)


@pytest.fixture
def world():
    """A run waiting for input (its key and input hold SECRET) and a schedule."""
    run_id = durable.start(DashOrder, {"order": 9, "note": SECRET}, key=SECRET)
    drain()
    assert durable.get_run(run_id).status == "waiting"
    durable.schedule(SyncAccount, "0 3 * * *", key="nightly-sync", name="nightly")
    return run_id


def requests_of(run_id):
    """(label, method, url, data, headers, permission) for every URL, as a page
    and as an htmx request; the actions also as a POST."""
    for name, (args, data, perm) in EXAMPLES.items():
        address = reverse(
            f"django_durable:{name}", args=[run_id if a == "RUN" else a for a in args]
        )
        for headers in ({}, HTMX):
            kind = "htmx" if headers else "page"
            if data is None or name in ("run_action", "queue_action"):
                yield f"GET {name} ({kind})", "get", address, None, headers, perm
            if data is not None:
                yield f"POST {name} ({kind})", "post", address, data, headers, perm


def ask(client, method, address, data, headers):
    if method == "get":
        return client.get(address, headers=headers)
    return client.post(address, data, headers=headers)


def assert_not_framed(response, label):
    assert response["X-Frame-Options"] == "DENY", label
    assert response["Content-Security-Policy"] == "frame-ancestors 'none'", label


def assert_nothing_changed(run_id):
    assert durable.get_run(run_id).status == "waiting"
    assert Schedule.objects.get(name="nightly").enabled
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("who", ["anonymous", "not staff"])
def test_signed_out_and_non_staff_users_go_to_the_login_page(client, django_user_model, world, who):
    if who == "not staff":
        client.force_login(django_user_model.objects.create_user("visitor", password="pw"))
    login = reverse("admin:login")
    for label, method, address, data, headers, _perm in requests_of(world):
        response = ask(client, method, address, data, headers)
        assert_not_framed(response, label)
        assert SECRET not in response.content.decode(), label
        if headers:  # an htmx request: a full-page redirect, never the login form swapped in
            assert response.status_code == 204 and response.content == b"", label
            assert response["HX-Redirect"].startswith(f"{login}?next="), label
        else:
            assert response.status_code == 302, label
            assert response["Location"].startswith(f"{login}?next="), label
    assert_nothing_changed(world)


def test_staff_without_view_run_are_refused_every_url_and_partial(client, django_user_model, world):
    staff = django_user_model.objects.create_user("blind", password="pw", is_staff=True)
    client.force_login(staff)
    for label, method, address, data, headers, perm in requests_of(world):
        response = ask(client, method, address, data, headers)
        assert_not_framed(response, label)
        assert response.status_code == 403, label
        html = response.content.decode()
        assert SECRET not in html, label
        assert f"This needs the django_durable.{perm}_run permission." in html, label
    assert_nothing_changed(world)


def test_staff_with_view_run_only_may_look_but_not_act(client, django_user_model, world):
    staff = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_run"))
    client.force_login(staff)
    for label, method, address, data, headers, perm in requests_of(world):
        response = ask(client, method, address, data, headers)
        assert_not_framed(response, label)
        if perm == "view":
            assert response.status_code in (200, 204), label
        else:
            assert response.status_code == 403, label
            assert "This needs the django_durable.change_run permission." in (
                response.content.decode()
            ), label
    assert_nothing_changed(world)


def test_every_answer_to_a_superuser_forbids_framing(admin_client, world):
    """Pages, partials, confirmations (GET of an action, the first POST of a bulk
    action), the redirect after an action, and a download."""
    for label, method, address, data, headers, _perm in requests_of(world):
        if method == "post" and not label.startswith("POST bulk"):
            continue  # acting: the redirect is checked below
        if method == "post":
            data = {**data, "confirm": ""}  # the confirmation, not the act
        response = ask(admin_client, method, address, data, headers)
        assert response.status_code in (200, 204), (label, response.status_code)
        assert_not_framed(response, label)
    assert durable.get_run(world).status == "waiting"  # confirmations only
    toggle = reverse("django_durable:schedule_action", args=["nightly", "disable"])
    response = admin_client.post(toggle)
    assert response.status_code == 302
    assert_not_framed(response, "schedule toggle")
    response = admin_client.get(reverse("django_durable:value", args=[world, "input"]))
    assert response["Content-Disposition"].startswith("attachment")
    assert_not_framed(response, "download")


def test_every_action_is_refused_without_a_csrf_token(admin_user, world):
    """Each action of each kind (run, bulk, schedule, answer), POSTed by a
    superuser whose request lacks the CSRF token: 403, and nothing done."""
    from django.test import Client

    from django_durable.dashboard import actions, bulk, schedules

    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    posts = [(reverse("django_durable:run_action", args=[world, s]), {}) for s in actions.ACTIONS]
    posts += [
        (reverse("django_durable:bulk"), {"action": s, "scope": "all", "confirm": "yes"})
        for s in bulk.SLUGS
    ]
    posts += [
        (reverse("django_durable:schedule_action", args=["nightly", s]), {})
        for s in schedules.ACTIONS
    ]
    posts.append(
        (
            reverse("django_durable:answer", args=[world]),
            {"name": "approval", "wait": "input", "json": "true"},
        )
    )
    posts.append((reverse("django_durable:rerun_from_step", args=[world]), {"from_step": "x"}))
    posts.append((reverse("django_durable:rerun_with_input", args=[world, 1]), {}))
    assert len(posts) == 14
    for address, data in posts:
        response = client.post(address, data)
        assert response.status_code == 403, (address, data)
    assert_nothing_changed(world)
    assert Run.objects.filter(key="nightly-sync").count() == 0
