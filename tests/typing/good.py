"""A typed project's use of the public API. mypy (with django-stubs) and pyright must
report nothing here (tests/test_types.py); ``assert_type`` pins what they infer.

Never imported by the suite: it is only read by the type checkers.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, assert_type

from django.db import transaction
from django.db.models import QuerySet

import django_durable as durable
from django_durable import Context, Cron, Debounce, Workflow, seconds, step
from django_durable.models import Run
from django_durable.testing import (
    assert_completed,
    assert_failed,
    assert_started,
    drain,
    runs_of,
)


class ProcessArticle(Workflow):
    name = "process_article"
    reuse = "after_failure"
    on_duplicate = "use_existing"
    debounce = Debounce(period=seconds(30), timeout=durable.minutes(5))
    timeout = durable.hours(1)
    queue = "articles"
    priority = 10
    schedules = [Cron("*/5 * * * *", key="articles:sweep")]

    @step
    def fetch(self, ctx: Context) -> None:
        ctx.put("body", f"article {ctx.input['id']}")
        assert_type(ctx.run_id, uuid.UUID)
        assert_type(ctx.attempt, int)
        assert_type(ctx.key, str | None)

    @step(retries=3, backoff=seconds(1), compensate="undo_fetch")
    def summarize(self, ctx: Context) -> str:
        body = ctx.get("body", "")
        ctx.heartbeat()
        count = ctx.increment("summaries")
        assert_type(count, int)
        ctx.append("log", "summarized")
        ctx.merge({"lang": "en"})
        ctx.delete("lang")
        return str(body)[:100]

    @step(
        retries=5,
        backoff=timedelta(seconds=2),
        backoff_kind="linear",
        max_backoff=durable.minutes(1),
        jitter=True,
        timeout=30,
        give_up_on=(KeyError, ValueError),
    )
    def publish(self, ctx: Context) -> dict[str, Any]:
        ctx.sleep(durable.seconds(5))
        ctx.sleep_until(datetime(2030, 1, 1, tzinfo=UTC))
        approved = ctx.wait_for_input("approval", timeout=durable.days(2), timeout_value=False)
        payment = ctx.wait_for_event("paid", timeout=60)
        child = ctx.start(Notify, {"id": ctx.input["id"]}, key=f"notify:{ctx.input['id']}")
        assert_type(child, uuid.UUID)
        result = ctx.call_workflow("notify", {"id": 1})
        results = ctx.parallel([Notify, (Notify, {"id": 2})], mode="all_settled")
        assert_type(results, list[Any])
        if not approved:
            raise durable.NonRetryable("not approved")
        return {"payment": payment, "child": result}

    def undo_fetch(self, ctx: Context) -> None:
        ctx.delete("body")


class Notify(Workflow):
    reuse = "never"
    on_duplicate = ("send_event", "again")

    @step
    async def send(self, ctx: Context) -> None:
        await ctx.aheartbeat()
        await ctx.acall_workflow(ProcessArticle, {"id": 3})
        await ctx.aparallel([Notify])


class Untyped(Workflow):
    # A step without annotations is fine too.
    @step
    def only(self, ctx):
        return ctx.input


def starting() -> None:
    with transaction.atomic():
        run_id = durable.start(ProcessArticle, {"id": 42}, key="article:42")
    assert_type(run_id, uuid.UUID)
    durable.start("process_article")
    durable.start(ProcessArticle, None, key=None, on_duplicate="error")
    durable.start(ProcessArticle, {"id": 1}, on_duplicate=("send_event", "edited"))
    durable.start(
        ProcessArticle,
        {"id": 2},
        run_after=timedelta(minutes=5),
        priority=50,
        queue="urgent",
    )
    durable.start(ProcessArticle, run_after=datetime(2030, 1, 1, tzinfo=UTC))

    result = durable.start_detailed(ProcessArticle, {"id": 42}, key="article:42")
    assert_type(result, durable.StartResult)
    assert_type(result.run_id, uuid.UUID)
    if result.outcome == "handed_off":
        print("a finished holder gave the key")

    results = durable.start_many(
        ProcessArticle, [({"id": 1}, "article:1"), (None, None)], on_duplicate="use_existing"
    )
    assert_type(results, list[durable.StartResult])

    plan = durable.explain(ProcessArticle, {"id": 42}, key="article:42", on_duplicate="run_again")
    assert_type(plan, durable.Explanation)
    assert_type(plan.holder_id, uuid.UUID | None)
    if plan.outcome == "key_taken":
        print(plan.reason)

    try:
        durable.start(ProcessArticle, {"id": 42}, key="article:42", on_duplicate="error")
    except durable.KeyTaken as taken:
        assert_type(taken.holder_id, uuid.UUID)
    except durable.KeyContended:
        pass


def acting(run_id: uuid.UUID) -> None:
    assert_type(durable.retry(run_id), uuid.UUID)
    assert_type(durable.rerun(str(run_id)), uuid.UUID)
    durable.release_key(run_id, by="ops@example.com")
    durable.cancel(run_id, reason="not needed")
    durable.cancel(run_id)
    durable.send_event(run_id, "paid", {"amount": 10}, buffer=True)
    durable.provide_input(run_id, "approval", True)
    run = durable.get_run(run_id)
    assert_type(run, Run)
    runs = durable.list_executions(key="article:42", workflow=ProcessArticle, status="failed")
    assert_type(runs, QuerySet[Run])


def operating() -> None:
    durable.pause_queue("emails")
    durable.resume_queue("emails")
    for row in durable.queue_stats():
        print(row["queue"], row["paused"])
    durable.queue_stats("emails")
    durable.schedule(ProcessArticle, "0 * * * *", key="hourly", input={"id": 0}, name="hourly")
    fired = durable.trigger_schedule("hourly")
    assert_type(fired, uuid.UUID | None)
    durable.disable_schedule("hourly")
    durable.enable_schedule("hourly")
    assert_type(durable.prune(older_than=durable.days(30)), int)


async def in_an_async_view(run_id: uuid.UUID) -> None:
    started = await durable.astart(ProcessArticle, {"id": 7}, key="article:7", priority=1)
    assert_type(started, uuid.UUID)
    detailed = await durable.astart_detailed(
        ProcessArticle, {"id": 7}, key="article:7", run_after=timedelta(seconds=10)
    )
    assert_type(detailed, durable.StartResult)
    many = await durable.astart_many(ProcessArticle, [({"id": 8}, "article:8")])
    assert_type(many, list[durable.StartResult])
    plan = await durable.aexplain(ProcessArticle, {"id": 7}, key="article:7")
    assert_type(plan, durable.Explanation)
    assert_type(await durable.aretry(run_id), uuid.UUID)
    assert_type(await durable.arerun(run_id), uuid.UUID)
    await durable.arelease_key(run_id, by="ops")
    await durable.acancel(run_id, reason="duplicate")
    await durable.asend_event(run_id, "paid", payload=None, buffer=False)
    await durable.aprovide_input(run_id, "approval", {"ok": True})
    assert_type(await durable.aget_run(run_id), Run)


def in_a_test() -> None:
    run_id = durable.start(ProcessArticle, {"id": 1}, key="article:1")
    assert_type(drain(), int)
    drain(max_seconds=30, run_timers=True)
    drain(5, queues=["articles"])
    run = assert_started(ProcessArticle, key="article:1", input={"id": 1}, count=1)
    assert_type(run, Run)
    assert_type(assert_completed(run_id), Run)
    assert_failed(run_id, error="boom")
    assert_type(runs_of(ProcessArticle, status="completed"), QuerySet[Run])
    runs_of("process_article").count()
