"""``manage.py durable doctor`` on a healthy setup (a real worker) and broken ones."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

import django_durable as durable
from django_durable import conf, store
from django_durable.models import Run, WorkerNode
from django_durable.store import diagnostics
from django_durable.store.functions import CURRENT, definition
from tests.worker_processes import WorkerPool, wait_until


def doctor(*args):
    out = StringIO()
    try:
        call_command("durable", "doctor", *args, stdout=out, stderr=StringIO())
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def problems(findings):
    return {(f["check"], f["detail"]) for f in findings if f["problem"]}


@pytest.mark.postgres
@pytest.mark.django_db
def test_doctor_finds_a_store_function_missing_or_out_of_date():
    """DDL is transactional on PostgreSQL: the test's transaction puts them back."""
    _code, out = doctor("--json")
    assert ("functions", True) not in {(f["check"], f["problem"]) for f in json.loads(out)}
    with connection.cursor() as cursor:
        cursor.execute("DROP FUNCTION durable_next_due_at_v1")
        cursor.execute(
            "CREATE OR REPLACE FUNCTION durable_record_step_v2(p_change text, p_run uuid, "
            "p_fence integer, p_step_index integer, p_context jsonb, p_state jsonb, "
            "p_due_at timestamptz, p_step varchar, p_attempt integer, p_outcome varchar, "
            "p_output jsonb, p_error jsonb, p_logs jsonb, p_worker varchar, "
            "p_started_at timestamptz, p_finished_at timestamptz, p_replaced jsonb) "
            "RETURNS bigint "
            "LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$"
        )
    _code, out = doctor("--json")
    [found] = [f for f in json.loads(out) if f["check"] == "functions"]
    assert found["problem"] and "migrate" in found["fix"]
    assert found["data"]["outdated"] == {
        "durable_next_due_at_v1": "missing",
        "durable_record_step_v2": "out of date",
    }
    # Each named with the migration that creates it, read from the migrations.
    assert (
        "0001_0_3_initial creates durable_next_due_at_v1, durable_record_step_v2" in (found["fix"])
    )
    with connection.cursor() as cursor:
        for name in CURRENT.values():
            cursor.execute(definition(name))
    _code, out = doctor("--json")
    [found] = [f for f in json.loads(out) if f["check"] == "functions"]
    assert not found["problem"], found


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_doctor_on_a_healthy_setup_with_a_live_worker(tmp_path):
    workers = WorkerPool(tmp_path)
    try:
        workers.start("--concurrency", "2")
        wait_until(lambda: WorkerNode.objects.exists(), 60, "the worker's registration")
        if connection.vendor == "postgresql":
            channel = conf.get("NOTIFY_CHANNEL")
            wait_until(lambda: diagnostics.listening_sessions(channel), 60, "the worker's LISTEN")
        durable.start("sync_account", {})
        code, out = doctor("--json")
        findings = json.loads(out)
        assert code == 0, problems(findings)
        checks = {f["check"] for f in findings}
        assert checks == {
            "migrations",
            "functions",
            "indexes",
            "workers",
            "workflows",
            "notify",
            "clock",
            "pool",
            "stuck_runs",
        }
        (served,) = [f for f in findings if f["check"] == "workflows"]
        assert "sync_account" in served["data"]["workflows"]
        code, text = doctor()
        assert code == 0 and "PROBLEM" not in text and "queue 'default': 1 live worker" in text
        assert "serves" in text and "sync_account" in text
    finally:
        workers.kill_all()


@pytest.mark.django_db
def test_doctor_without_a_worker_finds_the_queue_unserved_and_the_overdue_runs():
    run_id = durable.start("sync_account", {})
    # A controlled clock: the run has been due for three hours.
    Run.objects.filter(id=run_id).update(due_at=store.now() - timedelta(hours=3))
    code, out = doctor("--json")
    found = problems(json.loads(out))
    assert code == 1
    assert ("workers", "queue 'default': no live worker (none heartbeated within the lease)") in (
        found
    )
    assert any(check == "stuck_runs" and "1 pending run(s) due for 3h" in d for check, d in found)
    code, text = doctor()
    assert "fix: start one: python manage.py durable_worker --queues default" in text


@pytest.mark.django_db
def test_doctor_finds_runs_whose_lease_expired():
    run_id = durable.start("sync_account", {})
    store.claim(worker_id="gone", queues=None, limit=1, lease=timedelta(seconds=30))
    Run.objects.filter(id=run_id).update(lease_expires_at=store.now() - timedelta(minutes=10))
    code, out = doctor("--json")
    assert code == 1
    assert any("expired lease" in detail for _, detail in problems(json.loads(out)))


@pytest.mark.django_db
def test_doctor_sees_a_worker_that_stopped_heartbeating_as_dead():
    stale = store.now() - conf.get("LEASE") * 3
    WorkerNode.objects.create(
        id="old", hostname="h", pid=1, queues=[], concurrency=1, heartbeat_at=stale
    )
    code, out = doctor("--json")
    assert code == 1 and any(
        d.startswith("queue 'default': no live") for _, d in problems(json.loads(out))
    )


@pytest.mark.django_db(transaction=True)
def test_doctor_finds_a_pending_migration():
    """A migration not recorded as applied (the tables stay: doctor's other checks
    read them) is pending until migrate runs it."""
    from django.db.migrations.loader import MigrationLoader
    from django.db.migrations.recorder import MigrationRecorder

    # The newest migration: un-recording an older one would leave a later one
    # applied before its dependency, which Django refuses outright.
    graph = MigrationLoader(connection).graph
    ((_, newest),) = graph.leaf_nodes("django_durable")
    # A squashed migration is applied while every migration it replaces is recorded.
    recorded = [newest, *(name for _, name in graph.nodes["django_durable", newest].replaces)]
    recorder = MigrationRecorder(connection)
    for name in recorded:
        recorder.record_unapplied("django_durable", name)
    try:
        code, out = doctor("--json")
        (migrations,) = [f for f in json.loads(out) if f["check"] == "migrations"]
        assert code == 1 and migrations["problem"]
        assert f"django_durable.{newest}" in migrations["data"]["pending"]
        assert migrations["fix"] == "run: python manage.py migrate"
    finally:
        for name in recorded:
            recorder.record_applied("django_durable", name)
    code, out = doctor("--json")
    (migrations,) = [f for f in json.loads(out) if f["check"] == "migrations"]
    assert not migrations["problem"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_doctor_sees_its_notify_arrive_on_postgres():
    code, out = doctor("--json")
    (notify,) = [f for f in json.loads(out) if f["check"] == "notify"]
    assert not notify["problem"] and "arrived" in notify["detail"]


def workflow_findings(findings):
    return [f for f in findings if f["check"] == "workflows"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_doctor_lists_what_each_worker_serves_and_flags_runs_no_live_worker_knows(tmp_path):
    workers = WorkerPool(tmp_path)
    try:
        # A rolling deploy: the only live worker runs the previous release's code.
        old = workers.start("--concurrency", "1", "--worker-id", "old", old_code="1")
        old.wait_for_output("serves", timeout=60)
        run_ids = [durable.start("added_in_this_release") for _ in range(3)]
        code, out = doctor("--json")
        found = workflow_findings(json.loads(out))
        assert code == 1
        (listed,) = [f for f in found if not f["problem"]]
        assert listed["data"]["worker"] == "old"
        assert "sync_account" in listed["data"]["workflows"]
        assert "added_in_this_release" not in listed["data"]["workflows"]
        (problem,) = [f for f in found if f["problem"]]
        assert problem["data"] == {
            "workflow": "added_in_this_release",
            "queue": "default",
            "due": 3,
        }
        assert "none of its 1 live worker(s) knows it" in problem["detail"]
        code, text = doctor()
        assert "fix: deploy the code that defines 'added_in_this_release'" in text

        # The new release's worker knows it: the runs complete and doctor is content.
        workers.start("--concurrency", "1", "--worker-id", "new")
        wait_until(
            lambda: Run.objects.filter(id__in=run_ids, status="completed").count() == 3,
            60,
            "the new worker to run the new workflow",
        )
        code, out = doctor("--json")
        found = workflow_findings(json.loads(out))
        assert not [f for f in found if f["problem"]]
        assert {f["data"]["worker"] for f in found} == {"old", "new"}
    finally:
        workers.kill_all()


@pytest.mark.django_db
def test_doctor_flags_a_due_workflow_only_a_dead_worker_knew():
    at = store.now()
    WorkerNode.objects.create(
        id="live", hostname="h", pid=1, queues=[], heartbeat_at=at, workflows=["sync_account"]
    )
    WorkerNode.objects.create(
        id="dead",
        hostname="h",
        pid=2,
        queues=[],
        heartbeat_at=at - conf.get("LEASE") * 3,
        workflows=["sync_account", "process_article"],
    )
    durable.start("process_article", {"id": 1})
    durable.start("sync_account", {})
    code, out = doctor("--json")
    found = workflow_findings(json.loads(out))
    assert code == 1
    assert [f["data"] for f in found if f["problem"]] == [
        {"workflow": "process_article", "queue": "default", "due": 1}
    ]
    assert [f["detail"] for f in found if not f["problem"]] == [
        "worker live serves 1: sync_account"
    ]
    # A worker that serves any workflow (a finder may find any name) knows it.
    WorkerNode.objects.filter(id="live").update(workflows=None)
    code, out = doctor("--json")
    assert not [f for f in workflow_findings(json.loads(out)) if f["problem"]]
