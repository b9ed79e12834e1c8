"""Every dashboard page runs a fixed number of queries, whatever the number of
runs, keys, attempts or children (two of them are the session and the user).
The timings of these queries at a million runs are measured by
``bench/dashboard_pages.py``; here only their number is pinned."""

import pytest
from django.db import connection
from django.urls import reverse

import django_durable as durable
from django_durable.testing import drain
from tests.dashboard_workflows import DashOrder
from tests.testapp.workflows import SyncAccount

pytestmark = pytest.mark.django_db

# The overview counts runs per status with 9 bounded counts where PostgreSQL has
# no statistics yet (a test database is never analysed), else 1 estimate.
OVERVIEW = 21 if connection.vendor == "postgresql" else 20
QUERIES = {
    "overview": OVERVIEW,
    "keys": 5,
    "runs": 3,
    "run": 9,
    "workflow": 20,
    "inputs": 3,
    "schedules": 5,
    "workers": 5,
}


def traffic(n: int):
    order = durable.start(DashOrder, {"order": n, "fail_ship": True}, key=f"order:{n}")
    drain()
    durable.provide_input(order, "approval", True)
    drain()
    for i in range(n):
        durable.start(SyncAccount, {"n": i}, key=f"a:{n}:{i}")
        durable.start(SyncAccount, {"n": i, "again": True}, key=f"a:{n}:{i}")
    return order


@pytest.mark.parametrize("size", [3, 60])
def test_each_page_makes_a_fixed_number_of_queries(admin_client, django_assert_num_queries, size):
    order = traffic(size)
    durable.schedule(SyncAccount, "0 3 * * *", key="nightly-sync", name="nightly")
    args = {"run": [order], "workflow": ["sync_account"]}
    for name, expected in QUERIES.items():
        with django_assert_num_queries(expected):
            response = admin_client.get(reverse(f"django_durable:{name}", args=args.get(name, [])))
        assert response.status_code == 200, name
