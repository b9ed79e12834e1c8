"""The engine's metrics (docs/metrics.md), read with the SDK's in-memory reader from
real claims and executions: ``drain()``, a burst worker that recovers a run whose
lease expired, and a worker whose run another claim took."""

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.utils import timezone
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import django_durable as durable
from django_durable import step, store, telemetry
from django_durable.models import Run, Status
from django_durable.runtime.worker import Worker
from django_durable.store import observers
from django_durable.store.engines import postgres
from django_durable.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def reader():
    found = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[found])
    telemetry.install(meter_provider=provider)
    yield found
    telemetry.install()  # back to the global (no-op) providers
    provider.shutdown()


def points(reader, name):
    """{attributes: data point} of metric ``name`` (collected now)."""
    data = reader.get_metrics_data()
    found = {}
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        found[frozenset(point.attributes.items())] = point
    return found


def attrs(**pairs):
    return frozenset((f"durable.{k}", v) for k, v in pairs.items())


def wait_for(predicate, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_claims_pickups_and_queue_depth_are_recorded(reader, define):
    mailer = define("mailer", queue="emails")
    durable.start(mailer, key="mail:1")
    durable.start(mailer, key="mail:2")
    durable.start(mailer, key="mail:later", run_after=timedelta(hours=1))

    depth = points(reader, "durable.queue.depth")
    assert {k: p.value for k, p in depth.items()} == {attrs(queue="emails"): 2}

    assert drain() == 2
    latency = points(reader, "durable.claim.latency")
    (claims,) = latency.values()  # drain claims from every queue
    assert list(latency) == [attrs(queue="*")]
    assert claims.count >= 3  # two runs claimed, then a claim that found nothing
    assert claims.sum > 0
    pickup = points(reader, "durable.pickup.latency")
    assert list(pickup) == [attrs(workflow="mailer", queue="emails")]
    assert pickup[attrs(workflow="mailer", queue="emails")].count == 2
    assert pickup[attrs(workflow="mailer", queue="emails")].min >= 0

    depth = points(reader, "durable.queue.depth")
    assert {k: p.value for k, p in depth.items()} == {attrs(queue="emails"): 0}


def test_queue_depth_is_counted_across_priorities_up_to_a_cap(define):
    job = define("prioritised", queue="jobs")
    for n in range(4):
        durable.start(job, key=f"job:{n}", priority=5 if n < 2 else 0)
    durable.start(define("other_queue", queue="other"))
    assert store.queue_depths() == {"jobs": 4, "other": 1}
    assert store.queue_depths(cap=3) == {"jobs": 3, "other": 1}


def test_a_recovered_run_is_counted_by_the_worker_that_recovers_it(reader, define):
    lost = define("lost_run", queue="chores")
    run_id = durable.start(lost, key="lost:1")
    (claimed,) = store.claim(
        worker_id="dead-worker", queues=None, limit=1, lease=timedelta(minutes=5)
    )
    assert claimed.id == run_id
    # The dead worker's lease ran out (moved in the database, as time would).
    Run.objects.filter(id=run_id).update(lease_expires_at=timezone.now() - timedelta(minutes=1))

    # A live worker's maintenance recovers it, and the worker then runs it.
    worker = Worker(worker_id="rescuer", poll_interval=0.05)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        wait_for(
            lambda: Run.objects.get(id=run_id).status == "completed", "the run to be recovered"
        )
    finally:
        worker.stop()
        thread.join(30)
    recoveries = points(reader, "durable.recoveries")
    assert {k: p.value for k, p in recoveries.items()} == {
        attrs(workflow="lost_run", queue="chores"): 1
    }


STARTED = threading.Event()
RELEASE = threading.Event()


def blocks(self, ctx):
    STARTED.set()
    RELEASE.wait(30)
    return "done late"


def test_a_worker_that_finds_its_run_taken_counts_a_lease_loss(reader, define):
    STARTED.clear()
    RELEASE.clear()
    run_id = durable.start(define("taken_over", step_one=step(blocks)), key="taken:1")
    worker = Worker(worker_id="slow-worker", poll_interval=0.05)
    thread = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        assert STARTED.wait(30), "the worker never started the step"
        # Another worker claimed the run meanwhile: its claim moved the fence.
        Run.objects.filter(id=run_id).update(fence=F("fence") + 1, worker_id="thief")
        RELEASE.set()
        wait_for(lambda: points(reader, "durable.lease.losses"), "the lease loss to be counted")
    finally:
        RELEASE.set()
        worker.stop()
        thread.join(30)
    losses = points(reader, "durable.lease.losses")
    assert {k: p.value for k, p in losses.items()} == {
        attrs(workflow="taken_over", queue="default"): 1
    }
    run = Run.objects.get(id=run_id)
    assert (run.status, run.worker_id, run.result) == ("running", "thief", None)


def test_nothing_is_measured_and_claims_are_not_watched_when_telemetry_is_uninstalled(
    reader, define
):
    telemetry.uninstall()
    assert observers.claim_watcher is None
    durable.start(define("unwatched"))
    assert drain() == 1
    assert points(reader, "durable.claim.latency") == {}
    assert points(reader, "durable.pickup.latency") == {}
    assert points(reader, "durable.queue.depth") == {}


def test_a_process_installed_without_queue_depth_reads_no_depth(define):
    found = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[found])
    telemetry.install(meter_provider=provider)
    # A web process, after its own SDK setup: the workers' gauge is enough.
    telemetry.install(meter_provider=provider, queue_depth=False)
    try:
        durable.start(define("not_counted"))
        assert points(found, "durable.queue.depth") == {}
        assert drain() == 1
        assert list(points(found, "durable.claim.latency")) == [attrs(queue="*")]
    finally:
        telemetry.install()
        provider.shutdown()


@pytest.mark.postgres
def test_queue_depth_reads_only_the_claim_index_and_stops_at_its_cap():
    at = timezone.now()
    Run.objects.bulk_create(
        Run(
            id=uuid.uuid4(),
            workflow="noop",
            queue="deep" if n % 3 else "shallow",
            priority=n % 4,
            # a third is due later (a sleep, a backoff): never read by the count
            due_at=at - timedelta(minutes=5) if n % 5 else at + timedelta(hours=1),
            created_at=at,
        )
        for n in range(6_000)
    )
    Run.objects.bulk_create(
        Run(id=uuid.uuid4(), workflow="noop", status=Status.COMPLETED, created_at=at)
        for _ in range(6_000)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_run")
        cursor.execute("EXPLAIN " + postgres.QUEUE_DEPTH, {"cap": 100})
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "durable_run_claim" in plan, plan
    assert "Seq Scan" not in plan, plan
    assert store.queue_depths(cap=100) == {"deep": 100, "shallow": 100}
    due = Run.objects.filter(due_at__lte=at).values_list("queue")
    expected = {q: due.filter(queue=q).count() for q in ("deep", "shallow")}
    assert store.queue_depths() == expected


@pytest.mark.postgres
def test_a_step_whose_session_refuses_writes_counts_as_a_hand_back(reader):
    run_id = durable.start("lands_on_a_standby", queue="chores")
    drain()
    run = Run.objects.get(id=run_id)
    # Attempt 1 met SQLSTATE 25006 in its own write: handed back, not failed and not a
    # recovery; attempt 2, on a new session, wrote.
    assert (run.status, run.result, run.recoveries) == (Status.COMPLETED, 2, 0)
    handbacks = points(reader, "durable.handbacks")
    assert {k: p.value for k, p in handbacks.items()} == {
        attrs(workflow="lands_on_a_standby", queue="chores"): 1
    }
    assert not points(reader, "durable.recoveries")
