"""Workflows the test suite starts. Found by autodiscovery, like a project's own."""

import django_durable as durable
from django_durable import Workflow, step

from .models import SideEffect


def effect(ctx, step_name, note=""):
    SideEffect.objects.create(run_id=ctx.run_id, step=step_name, note=note)


class ProcessArticle(Workflow):
    name = "process_article"
    reuse = "after_failure"

    @step
    def fetch(self, ctx):
        effect(ctx, "fetch")
        ctx.put("body", f"body of {ctx.input.get('id')}")
        if ctx.input.get("fail"):
            raise RuntimeError("the article could not be fetched")

    @step
    def summarize(self, ctx):
        effect(ctx, "summarize", ctx.get("body"))
        return {"summary": ctx.get("body")[:10]}


class SyncAccount(Workflow):
    """Default reuse (after_close): one sync at a time per account."""

    @step
    def sync(self, ctx):
        effect(ctx, "sync")
        if ctx.input.get("fail"):
            raise RuntimeError("sync failed")
        return "synced"


class SendInvoice(Workflow):
    reuse = "never"
    on_duplicate = "error"

    @step
    def send(self, ctx):
        effect(ctx, "send")
        return {"sent": ctx.input.get("id")}


class Flaky(Workflow):
    """Fails its first attempts, then succeeds."""

    @step(retries=3, backoff=durable.seconds(0))
    def wobble(self, ctx):
        effect(ctx, f"wobble-{ctx.attempt}")
        if ctx.attempt <= ctx.input.get("failures", 0):
            raise ValueError(f"attempt {ctx.attempt} fails")
        return ctx.attempt


class SlowRetry(Workflow):
    """Between its attempts it waits an hour: the run stays active and keeps its key."""

    @step(retries=2, backoff=durable.hours(1))
    def attempt(self, ctx):
        raise ValueError("not yet")


class Noop(Workflow):
    @step
    def one(self, ctx):
        return 1

    @step
    def two(self, ctx):
        return 2

from .workflows_engine import *  # noqa: E402, F401, F403  (compensations, children, schedules)
