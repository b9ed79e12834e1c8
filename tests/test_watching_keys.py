"""list_keys(), stats.keys() and the query plans behind them."""

from datetime import timedelta

import pytest
from django.utils import timezone

import django_durable as durable
from django_durable import query, stats
from django_durable.models import Activity, Run
from django_durable.testing import drain
from tests.keys_table_sql import fill_keys_table
from tests.testapp.workflows import ProcessArticle, SendInvoice, SyncAccount

pytestmark = pytest.mark.django_db


def test_list_keys_gives_holder_runs_and_readds():
    first = durable.start(ProcessArticle, {"id": 1, "fail": True}, key="article:1")
    drain()
    second = durable.start(ProcessArticle, {"id": 1}, key="article:1")  # after_failure
    durable.start(ProcessArticle, {"id": 1, "v": 2}, key="article:1")  # re-add
    durable.start(ProcessArticle, {"id": 2}, key="article:2")
    durable.start(SyncAccount, {"id": 7}, key="account:7")

    rows = query.list_keys("process_article")
    assert rows == [
        {
            "workflow": "process_article",
            "key": "article:1",
            "runs": 2,
            "holder_id": second,
            "holder_status": "pending",
            "readds_last_day": 1,
        },
        {
            "workflow": "process_article",
            "key": "article:2",
            "runs": 1,
            "holder_id": durable.start(ProcessArticle, {"id": 2}, key="article:2"),
            "holder_status": "pending",
            "readds_last_day": 0,
        },
    ]
    assert first != second
    every = query.list_keys()
    assert [(r["workflow"], r["key"]) for r in every] == [
        ("process_article", "article:1"),
        ("process_article", "article:2"),
        ("sync_account", "account:7"),
    ]


def test_released_key_has_no_holder_and_old_readds_do_not_count():
    run_id = durable.start(SyncAccount, {"id": 1}, key="account:1")
    drain()
    durable.release_key(run_id, by="ops@example.com")
    Activity.objects.create(
        kind="key_duplicate",
        workflow="sync_account",
        key="account:1",
        details={"outcome": "use_existing"},
        created_at=Run.objects.get(id=run_id).created_at - timedelta(days=2),
    )
    (row,) = query.list_keys("sync_account")
    assert row["holder_id"] is None and row["holder_status"] is None
    assert row["runs"] == 1 and row["readds_last_day"] == 0


def test_keys_queryset_filters_by_holder_status_and_prefix():
    durable.start(SyncAccount, {"id": 1}, key="account:1")
    failed = durable.start(SyncAccount, {"fail": True}, key="account:2")
    drain()
    released = durable.start(SyncAccount, {"id": 3}, key="other:3")
    durable.cancel(released)
    durable.release_key(released)
    assert Run.objects.get(id=failed).status == "failed"

    def keys(**kwargs):
        return [row["key"] for row in query.keys_queryset(**kwargs)]

    assert keys(holder_status="failed") == ["account:2"]
    assert keys(holder_status="none") == ["other:3"]
    assert keys(search="account:") == ["account:1", "account:2"]
    assert keys(workflow_name="process_article") == []


def test_stats_keys_counts_readds_dropped_inputs_and_handoffs():
    holder = durable.start(ProcessArticle, {"id": 1}, key="article:1")
    durable.start(ProcessArticle, {"id": 1}, key="article:1")  # same input: not dropped
    durable.start(ProcessArticle, {"id": 1, "title": "new"}, key="article:1")  # dropped
    durable.start(SendInvoice, {"id": 9}, key="invoice:9")
    with pytest.raises(durable.KeyTaken):
        durable.start(SendInvoice, {"id": 9, "amount": 2}, key="invoice:9")  # dropped
    durable.start(SyncAccount, {"id": 5}, key="account:5")
    # run_again on a holder no worker picked up: the holder takes the newer input.
    durable.start(SyncAccount, {"id": 5, "n": 2}, key="account:5", on_duplicate="run_again")
    drain()
    durable.start(SyncAccount, {"id": 5}, key="account:5")  # the finished holder hands off

    numbers = stats.keys()
    assert numbers["keys_held"] == 3
    assert numbers["readds_by_outcome"] == {"use_existing": 2, "error": 1, "run_again": 1}
    assert numbers["dropped_inputs"] == 2
    assert numbers["handoffs"] == 1
    assert numbers["top_readded_keys"][0] == {
        "workflow": "process_article",
        "key": "article:1",
        "readds": 2,
    }
    buckets = numbers["readds_over_time"]
    assert len(buckets) == 24 and sum(b["count"] for b in buckets) == 4
    assert all(b["at"] < c["at"] for b, c in zip(buckets, buckets[1:], strict=False))
    assert buckets[-1]["count"] == 4

    one = stats.keys(workflow="process_article")
    assert one["readds_by_outcome"] == {"use_existing": 2}
    assert one["dropped_inputs"] == 1 and one["handoffs"] == 0
    assert one["keys_held"] == 1
    assert durable.get_run(holder).holds_key


def test_stats_of_an_empty_database():
    numbers = stats.keys()
    assert numbers["keys_held"] == 0
    assert numbers["readds_by_outcome"] == {} and numbers["top_readded_keys"] == []
    assert numbers["dropped_inputs"] == 0 and numbers["handoffs"] == 0


def test_a_page_of_keys_costs_three_queries(django_assert_num_queries):
    for n in range(30):
        durable.start(SyncAccount, {"id": n}, key=f"account:{n:02}")
        durable.start(SyncAccount, {"id": n, "again": True}, key=f"account:{n:02}")
    with django_assert_num_queries(3):
        page = query.describe_keys(query.keys_queryset()[:25])
    assert len(page) == 25 and all(row["readds_last_day"] == 1 for row in page)


@pytest.fixture
def big_table():
    """20,000 runs and their re-adds, analysed, so the planner chooses as it would
    on a big table (bench/keys_table.py times a million)."""
    fill_keys_table(20_000, 6_000)


def _plan(queryset) -> str:
    return queryset.explain()


@pytest.mark.postgres
def test_a_page_of_keys_walks_the_workflow_key_index(big_table):
    page = query.keys_queryset()[:50]
    plan = _plan(page)
    assert "Index Only Scan using durable_run_workflow_key" in plan, plan
    assert "Sort" not in plan, plan  # grouped in index order: a page reads only its rows
    rows = query.describe_keys(page)
    keys = [row["key"] for row in rows]
    holders = Run.objects.filter(holds_key=True, workflow__in=["workflow_1"], key__in=keys)
    assert "durable_run_one_holder_per_key" in _plan(holders.order_by())


@pytest.mark.postgres
def test_holder_status_filter_reads_the_held_status_index(big_table):
    plan = _plan(query.keys_queryset(holder_status="failed")[:50])
    assert "durable_run_held_status" in plan, plan


@pytest.mark.postgres
def test_key_lookups_use_indexes(big_table):
    assert "durable_run_key" in _plan(durable.list_executions(key="item:42"))
    assert "durable_run_key" in _plan(Run.objects.filter(key__startswith="item:42"))
    readds = query.readds("workflow_1", "item:1", since=timezone.now() - timedelta(days=1))
    assert "durable_activity_readds" in _plan(readds.order_by())


def test_list_executions_by_key_marks_the_holder():
    failed = durable.start(ProcessArticle, {"id": 8, "fail": True}, key="article:8")
    drain()
    holder = durable.start(ProcessArticle, {"id": 8}, key="article:8")
    durable.start(ProcessArticle, {"id": 9}, key="article:9")
    runs = list(durable.list_executions(key="article:8"))
    assert [(r.id, r.holds_key) for r in runs] == [(holder, True), (failed, False)]
    assert list(durable.list_executions(key="article:8", status="failed")) == [runs[1]]
