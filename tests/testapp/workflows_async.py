"""``async def`` steps and step logs, for tests/test_async_steps.py and the worker
processes of tests/test_async_worker.py."""

import asyncio
import logging
from pathlib import Path

from asgiref.sync import sync_to_async

import django_durable as durable
from django_durable import Workflow, step

from .models import SideEffect

__all__ = [
    "AsyncHeartbeating",
    "AsyncRetry",
    "AsyncSaga",
    "AsyncSleepsLong",
    "AsyncWaits",
    "LogsEverywhere",
    "MixedSteps",
]

logger = logging.getLogger("tests.testapp.async_steps")

WAIT_LIMIT = 60  # seconds; a forgotten test never keeps a worker forever


def effect(ctx, name, note=""):
    SideEffect.objects.create(run_id=ctx.run_id, step=name, note=note)


async def aeffect(ctx, name, note=""):
    await SideEffect.objects.acreate(run_id=ctx.run_id, step=name, note=note)


def _touch(ctx, name):
    (Path(ctx.input["dir"]) / name).touch()


class MixedSteps(Workflow):
    """Sync, async, sync: context and results pass between both kinds."""

    name = "mixed_steps"

    @step
    def prepare(self, ctx):
        ctx.put("numbers", [1, 2, 3])
        effect(ctx, "prepare")

    @step
    async def add(self, ctx):
        await asyncio.sleep(0.01)
        total = sum(ctx.get("numbers"))
        ctx.put("total", total)
        await aeffect(ctx, "add", note=str(total))
        return total

    @step
    def finish(self, ctx):
        effect(ctx, "finish")
        return {"total": ctx.get("total"), "input": ctx.input.get("n")}


class AsyncWaits(Workflow):
    """An async step that sleeps, then waits for an event: both suspend the run."""

    name = "async_waits"

    @step
    async def nap(self, ctx):
        ctx.sleep(durable.seconds(ctx.input.get("seconds", 3600)))
        return "rested"

    @step
    async def listen(self, ctx):
        payload = ctx.wait_for_event("go", timeout=durable.hours(1), timeout_value="late")
        await aeffect(ctx, "listen", note=str(payload))
        return payload


class AsyncRetry(Workflow):
    """Fails on its first attempt, logging why; the retry completes."""

    name = "async_retry"

    @step(retries=1, backoff=durable.seconds(0))
    async def wobble(self, ctx):
        logger.warning("attempt %d starting", ctx.attempt)
        if ctx.attempt == 1:
            raise ValueError("first attempt fails")
        return ctx.attempt


class AsyncHeartbeating(Workflow):
    """An async step that awaits ctx.aheartbeat() in a loop until cancelled."""

    name = "async_heartbeating"

    @step
    async def long(self, ctx):
        _touch(ctx, "async-long-started")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_LIMIT
        try:
            while loop.time() < deadline:
                await ctx.aheartbeat()
                await asyncio.sleep(0.05)
        except (durable.Cancelled, asyncio.CancelledError):
            # aheartbeat raises Cancelled, or the worker cancels the task first.
            await aeffect(ctx, "long-cancelled")
            raise
        await aeffect(ctx, "long")

    @step
    def after(self, ctx):
        effect(ctx, "after")


class AsyncSleepsLong(Workflow):
    """An async step in one long ``asyncio.sleep``: only its task's cancellation
    stops it (it never calls aheartbeat)."""

    name = "async_sleeps_long"

    @step
    async def long(self, ctx):
        _touch(ctx, "sleep-started")
        try:
            await asyncio.sleep(WAIT_LIMIT)
        except asyncio.CancelledError:
            await aeffect(ctx, "long-task-cancelled")
            raise
        await aeffect(ctx, "long")

    @step
    def after(self, ctx):
        effect(ctx, "after")


class AsyncSaga(Workflow):
    """An async step with an async compensation, undone when the next step fails."""

    name = "async_saga"

    @step(compensate="unreserve")
    async def reserve(self, ctx):
        await aeffect(ctx, "reserve")
        return "R1"

    @step
    def charge(self, ctx):
        raise RuntimeError("card declined")

    async def unreserve(self, ctx):
        logger.info("releasing the reservation")
        await aeffect(ctx, "unreserve")
        return "released"


class LogsEverywhere(Workflow):
    """Logs from the step's thread, a task it starts, and a sync_to_async call."""

    name = "logs_everywhere"

    @step
    def sync_part(self, ctx):
        logging.getLogger("tests.sync").info("sync step %s", ctx.input.get("tag"))
        return "sync"

    @step
    async def async_part(self, ctx):
        tag = ctx.input.get("tag")
        logger.info("async step %s", tag)

        async def helper():
            await asyncio.sleep(0)
            logger.info("in a task of %s", tag)

        await asyncio.gather(helper(), helper())
        await sync_to_async(logging.getLogger("tests.sync").info)("sync_to_async of %s", tag)
        return "async"
