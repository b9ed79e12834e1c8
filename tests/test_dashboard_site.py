"""The dashboard served by a project's own AdminSite: that site's login page,
header, breadcrumbs and sidebar, never ``admin.site``'s."""

import pytest
from django.core.checks import run_checks
from django.urls import reverse

import django_durable as durable
from django_durable.testing import drain
from tests.testapp.workflows import SyncAccount

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.urls_own_site")]


def test_visitors_go_to_the_own_sites_login_page(client):
    overview = reverse("django_durable:overview")
    assert overview == "/ops/durable/"
    response = client.get(overview)
    assert response.status_code == 302 and response["Location"].startswith("/ops/login/?next=")
    poll = client.get(overview, headers={"HX-Request": "true"})
    assert poll.status_code == 204 and poll["HX-Redirect"].startswith("/ops/login/?next=")


def test_pages_carry_the_own_sites_chrome_and_sidebar(admin_client):
    run_id = durable.start(SyncAccount, {"fail": True}, key="account:ops")
    drain()
    for address in (
        reverse("django_durable:overview"),
        reverse("django_durable:run", args=[run_id]),
        reverse("django_durable:run_action", args=[run_id, "retry"]),
    ):
        html = admin_client.get(address).content.decode()
        assert "Ops console" in html, address
        assert 'href="/ops/"' in html and 'href="/admin/"' not in html, address
        assert 'id="nav-sidebar"' in html and "/ops/django_durable/run/" in html, address
    response = admin_client.post(reverse("django_durable:run_action", args=[run_id, "retry"]))
    assert response["Location"] == reverse("django_durable:run", args=[run_id])
    assert durable.get_run(run_id).status == "pending"


def test_the_dashboard_checks_accept_an_own_site():
    ids = [m.id for m in run_checks()]
    assert "django_durable.E013" not in ids and "django_durable.E012" not in ids
