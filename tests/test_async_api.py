"""The async API through Django's AsyncClient against real async views (tests/async_views.py).

The tests are synchronous and drive the AsyncClient with ``async_to_sync``: the
view runs in an event loop, and the ORM work the ``a*`` functions hand to
``sync_to_async(thread_sensitive=True)`` comes back to this thread, the one that
holds the test's database connection (as it would come back to Django's one
sync thread under ASGI).
"""

import json
import uuid

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import SynchronousOnlyOperation
from django.db import transaction
from django.test import AsyncClient

import django_durable as durable
from django_durable.models import Run, Status
from django_durable.testing import drain

pytestmark = pytest.mark.django_db


@pytest.fixture
def client():
    return AsyncClient()


def post(client, url, body=None):
    response = async_to_sync(client.post)(
        url, json.dumps(body or {}), content_type="application/json"
    )
    return response.status_code, (response.json() if response.content else None)


def get(client, url):
    response = async_to_sync(client.get)(url)
    return response.status_code, (response.json() if response.content else None)


def test_an_async_view_starts_a_run_and_a_duplicate_gets_the_holder(client):
    status, first = post(
        client, "/async/start/", {"workflow": "sync_account", "input": {"id": 1}, "key": "a:1"}
    )
    assert (status, first["outcome"]) == (201, "started")
    status, second = post(
        client, "/async/start/", {"workflow": "sync_account", "input": {"id": 1}, "key": "a:1"}
    )
    assert (status, second) == (201, {"run_id": first["run_id"], "outcome": "use_existing"})
    assert Run.objects.filter(key="a:1").count() == 1

    status, taken = post(
        client,
        "/async/start/",
        {"workflow": "sync_account", "key": "a:1", "on_duplicate": "error"},
    )
    assert (status, taken) == (409, {"holder_id": first["run_id"]})


def test_an_async_view_reads_a_run_and_a_missing_one_is_404(client):
    run_id = durable.start("sync_account", {"id": 2}, key="a:2")
    assert get(client, f"/async/runs/{run_id}/") == (
        200,
        {"status": "pending", "key": "a:2", "result": None},
    )
    drain()
    assert get(client, f"/async/runs/{run_id}/")[1]["status"] == "completed"
    assert get(client, f"/async/runs/{uuid.uuid4()}/") == (404, None)


def test_an_async_view_cancels_and_a_second_cancel_is_refused(client):
    run_id = durable.start("sync_account", {"id": 3}, key="a:3")
    assert post(client, f"/async/runs/{run_id}/cancel/", {"reason": "no"}) == (204, None)
    run = durable.get_run(run_id)
    assert (run.status, run.error["reason"]) == (Status.CANCELLED, "no")
    status, body = post(client, f"/async/runs/{run_id}/cancel/")
    assert (status, body["refused"]) == (409, "AlreadyFinished")


def test_async_retry_rerun_and_release_key(client):
    failed = durable.start("sync_account", {"fail": True}, key="a:4")
    drain()
    assert durable.get_run(failed).status == Status.FAILED
    assert post(client, f"/async/runs/{failed}/retry/") == (200, {"run_id": str(failed)})
    assert durable.get_run(failed).status == Status.PENDING
    durable.cancel(failed)  # (its step would fail again: it records a side effect once)

    sent = durable.start("send_invoice", {"id": 9}, key="invoice:9")  # reuse="never"
    drain()
    status, body = post(client, f"/async/runs/{sent}/rerun/")
    assert (status, body) == (409, {"holder_id": str(sent)})
    assert post(client, f"/async/runs/{sent}/release/", {"by": "ops"}) == (204, None)
    assert durable.get_run(sent).holds_key is False
    status, body = post(client, f"/async/runs/{sent}/release/", {"by": "ops"})
    assert (status, body["refused"]) == (409, "NoKey")
    status, body = post(client, f"/async/runs/{sent}/rerun/")
    assert status == 200 and body["run_id"] != str(sent)


def test_async_send_event_and_provide_input(client):
    waiting = durable.start("waits_for_event", {})
    asking = durable.start("waits_for_approval", {})
    drain()
    assert post(client, f"/async/runs/{waiting}/event/", {"name": "go", "payload": 5}) == (
        204,
        None,
    )
    status, body = post(client, f"/async/runs/{waiting}/event/", {"name": "other"})
    assert (status, body["refused"]) == (409, "NotWaiting")
    assert post(
        client, f"/async/runs/{asking}/input/", {"name": "approval", "value": {"by": "ann"}}
    ) == (204, None)
    drain()
    assert durable.get_run(waiting).result == 5
    assert durable.get_run(asking).result == {"approved_by": "ann"}


def test_the_sync_api_is_refused_in_an_event_loop_and_the_async_one_is_not():
    async def both():
        with pytest.raises(SynchronousOnlyOperation):
            durable.start("sync_account", {"id": 5})
        return await durable.astart("sync_account", {"id": 5}, key="a:5")

    run_id = async_to_sync(both)()
    assert durable.get_run(run_id).key == "a:5"


def test_an_atomic_block_goes_in_a_sync_function_awaited_whole():
    """``transaction.atomic()`` can't span awaits; a sync unit of work can, and the
    start rolls back with it."""

    def start_then_fail():
        with transaction.atomic():
            durable.start("sync_account", {"id": 6}, key="a:6")
            raise RuntimeError("the order could not be saved")

    async def view_body():
        with pytest.raises(RuntimeError):
            await sync_to_async(start_then_fail, thread_sensitive=True)()

    async_to_sync(view_body)()
    assert not Run.objects.filter(key="a:6").exists()


def test_astart_many_follows_start_many():
    results = async_to_sync(durable.astart_many)("sync_account", [({"n": 1}, "m:1"), ({}, "m:1")])
    assert [r.outcome for r in results] == ["started", "use_existing"]
    assert results[0].run_id == results[1].run_id


def test_aexplain_writes_nothing():
    run_id = durable.start("sync_account", {}, key="e:1")
    explanation = async_to_sync(durable.aexplain)("sync_account", {}, key="e:1")
    assert (explanation.outcome, explanation.holder_id) == ("use_existing", run_id)
    assert Run.objects.count() == 1
