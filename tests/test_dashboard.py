"""The dashboard's pages, with Django's test client: content, htmx partials,
permissions and escaping. Actions are in test_dashboard_actions.py."""

import re

import pytest
from django.urls import reverse

import django_durable as durable
from django_durable.models import Run
from django_durable.testing import drain
from tests.testapp.workflows import ProcessArticle, SendInvoice, SyncAccount

pytestmark = pytest.mark.django_db

SCRIPT_KEY = "<script>alert(1)</script>"


@pytest.fixture
def traffic():
    """A little of everything: a dropped input, a KeyTaken, a failure, a released key."""
    article = durable.start(ProcessArticle, {"id": 42, "title": "First"}, key="article:42")
    durable.start(ProcessArticle, {"id": 42, "title": "Second"}, key="article:42")
    invoice = durable.start(SendInvoice, {"id": 7}, key="invoice:7")
    with pytest.raises(durable.KeyTaken):
        durable.start(SendInvoice, {"id": 7, "amount": 99}, key="invoice:7")
    failed = durable.start(SyncAccount, {"fail": True}, key="account:1")
    drain()
    released = durable.start(SyncAccount, {"id": 2}, key="account:2")
    drain()
    durable.release_key(released, by="ops")
    return {"article": article, "invoice": invoice, "failed": failed, "released": released}


def page(client, name, *args, **params):
    response = client.get(reverse(f"django_durable:{name}", args=args), params)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def test_overview_counts_statuses_and_shows_activity(admin_client, traffic):
    html = page(admin_client, "overview")
    assert "Runs by status" in html and "Recent key activity" in html
    assert "key_duplicate" in html and "key_released" in html
    assert "process_article" in html and "dropped inputs" in html


def test_keys_page_lists_every_key_with_holder_runs_and_readds(admin_client, traffic):
    html = page(admin_client, "keys")
    for key in ("article:42", "invoice:7", "account:1", "account:2"):
        assert f'title="{key}">{key}</code>' in html
    holder_link = reverse("django_durable:run", args=[traffic["article"]])
    assert holder_link in html
    assert "released" in html  # account:2 has no holder


def test_keys_page_filters_by_workflow_status_and_key(admin_client, traffic):
    html = page(admin_client, "keys", workflow="sync_account")
    assert (
        'title="account:1">account:1</code>' in html
        and 'title="article:42">article:42</code>' not in html
    )
    html = page(admin_client, "keys", status="failed")
    assert (
        'title="account:1">account:1</code>' in html
        and 'title="account:2">account:2</code>' not in html
    )
    assert 'title="invoice:7">invoice:7</code>' not in html
    html = page(admin_client, "keys", status="none")
    assert (
        'title="account:2">account:2</code>' in html
        and 'title="account:1">account:1</code>' not in html
    )
    html = page(admin_client, "keys", q="inv")
    assert (
        'title="invoice:7">invoice:7</code>' in html
        and 'title="article:42">article:42</code>' not in html
    )


def test_keys_page_paginates(admin_client):
    for n in range(55):
        durable.start(SyncAccount, {"id": n}, key=f"account:{n:03}")
    first = page(admin_client, "keys")
    assert "account:049" in first and "account:050" not in first and 'rel="next"' in first
    second = page(admin_client, "keys", page=2)
    assert "account:050" in second and "account:054" in second and 'rel="prev"' in second


def test_lists_answer_htmx_polls_with_a_partial_or_204_when_unchanged(admin_client, traffic):
    for name, marker in (
        ("keys", 'id="keys-table"'),
        ("runs", 'id="runs-table"'),
        ("overview", "Runs by status"),
        ("inputs", 'id="pending-inputs"'),
        ("schedules", 'id="schedules-table"'),
        ("workers", 'id="workers-table"'),
    ):
        url = reverse(f"django_durable:{name}")
        full = admin_client.get(url).content.decode()
        assert "<html" in full and marker in full and 'hx-trigger="every' in full
        assert "document.visibilityState" in full  # polls pause in background tabs
        partial = admin_client.get(url, headers={"HX-Request": "true"}).content.decode()
        assert "<html" not in partial and marker in partial
        assert partial.startswith('<div id="durable-live"')
        seen = re.search(r'"_seen": "([0-9a-f]+)"', partial).group(1)
        again = admin_client.get(url, {"_seen": seen}, headers={"HX-Request": "true"})
        assert again.status_code == 204, name
    assert "django_durable/htmx.min.js" in full


def test_runs_search_understands_key_status_and_workflow(admin_client, traffic):
    html = page(admin_client, "runs", q="key:article:42")
    assert str(traffic["article"])[:8] in html and str(traffic["invoice"])[:8] not in html
    html = page(admin_client, "runs", q="status:failed")
    assert str(traffic["failed"])[:8] in html and str(traffic["article"])[:8] not in html
    html = page(admin_client, "runs", q="workflow:send_invoice")
    assert str(traffic["invoice"])[:8] in html and str(traffic["failed"])[:8] not in html
    html = page(admin_client, "runs", q=f"{traffic['released']}")
    assert str(traffic["released"])[:8] in html and str(traffic["article"])[:8] not in html
    html = page(admin_client, "runs", q="status:nonsense")
    assert "unknown status" in html and "No runs match." in html  # not every run


def test_runs_list_filters(admin_client, traffic):
    html = page(admin_client, "runs", workflow="sync_account", status="completed")
    assert str(traffic["released"])[:8] in html and str(traffic["failed"])[:8] not in html
    html = page(admin_client, "runs", queue="default", created_after="2000-01-01")
    assert str(traffic["article"])[:8] in html
    html = page(admin_client, "runs", created_before="2000-01-01")
    assert "No runs match." in html
    html = page(admin_client, "runs", created_after="not a date")
    assert "Enter a valid date." in html and "No runs match." in html


def test_run_page_shows_summary_steps_context_and_errors(admin_client, traffic):
    html = page(admin_client, "run", traffic["failed"])
    assert "Summary" in html and "Attempts" in html and "Context" in html
    assert 'id="timeline"' in html and 'id="flow-graph"' in html
    assert "sync failed" in html and "RuntimeError" in html
    assert reverse("django_durable:run_action", args=[traffic["failed"], "retry"]) in html
    html = page(admin_client, "run", traffic["article"])
    assert "fetch" in html and "summarize" in html and "body of 42" in html


def test_key_view_shows_readds_the_dropped_input_as_a_diff_and_every_run(admin_client, traffic):
    html = page(admin_client, "run", traffic["invoice"])
    assert 'id="key-view"' in html and "Re-adds" in html
    assert "dropped" in html and '<pre class="durable-diff">' in html
    assert '<span class="diff-add">+  &quot;amount&quot;: 99,</span>' in html
    assert "Every run with this key" in html and "holder</span>" in html


def test_workflow_page_has_a_keys_section(admin_client, traffic):
    html = page(admin_client, "workflow", "process_article")
    assert 'id="keys"' in html and 'title="article:42">article:42</code>' in html
    assert "after_failure" in html and "Definition" in html
    response = admin_client.get(reverse("django_durable:workflow", args=["no_such_workflow"]))
    assert response.status_code == 404


def test_unknown_run_is_404(admin_client):
    url = reverse("django_durable:run", args=["00000000-0000-0000-0000-000000000000"])
    assert admin_client.get(url).status_code == 404


ALL_PAGES = [
    ("overview", []),
    ("keys", []),
    ("runs", []),
    ("workflow", ["process_article"]),
]


@pytest.mark.parametrize(("name", "args"), ALL_PAGES)
def test_anonymous_users_are_sent_to_the_login_page(client, name, args):
    url = reverse(f"django_durable:{name}", args=args)
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login") + "?next=")


@pytest.mark.parametrize(("name", "args"), ALL_PAGES)
def test_users_who_are_not_staff_go_to_the_login_page(client, django_user_model, name, args):
    user = django_user_model.objects.create_user("visitor", password="pw")
    client.force_login(user)
    response = client.get(reverse(f"django_durable:{name}", args=args))
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_a_hostile_key_and_input_are_escaped_everywhere(admin_client):
    holder = durable.start(SendInvoice, {"note": "<b>kept</b>"}, key=SCRIPT_KEY)
    with pytest.raises(durable.KeyTaken):
        durable.start(SendInvoice, {"note": "<img src=x onerror=alert(2)>"}, key=SCRIPT_KEY)
    pages = [
        page(admin_client, "keys"),
        page(admin_client, "runs", q=f"key:{SCRIPT_KEY}"),
        page(admin_client, "run", holder),
        page(admin_client, "overview"),
        page(admin_client, "workflow", "send_invoice"),
    ]
    for html in pages:
        assert SCRIPT_KEY not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    run_page = pages[2]
    assert "<img src=x" not in run_page and "<b>kept</b>" not in run_page
    assert "&lt;img src=x onerror=alert(2)&gt;" in run_page  # in the diff, escaped
    assert str(holder)[:8] in pages[1]


def test_admin_index_links_to_the_dashboard(admin_client):
    html = admin_client.get(reverse("admin:index")).content.decode()
    for name in ("overview", "keys", "runs"):
        assert f'href="{reverse(f"django_durable:{name}")}"' in html


def test_admin_keys_entry_opens_the_keys_page(admin_client):
    response = admin_client.get(reverse("admin:django_durable_heldkey_changelist"))
    assert response.status_code == 302 and response["Location"] == reverse("django_durable:keys")


def test_admin_registrations_render(admin_client, traffic):
    for name in ("run", "activity", "schedule", "workernode"):
        url = reverse(f"admin:django_durable_{name}_changelist")
        assert admin_client.get(url).status_code == 200, name
    url = reverse("admin:django_durable_run_changelist")
    html = admin_client.get(url, {"q": "key:article:42"}).content.decode()
    assert str(traffic["article"]) in html and str(traffic["invoice"]) not in html
    change = reverse("admin:django_durable_run_change", args=[traffic["article"]])
    html = admin_client.get(change).content.decode()
    assert "article:42" in html and 'name="_save"' not in html  # read-only
    assert Run.objects.filter(id=traffic["article"]).exists()


def test_keys_page_query_count_does_not_grow_with_keys(admin_client, django_assert_max_num_queries):
    for n in range(40):
        durable.start(SyncAccount, {"id": n}, key=f"account:{n}")
        durable.start(SyncAccount, {"id": n, "v": 2}, key=f"account:{n}")
    # session + user, the page of keys, its holders, its re-adds
    with django_assert_max_num_queries(5):
        admin_client.get(reverse("django_durable:keys"))
