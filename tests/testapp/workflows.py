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


# --- worker tests (tests/test_worker_*.py) -------------------------------------
# Steps that block on files in ``ctx.input["dir"]`` let a test act while a worker
# process is known to be in the middle of a step.

WAIT_LIMIT = 60  # seconds; keeps a forgotten test from hanging a worker forever


def _signal_file(ctx, name):
    from pathlib import Path

    path = Path(ctx.input["dir"]) / name
    path.touch()
    return path


def _wait_for_file(ctx, name):
    import time
    from pathlib import Path

    path = Path(ctx.input["dir"]) / name
    deadline = time.monotonic() + WAIT_LIMIT
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


class WorkerBlocking(Workflow):
    """Its first step says it started, then waits for a ``release`` file (first attempt
    only: a recovered run goes straight through)."""

    name = "worker_blocking"

    @step
    def first(self, ctx):
        _signal_file(ctx, f"first-started-{ctx.attempt}")
        if ctx.attempt == 1:
            _wait_for_file(ctx, "release")
        effect(ctx, "first")

    @step
    def second(self, ctx):
        effect(ctx, "second")


class WorkerHeartbeating(Workflow):
    """A long first step that calls ctx.heartbeat() until it is told to stop."""

    name = "worker_heartbeating"

    @step
    def long(self, ctx):
        import time

        _signal_file(ctx, "long-started")
        deadline = time.monotonic() + WAIT_LIMIT
        try:
            while time.monotonic() < deadline:
                ctx.heartbeat()
                time.sleep(0.05)
        except durable.Cancelled:
            effect(ctx, "long-cancelled")
            raise
        effect(ctx, "long")

    @step
    def after(self, ctx):
        effect(ctx, "after")


class WorkerUnaware(Workflow):
    """A step that never calls ctx.heartbeat(): a cancel can only stop what follows it."""

    name = "worker_unaware"

    @step
    def first(self, ctx):
        _signal_file(ctx, "unaware-started")
        _wait_for_file(ctx, "release")
        effect(ctx, "first")

    @step
    def second(self, ctx):
        effect(ctx, "second")


class WorkerSleeper(Workflow):
    """Sleeps between two steps: a timer in the database, not a sleeping thread."""

    name = "worker_sleeper"

    @step
    def nap(self, ctx):
        ctx.sleep(durable.seconds(ctx.input.get("seconds", 0.5)))
        effect(ctx, "nap")

    @step
    def wake(self, ctx):
        effect(ctx, "wake")


class WorkerAwaitsEvent(Workflow):
    """Waits for the event "go"; its worker is free meanwhile."""

    name = "worker_awaits_event"

    @step
    def wait(self, ctx):
        effect(ctx, "got", str(ctx.wait_for_event("go")))
