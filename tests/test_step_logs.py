"""Step logs: what a step logs (any logger, its thread or its tasks) is kept on its
attempt, only that, within the documented bounds; shown by the run page's include,
and deleted with the run."""

import logging
import threading
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.template.loader import render_to_string
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_durable as durable
from django_durable import step, store
from django_durable.models import Run, StepAttempt
from django_durable.runtime import executor, steplogs
from django_durable.runtime.worker import Worker
from django_durable.testing import drain
from tests.testapp.workflows import LogsEverywhere

log = logging.getLogger("tests.steplogs")


@pytest.fixture(autouse=True)
def info_logs_of_the_tests(caplog):
    """Kept records follow the logging configuration's levels: let INFO through."""
    caplog.set_level("INFO", logger="tests")


def logs_of(run_id, step_name):
    return StepAttempt.objects.filter(run_id=run_id, step=step_name).order_by("id").last().logs


def messages(records):
    return [r["message"] for r in records or []]


@pytest.mark.django_db
def test_records_of_any_logger_are_kept_with_the_attempt(define):
    def talks(self, ctx):
        log.info("fetching %s", ctx.input["id"])
        logging.getLogger("some.library").warning("slow answer")
        try:
            raise KeyError("missing")
        except KeyError:
            log.exception("lookup failed")
        logging.getLogger("tests.steplogs").debug("below the configured level: not created")

    run_id = durable.start(define("talks", talks=step(talks)), {"id": 5})
    drain()
    records = logs_of(run_id, "talks")
    assert [(r["level"], r["logger"]) for r in records] == [
        ("INFO", "tests.steplogs"),
        ("WARNING", "some.library"),
        ("ERROR", "tests.steplogs"),
    ]
    assert records[0]["message"] == "fetching 5"
    assert records[2]["message"].startswith("lookup failed\nTraceback")
    assert "KeyError: 'missing'" in records[2]["message"]
    assert all(timezone.datetime.fromisoformat(r["at"]).tzinfo for r in records)


@pytest.mark.django_db
def test_an_attempt_that_logs_nothing_keeps_no_logs_and_the_handler_is_removed():
    handlers = list(logging.getLogger().handlers)
    run_id = durable.start("noop")
    drain()
    assert list(StepAttempt.objects.filter(run_id=run_id).values_list("logs", flat=True)) == [
        None,
        None,
    ]
    assert logging.getLogger().handlers == handlers


@pytest.mark.django_db
def test_records_logged_by_other_threads_during_the_step_are_not_kept(define):
    def with_a_bystander(self, ctx):
        bystander = threading.Thread(target=log.info, args=("another thread's record",))
        bystander.start()
        bystander.join()
        log.info("the step's own record")

    run_id = durable.start(define("bystander", go=step(with_a_bystander)))
    drain()
    assert messages(logs_of(run_id, "with_a_bystander")) == ["the step's own record"]


@pytest.mark.django_db
def test_a_suspended_attempt_keeps_what_it_logged_before_the_wait(define):
    def waits(self, ctx):
        log.info("before the wait (attempt seen %d times)", len(ctx.get("seen", [])))
        ctx.wait_for_event("go")
        log.info("after the wait")

    run_id = durable.start(define("waits_logged", go=step(waits)))
    drain()
    durable.send_event(run_id, "go")
    drain()
    first, second = StepAttempt.objects.filter(run_id=run_id).order_by("id")
    assert (first.status, messages(first.logs)) == (
        "suspended",
        ["before the wait (attempt seen 0 times)"],
    )
    assert (second.status, messages(second.logs)) == (
        "completed",
        ["before the wait (attempt seen 0 times)", "after the wait"],
    )


@pytest.mark.django_db
def test_a_failed_attempt_keeps_its_logs_beside_its_error(define):
    def breaks(self, ctx):
        log.warning("about to break")
        raise RuntimeError("broken")

    run_id = durable.start(define("breaks", go=step(breaks)))
    drain()
    attempt = StepAttempt.objects.get(run_id=run_id)
    assert (attempt.status, attempt.error["message"], messages(attempt.logs)) == (
        "failed",
        "broken",
        ["about to break"],
    )


@pytest.mark.django_db
def test_at_most_200_records_are_kept_then_a_marker_says_how_many_were_not(define):
    def chatty(self, ctx):
        for i in range(250):
            log.info("line %d", i)

    run_id = durable.start(define("chatty", go=step(chatty)))
    drain()
    records = logs_of(run_id, "chatty")
    assert len(records) == 201
    assert messages(records[:200]) == [f"line {i}" for i in range(200)]
    marker = records[-1]
    assert marker["truncated"] is True
    assert marker["message"].startswith("50 more record(s) not kept")


@pytest.mark.django_db
def test_the_byte_budget_and_long_messages_are_bounded(define, settings):
    settings.DURABLE = {"STEP_LOG_BYTES": 20_000}

    def verbose(self, ctx):
        for _ in range(10):
            log.info("%s", "x" * 50_000)

    run_id = durable.start(define("verbose", go=step(verbose)))
    drain()
    records = logs_of(run_id, "verbose")
    kept, marker = records[:-1], records[-1]
    assert len(kept) == 2  # about 8 KB each (a message keeps its start and its end)
    assert all(len(r["message"]) < steplogs.MESSAGE_CHARS + 100 for r in kept)
    assert "characters not kept" in kept[0]["message"]
    assert marker["truncated"] and marker["message"].startswith("8 more record(s)")
    assert sum(len(r["message"]) for r in kept) < 20_000


@pytest.mark.django_db
def test_step_logs_can_be_turned_off(define, settings):
    settings.DURABLE = {"STEP_LOG_RECORDS": 0}

    def talks(self, ctx):
        log.warning("not kept")

    run_id = durable.start(define("silent", go=step(talks)))
    drain()
    assert logs_of(run_id, "talks") is None


@pytest.mark.django_db
def test_a_nul_in_a_message_never_fails_the_step(define):
    def nul(self, ctx):
        log.info("before\x00after")

    run_id = durable.start(define("nul_logger", go=step(nul)))
    drain()
    assert durable.get_run(run_id).status == "completed"
    assert messages(logs_of(run_id, "nul")) == ["before\\x00after"]


def test_bad_step_log_settings_are_reported(settings):
    settings.DURABLE = {"STEP_LOG_RECORDS": -1, "STEP_LOG_BYTES": "64k"}
    ids = [e.id for e in run_checks() if e.id == "django_durable.E014"]
    assert ids == ["django_durable.E014", "django_durable.E014"]


@pytest.mark.django_db(transaction=True)
def test_each_attempt_keeps_only_its_own_records_with_several_worker_threads():
    """Three threads run sync and async steps of six runs at once; every attempt's logs
    name only its own run (on PostgreSQL the attempt is written by the one-statement
    CTE of store/steps.py, on SQLite through the ORM)."""
    run_ids = {durable.start(LogsEverywhere, {"tag": f"run-{i}"}): f"run-{i}" for i in range(6)}
    assert Worker(concurrency=3, burst=True).run(install_signal_handlers=False) == 0
    for run_id, tag in run_ids.items():
        assert Run.objects.get(id=run_id).status == "completed"
        assert messages(logs_of(run_id, "sync_part")) == [f"sync step {tag}"]
        assert messages(logs_of(run_id, "async_part")) == [
            f"async step {tag}",
            f"in a task of {tag}",
            f"in a task of {tag}",
            f"sync_to_async of {tag}",
        ]


@pytest.mark.django_db
def test_logs_are_deleted_with_their_run_when_it_is_pruned(define):
    def talks(self, ctx):
        log.info("kept until the run is pruned")

    run_id = durable.start(define("pruned_talker", go=step(talks)))
    drain()
    assert StepAttempt.objects.filter(run_id=run_id, logs__isnull=False).count() == 1
    Run.objects.filter(id=run_id).update(finished_at=timezone.now() - timedelta(days=2))
    assert durable.prune(older_than=timedelta(days=1)) == 1
    assert not StepAttempt.objects.filter(run_id=run_id).exists()


@pytest.mark.django_db
def test_the_run_page_include_shows_the_records_escaped_and_the_marker(define):
    def shouts(self, ctx):
        log.warning("<script>alert('x')</script>")
        for i in range(205):
            log.info("line %d", i)

    run_id = durable.start(define("shouter", go=step(shouts)))
    drain()
    attempt = StepAttempt.objects.get(run_id=run_id)
    html = render_to_string("django_durable/_attempt_logs.html", {"attempt": attempt})
    assert "shouts attempt 1: 201 log records" in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    assert "<script>" not in html
    assert "durable-log-truncated" in html and "6 more record(s) not kept" in html
    attempt.logs = None
    assert render_to_string("django_durable/_attempt_logs.html", {"attempt": attempt}).strip() == ""


@pytest.mark.django_db(transaction=True)
def test_keeping_the_logs_costs_no_query(define):
    """The records ride on the attempt's own INSERT (on PostgreSQL the one-statement
    CTE of store/steps.py): a step that logs makes as many queries as one that doesn't."""

    def silent(self, ctx):
        return 1

    def talks(self, ctx):
        log.warning("one record")
        return 1

    counts = {}
    for name, fn in [("silent_step", silent), ("talking_step", talks)]:
        run_id = durable.start(define(name, go=step(fn)))
        (run,) = store.claim(worker_id="counter", queues=None, limit=1, lease=timedelta(seconds=30))
        with CaptureQueriesContext(store.db()) as queries:
            assert executor.execute(run) == 1
        counts[name] = len(queries)
    assert messages(logs_of(run_id, "talks")) == ["one record"]
    assert counts["silent_step"] == counts["talking_step"]
