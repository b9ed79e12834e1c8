"""Every dashboard page runs a fixed number of queries, whatever the number of
runs, keys, attempts or children (two of them are the session and the user).
The timings of these queries at a million runs are measured by
``bench/dashboard_pages.py``; here only their number is pinned."""

import pytest
from django.db import connection
from django.urls import reverse

import django_durable as durable
from django_durable.store import estimates as store_estimates
from django_durable.testing import drain
from django_durable.workflows.definition import registry
from tests.dashboard_workflows import DashOrder
from tests.testapp.workflows import SyncAccount

pytestmark = pytest.mark.django_db


# The overview counts runs per status with 9 bounded counts where PostgreSQL has
# no statistics (before the first ANALYZE), else 1 estimate. It and the workers
# page look for due runs with one EXISTS per defined queue that no live worker
# serves (the queues of the workflows in the code: a handful). The overview's
# throughput chart is one query; the workers page's counts of finished runs are
# one when there are workers (none here: tests/test_dashboard_charts.py pins it).
def expected_queries() -> dict[str, int]:
    queues = len({w.queue for w in registry.all()})
    estimated = store_estimates.status_estimates() is not None
    overview = (13 if estimated else 21) + (1 if connection.vendor == "postgresql" else 0)
    return {
        "overview": overview - 1 + queues,
        "keys": 5,
        # 3, and the progress of the page's unfinished runs (dashboard/streams.py).
        "runs": 4,
        # 9, and the Replay section of a finished keyed run: its reruns, the steps
        # it began, its key's holder (dashboard/rerun.py); and its streams' rows (their
        # latest items are one more query when it has any: tests/test_dashboard_streams.py).
        "run": 13,
        "workflow": 20,
        "inputs": 3,
        "schedules": 5,
        "workers": 4 + queues,
        # queue_stats' two (active runs by queue, paused queues), the newest runs'
        # queues, the queues ever paused (their History links; dashboard/queues.py),
        # the due runs of the workflows with flow limits (two more, their running runs
        # and begins, when some are due: operations/flow_holds.py).
        "queues": 7,
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
    # A process's first page also asks whether every migration is applied (two
    # queries, once: dashboard/site.py), whichever test of the process comes first.
    admin_client.get(reverse("django_durable:overview"))
    for name, expected in expected_queries().items():
        with django_assert_num_queries(expected):
            response = admin_client.get(reverse(f"django_durable:{name}", args=args.get(name, [])))
        assert response.status_code == 200, name
