"""Wrong uses of the public API that type checkers must report (tests/test_types.py).

Each line marked ``# expect-error`` must be reported by mypy and by pyright, and no
other line may be; ``# expect-error: mypy`` (or ``pyright``) names the one tool that
catches it. Never imported by the suite: it is only read by the type checkers.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import django_durable as durable
from django_durable import Context, Workflow, step
from django_durable.testing import assert_completed, assert_started, drain, runs_of


class Article(Workflow):
    reuse = "sometimes"  # expect-error
    on_duplicate = "eror"  # expect-error
    priority = "high"  # expect-error

    @step
    def fetch(self, ctx: Context) -> None:
        ctx.put(42, "value")  # expect-error
        ctx.increment("n", by="1")  # expect-error
        ctx.sleep("5 minutes")  # expect-error
        ctx.start(Article, key=7)  # expect-error

    @step(retrys=3)  # expect-error
    def typo(self, ctx: Context) -> None: ...

    @step(retries="3")  # expect-error
    def wrong_retries(self, ctx: Context) -> None: ...

    @step(backoff_kind="quadratic")  # expect-error
    def wrong_kind(self, ctx: Context) -> None: ...

    @step(3)  # expect-error
    def positional(self, ctx: Context) -> None: ...

    @step  # expect-error
    def no_context(self) -> None: ...

    @step  # expect-error
    def wrong_context(self, ctx: int) -> None: ...


def starts(run_id: uuid.UUID) -> None:
    durable.start(Article, {"id": 1}, keyy="article:1")  # expect-error
    durable.start(Article, {"id": 1}, key=42)  # expect-error
    durable.start(Article, {"id": 1}, priority="high")  # expect-error
    durable.start(Article, {"id": 1}, run_after=30)  # expect-error
    durable.start(Article, {"id": 1}, on_duplicate="replace")  # expect-error
    durable.start(Article, {"id": 1}, on_duplicate=("send_event",))  # expect-error
    durable.start(Article, {"id": 1}, reuse="never")  # expect-error
    durable.start(Article, [1, 2])  # expect-error
    durable.start(Article, {"id": 1}, "article:1")  # expect-error
    durable.start()  # expect-error
    durable.start(42)  # expect-error
    durable.start_detailed(Article, queue=5)  # expect-error
    durable.start_many(Article, [{"id": 1}])  # expect-error
    durable.start_many(Article, [({"id": 1}, "k")], key="k")  # expect-error
    durable.explain(Article, run_after=timedelta(1))  # expect-error
    outcome: int = durable.start_detailed(Article).outcome  # expect-error
    started: str = durable.start(Article)  # expect-error
    durable.retry()  # expect-error
    durable.rerun(run_id, key="k")  # expect-error
    durable.release_key(run_id, "ops", "extra")  # expect-error
    durable.cancel(run_id, reason=3)  # expect-error
    durable.send_event(run_id)  # expect-error
    durable.provide_input(run_id, "name")  # expect-error
    durable.get_run(run_id).no_such_field  # expect-error
    durable.pause_queue()  # expect-error
    durable.strat(Article)  # expect-error


async def in_an_async_view(run_id: uuid.UUID) -> None:
    await durable.astart(Article, keyy="k")  # expect-error
    await durable.astart_many(Article, [({"id": 1}, 2)])  # expect-error
    await durable.aexplain(Article, priority=1)  # expect-error
    await durable.acancel(run_id, why="x")  # expect-error
    same: uuid.UUID = durable.astart(Article)  # expect-error


def in_a_test(run_id: uuid.UUID) -> None:
    drain(run_timers="yes")  # expect-error
    drain(5, ["default"])  # expect-error
    assert_started(Article, "article:1")  # expect-error
    assert_completed(run_id, 5)  # expect-error
    runs_of(Article, status=3)  # expect-error
