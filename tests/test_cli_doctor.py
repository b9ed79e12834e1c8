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


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_doctor_on_a_healthy_setup_with_a_live_worker(tmp_path):
    workers = WorkerPool(tmp_path)
    try:
        workers.start("--concurrency", "2")
        wait_until(lambda: WorkerNode.objects.exists(), 60, "the worker's registration")
        if connection.vendor == "postgresql":
            channel = conf.get("NOTIFY_CHANNEL")
            wait_until(lambda: store.listening_sessions(channel), 60, "the worker's LISTEN")
        durable.start("sync_account", {})
        code, out = doctor("--json")
        findings = json.loads(out)
        assert code == 0, problems(findings)
        checks = {f["check"] for f in findings}
        assert checks == {"migrations", "workers", "notify", "clock", "pool", "stuck_runs"}
        code, text = doctor()
        assert code == 0 and "PROBLEM" not in text and "queue 'default': 1 live worker" in text
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
    call_command("migrate", "django_durable", "0004", verbosity=0)
    try:
        code, out = doctor("--json")
        (migrations,) = [f for f in json.loads(out) if f["check"] == "migrations"]
        assert code == 1 and migrations["problem"]
        assert "django_durable.0005_holder_lookup_has_one_index" in migrations["data"]["pending"]
        assert migrations["fix"] == "run: python manage.py migrate"
    finally:
        call_command("migrate", "django_durable", verbosity=0)
    code, out = doctor("--json")
    (migrations,) = [f for f in json.loads(out) if f["check"] == "migrations"]
    assert not migrations["problem"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_doctor_sees_its_notify_arrive_on_postgres():
    code, out = doctor("--json")
    (notify,) = [f for f in json.loads(out) if f["check"] == "notify"]
    assert not notify["problem"] and "arrived" in notify["detail"]
