"""Workflows that break the way production code breaks (tests/test_failures*.py).

``Execution`` rows count how often each step's body ran (no unique constraint:
a repeat is what these tests look for).
"""

import os
import signal
import time

import django_durable as durable
from django_durable import Workflow, step

from .models import Execution


def ran(ctx, step_name: str) -> None:
    Execution.objects.create(run_id=ctx.run_id, step=step_name)


class ReturnsNul(Workflow):
    name = "returns_nul"

    @step(retries=2, backoff=durable.seconds(0))
    def bad(self, ctx):
        ran(ctx, "bad")
        return "a\x00b"


class PutsNul(Workflow):
    name = "puts_nul"

    @step(retries=2, backoff=durable.seconds(0))
    def bad(self, ctx):
        ran(ctx, "bad")
        ctx.put("text", "a\x00b")


class PutsNonJson(Workflow):
    name = "puts_non_json"

    @step(retries=2, backoff=durable.seconds(0))
    def bad(self, ctx):
        ran(ctx, "bad")
        ctx.put("when", object())


class ReturnsTooMuch(Workflow):
    name = "returns_too_much"

    @step(retries=2, backoff=durable.seconds(0))
    def bad(self, ctx):
        ran(ctx, "bad")
        return "x" * (ctx.input.get("bytes", 2 * 1024 * 1024))


class RaisesBase(Workflow):
    """Raises ``ctx.input["what"]``: SystemExit, KeyboardInterrupt or BaseException."""

    name = "raises_base"

    @step(retries=2, backoff=durable.seconds(0))
    def bad(self, ctx):
        ran(ctx, "bad")
        kind = {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}
        raise kind.get(ctx.input["what"], BaseException)("from the step")


class GivesUp(Workflow):
    name = "gives_up"

    @step(retries=5, backoff=durable.seconds(0), give_up_on=(LookupError,))
    def bad(self, ctx):
        ran(ctx, "bad")
        if ctx.input.get("non_retryable"):
            raise durable.NonRetryable("the card was declined")
        raise KeyError("no such customer")


class KillsItsWorker(Workflow):
    """An out-of-memory kill or a segfault in a C extension, as a test can cause it."""

    name = "kills_its_worker"

    @step
    def crash(self, ctx):
        ran(ctx, "crash")
        os.kill(os.getpid(), signal.SIGKILL)


class BacksOff(Workflow):
    """Fails with a long backoff, under a short run timeout."""

    name = "backs_off"
    timeout = durable.minutes(10)
    reuse = "after_failure"

    @step(retries=3, backoff=durable.hours(1))
    def flaky(self, ctx):
        ran(ctx, "flaky")
        if not ctx.input.get("ok"):
            raise RuntimeError("not yet")
        return "done"


class RunsLong(Workflow):
    """Heartbeats until ``ctx.heartbeat()`` stops it (``RunTimedOut``)."""

    name = "runs_long"
    timeout = durable.seconds(1)

    @step
    def long(self, ctx):
        ran(ctx, "long")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ctx.heartbeat()
            time.sleep(0.05)
        return "never recorded"


class StepTimesOut(Workflow):
    name = "step_times_out"

    @step(retries=1, backoff=durable.seconds(0), timeout=durable.seconds(0.5))
    def slow(self, ctx):
        ran(ctx, "slow")
        time.sleep(0.7)  # no heartbeat: the attempt ends late, its result is dropped
        return "late"


class StartsAndWaits(Workflow):
    """Starts another run with ``ctx.start``, then waits twice."""

    name = "starts_and_waits"

    @step
    def kick_off(self, ctx):
        ran(ctx, "kick_off")
        started = ctx.start("noop", {"from": str(ctx.run_id)})
        ctx.wait_for_event("first")
        ctx.wait_for_event("second")
        return str(started)


class Steps3(Workflow):
    """Three steps with a visible effect each (the restart and fault tests)."""

    name = "steps_3"

    @step
    def one(self, ctx):
        ran(ctx, "one")

    @step
    def two(self, ctx):
        ran(ctx, "two")

    @step
    def three(self, ctx):
        ran(ctx, "three")
        return "done"


if not os.environ.get("DURABLE_OLD_CODE"):
    # A workflow that a worker running the previous release does not have.

    class AddedInThisRelease(Workflow):
        name = "added_in_this_release"

        @step
        def new(self, ctx):
            ran(ctx, "new")
            return "new code"
