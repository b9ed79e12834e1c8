"""A worker records completed last steps in batches (runtime/recorder.py): several
runs completed in one statement, each fenced by its own claim, and each run then
finished as if its own thread had recorded it."""

import uuid

import pytest
from django.core.checks import run_checks
from django.db import connection
from django.db.models import F
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import django_durable as durable
from django_durable import Workflow, signals, step, store
from django_durable.models import Run, Status, StepAttempt
from django_durable.runtime import executor
from django_durable.runtime.recorder import Recorder
from django_durable.runtime.worker import Held, Worker
from django_durable.store.engines.postgres import RECORD_LAST_STEPS
from tests.plans import explain
from tests.testapp.models import SideEffect
from tests.testapp.workflows import RebuildIndex, effect

pytestmark = pytest.mark.django_db(transaction=True)


class Statements:
    def __init__(self):
        self.seen: list[str] = []

    def __call__(self, execute, sql, params, many, context):
        self.seen.append(sql)
        return execute(sql, params, many, context)


def claimed(n: int) -> list[Run]:
    """``n`` one-step runs, claimed (not run) as a worker claims them."""
    ids = {durable.start(RebuildIndex, {"v": i}, key=f"batch:{uuid.uuid4()}") for i in range(n)}
    runs = store.claim(worker_id="recorder-test", queues=None, limit=n, lease=durable.minutes(1))
    assert {run.id for run in runs} == ids
    return runs


def completed(run: Run, output) -> executor.LastStep:
    """The last step of ``run`` completed with ``output``, as ``execute`` hands it over."""
    started_at = store.now()
    attempt = store.completed_attempt(run, "rebuild", started_at, output)
    return executor.LastStep(store.Completion(run, attempt, output, {}), dict(run.context))


def refused_later(run_id) -> None:
    """Another worker took ``run_id`` over (its claim's fence moved on)."""
    Run.objects.filter(id=run_id).update(fence=F("fence") + 1)


@pytest.mark.postgres
def test_several_runs_are_completed_in_one_statement_each_fenced_by_its_claim():
    first, second, taken_over = claimed(3)
    refused_later(taken_over.id)
    statements = Statements()
    with connection.execute_wrapper(statements):
        done = store.record_last_steps(
            [completed(first, {"n": 1}).completion, completed(second, None).completion]
            + [completed(taken_over, {"n": 3}).completion]
        )
    assert statements.seen == [RECORD_LAST_STEPS]
    assert done == [first, second]
    for run, output in ((first, {"n": 1}), (second, None)):
        stored = Run.objects.get(id=run.id)
        assert (stored.status, stored.step_index, stored.result) == ("completed", 1, output)
        assert stored.finished_at is not None and stored.lease_expires_at is None
        assert (run.status, run.step_index, run.result) == ("completed", 1, output)
        [attempt] = StepAttempt.objects.filter(run_id=run.id)
        assert (attempt.status, attempt.step, attempt.output) == ("completed", "rebuild", output)
        assert attempt.worker_id == "recorder-test"
    # Not this worker's any more: nothing written for it.
    stored = Run.objects.get(id=taken_over.id)
    assert (stored.status, stored.result) == ("running", None)
    assert not StepAttempt.objects.filter(run_id=taken_over.id).exists()
    assert taken_over.status == "running"


@pytest.mark.postgres
def test_a_batch_is_finished_run_by_run_and_a_refused_record_is_retried_alone():
    """When the batch's statement fails, each record is written on its own: the
    others complete, and the one the database refuses is a failed attempt, as it
    would have been in its own thread; each run is finished once."""
    finished: list[uuid.UUID] = []

    def on_finished(sender, run_id, **kwargs):
        finished.append(run_id)

    good, refused, also_good = claimed(3)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION test_refuse_output() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.status = 'completed' AND NEW.output @> '{"refuse": true}' THEN
                    RAISE EXCEPTION 'refused by the test';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_refuse_output BEFORE INSERT ON durable_step_attempt
            FOR EACH ROW EXECUTE FUNCTION test_refuse_output();
            """
        )
    signals.run_finished.connect(on_finished)
    try:
        executor.record_last_steps(
            [completed(good, 1), completed(refused, {"refuse": True}), completed(also_good, 3)]
        )
    finally:
        signals.run_finished.disconnect(on_finished)
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER test_refuse_output ON durable_step_attempt")
            cursor.execute("DROP FUNCTION test_refuse_output()")
    for run, output in ((good, 1), (also_good, 3)):
        stored = Run.objects.get(id=run.id)
        assert (stored.status, stored.result) == ("completed", output)
    # RebuildIndex has no retries: the refused record fails the run, which finishes too.
    stored = Run.objects.get(id=refused.id)
    assert (stored.status, stored.result) == ("failed", None)
    assert sorted(finished) == sorted([good.id, refused.id, also_good.id])
    [attempt] = StepAttempt.objects.filter(run_id=refused.id)
    assert attempt.status == "failed"
    assert "could not be recorded" in attempt.error["message"]


@pytest.mark.postgres
def test_the_recorder_writes_what_arrived_in_one_statement_then_reports_each_run():
    runs = claimed(5)
    recorder = Recorder(batch=50)
    reported = []
    for n, run in enumerate(runs):
        recorder.add(Held(run, run.fence), completed(run, n), lambda run=run: reported.append(run))
    assert [held.run for held in recorder.held()] == runs  # still leased by the heartbeat
    statements = Statements()
    recorder.stop()  # the loop writes what waits, then returns
    with connection.execute_wrapper(statements):
        recorder.loop()
    batches = [sql for sql in statements.seen if sql == RECORD_LAST_STEPS]
    assert len(batches) == 1
    assert reported == runs
    assert recorder.pending() == 0 and recorder.held() == []
    assert Run.objects.filter(id__in=[r.id for r in runs], status="completed").count() == 5


@pytest.mark.postgres
def test_a_batch_is_no_larger_than_completion_batch():
    runs = claimed(5)
    recorder = Recorder(batch=2)
    for run in runs:
        recorder.add(Held(run, run.fence), completed(run, None), lambda: None)
    recorder.stop()
    statements = Statements()
    with connection.execute_wrapper(statements):
        recorder.loop()
    # 2 + 2 in batches, the last one alone through durable_record_step.
    assert statements.seen.count(RECORD_LAST_STEPS) == 2
    assert len([sql for sql in statements.seen if "durable_record_step_v2(" in sql]) == 1
    assert Run.objects.filter(id__in=[r.id for r in runs], status="completed").count() == 5


class RebuildAgain(Workflow):
    """One step; its first run starts the next of its key, which waits behind it."""

    name = "test_rebuild_again"
    on_duplicate = "run_again"

    @step
    def rebuild(self, ctx):
        effect(ctx, "rebuild", str(ctx.input["v"]))
        if ctx.input["v"] < 100:
            durable.start(RebuildAgain, {"v": ctx.input["v"] + 100}, key=ctx.input["key"])
        return ctx.input["v"]


@pytest.mark.postgres
def test_a_worker_completes_every_run_and_what_follows_a_run_through_its_recorder():
    """Runs completed through the recorder are finished like any other: the run
    waiting behind each one's key is promoted and runs too, each step runs once, and
    a burst worker stops only when nothing is left to record."""
    for n in range(12):
        durable.start(RebuildAgain, {"v": n, "key": f"again:{n}"}, key=f"again:{n}")
    finished: list[uuid.UUID] = []

    def on_finished(sender, run_id, **kwargs):
        finished.append(run_id)

    signals.run_finished.connect(on_finished)
    try:
        worker = Worker(concurrency=4, burst=True, worker_id="recording")
        assert worker.recorder is not None
        assert worker.run(install_signal_handlers=False) == 0
    finally:
        signals.run_finished.disconnect(on_finished)
    runs = Run.objects.filter(workflow=RebuildAgain.name)
    assert runs.count() == 24
    assert set(runs.values_list("status", flat=True)) == {Status.COMPLETED}
    assert sorted(finished) == sorted(runs.values_list("id", flat=True))
    assert sorted(SideEffect.objects.values_list("note", flat=True)) == sorted(
        [str(n) for n in range(12)] + [str(n + 100) for n in range(12)]
    )
    assert StepAttempt.objects.filter(status="completed").count() == 24


@pytest.mark.postgres
@override_settings(DURABLE={"COMPLETION_BATCH": 1})
def test_completion_batch_1_records_each_run_in_its_own_thread():
    assert Worker(concurrency=4).recorder is None
    run_id = durable.start(RebuildIndex, {"v": 1}, key="alone")
    worker = Worker(concurrency=2, burst=True, worker_id="no-recorder")
    assert worker.run(install_signal_handlers=False) == 0
    assert Run.objects.get(id=run_id).status == "completed"


def test_a_worker_has_a_recorder_on_postgresql_only():
    assert (Worker(concurrency=4).recorder is not None) == (connection.vendor == "postgresql")


@pytest.mark.parametrize("value", [0, -1, "50", True])
def test_completion_batch_must_be_a_whole_number_of_at_least_1(value):
    with override_settings(DURABLE={"COMPLETION_BATCH": value}):
        errors = [e for e in run_checks() if "COMPLETION_BATCH" in e.msg]
    assert [e.id for e in errors] == ["django_durable.E015"]


@pytest.mark.postgres
def test_a_batch_finds_its_runs_through_an_index_in_a_big_table():
    """On a table of many runs, ANALYZEd, the batch's update reads its runs through
    the primary key or the index of running runs: never a scan of the runs table."""
    at = store.now()
    Run.objects.bulk_create(
        Run(id=uuid.uuid4(), workflow=RebuildIndex.name, status=Status.COMPLETED, finished_at=at)
        for _ in range(5_000)
    )
    runs = claimed(3)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_run")
    with CaptureQueriesContext(connection) as queries:
        assert store.record_last_steps([completed(run, None).completion for run in runs]) == runs
    [sent] = [q["sql"] for q in queries.captured_queries if "unnest" in q["sql"]]
    plan = explain(sent)
    assert "durable_run_pkey" in plan or "durable_run_lease" in plan, plan
    assert "Seq Scan on durable_run " not in plan, plan
