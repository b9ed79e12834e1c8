"""Workflows the test suite starts. Found by autodiscovery, like a project's own."""

import threading

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


# --- waits and updates while a run is going --------------------------------------

_gates: dict[str, threading.Event] = {}


def gate(name):
    """A threading.Event a test opens to let a blocked step go on."""
    return _gates.setdefault(name, threading.Event())


class Sleeper(Workflow):
    @step
    def nap(self, ctx):
        # The step runs again from its start on resume: count how often it began.
        effect(ctx, f"nap-{SideEffect.objects.filter(run_id=ctx.run_id).count()}")
        ctx.sleep(durable.seconds(ctx.input.get("seconds", 1)))
        return "rested"


class WaitsForEvent(Workflow):
    @step
    def listen(self, ctx):
        timeout = ctx.input.get("timeout")
        return ctx.wait_for_event(
            "go", timeout=durable.seconds(timeout) if timeout else None, timeout_value="timed out"
        )


class WaitsForApproval(Workflow):
    @step
    def ask(self, ctx):
        approval = ctx.wait_for_input("approval", timeout=ctx.input.get("timeout"))
        ctx.put("approval", approval)

    @step
    def act(self, ctx):
        return {"approved_by": (ctx.get("approval") or {}).get("by")}


class TwoWaits(Workflow):
    """Two waits in one step: on each resume the passed waits return their values."""

    @step
    def both(self, ctx):
        first = ctx.wait_for_event("first")
        second = ctx.wait_for_event("second")
        return [first, second]


class BlocksThenWaits(Workflow):
    """Blocks mid-step until the test opens its gate, then waits for an event."""

    @step
    def work(self, ctx):
        gate(ctx.input["gate"]).wait(timeout=10)
        return ctx.wait_for_event("article_updated", timeout=durable.seconds(30))


class CatchUpArticle(Workflow):
    """A later start's input reaches the running run as an event."""

    reuse = "after_failure"
    on_duplicate = ("send_event", "article_updated")

    @step
    def fetch(self, ctx):
        ctx.put("rev", ctx.input.get("rev"))

    @step
    def catch_up(self, ctx):
        update = ctx.wait_for_event(
            "article_updated", timeout=durable.seconds(60), timeout_value=None
        )
        return {"first_rev": ctx.get("rev"), "update": update}


class RebuildIndex(Workflow):
    on_duplicate = "run_again"

    @step
    def rebuild(self, ctx):
        effect(ctx, "rebuild", str(ctx.input.get("v")))
        if ctx.input.get("fail"):
            raise RuntimeError("rebuild failed")
        return ctx.input.get("v")


class RebuildOnce(Workflow):
    """run_again under after_failure: a completed holder keeps the key."""

    reuse = "after_failure"
    on_duplicate = "run_again"
    timeout = durable.minutes(10)

    @step
    def rebuild(self, ctx):
        return ctx.input.get("v")


class Replaceable(Workflow):
    on_duplicate = "cancel_existing"
    reuse = "never"

    @step
    def long(self, ctx):
        effect(ctx, "long-start")
        for _ in range(200):
            if ctx.input.get("gate"):
                gate(ctx.input["gate"]).wait(timeout=0.05)
            ctx.heartbeat()
        effect(ctx, "long-end")


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


class WorkerMarksAttempts(Workflow):
    """One step that leaves a file per attempt, outside the database."""

    name = "worker_marks_attempts"

    @step
    def only(self, ctx):
        _signal_file(ctx, f"ran-{ctx.input['n']}-{ctx.attempt}")
        return ctx.attempt


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


class IndexArticle(Workflow):
    debounce = durable.Debounce(period=durable.seconds(1), timeout=durable.seconds(2))
    timeout = durable.minutes(5)

    @step
    def index(self, ctx):
        return ctx.input


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


from .workflows_async import *  # noqa: E402, F401, F403  (async steps, step logs)
from .workflows_engine import *  # noqa: E402, F401, F403  (compensations, children, schedules)
from .workflows_failures import *  # noqa: E402, F401, F403  (the failure contract)
from .workflows_faults import *  # noqa: E402, F401, F403  (restarts, terminated backends)
from .workflows_queues import *  # noqa: E402, F401, F403  (priorities, queues, limits)
from .workflows_streams import *  # noqa: E402, F401, F403  (streams under failures)


class KeyedOnce(Workflow):
    """A key starts it once, ever: tests/test_pgbouncer.py counts one run per key."""

    name = "keyed_once"
    reuse = "never"

    @step
    def record(self, ctx):
        effect(ctx, "record", str(ctx.input.get("n", "")))
        return ctx.input.get("n")

    @step
    def finish(self, ctx):
        return "done"


from .workflows_flow import *  # noqa: E402, F401, F403  (flow control by key)
from .workflows_stopping import *  # noqa: E402, F401, F403  (stopping workers)
