"""Workflows for priorities, delayed starts, queues and their concurrency limits."""

import time

from django_durable import Workflow, step

from .models import SideEffect


class RunsInOrder(Workflow):
    """Records the order its runs ran in."""

    @step
    def mark(self, ctx):
        SideEffect.objects.create(run_id=ctx.run_id, step="mark", note=str(ctx.input.get("n")))


class Limited(Workflow):
    """Holds its worker thread for ``seconds`` (a rate-limited API, say)."""

    queue = "limited"

    @step
    def call_api(self, ctx):
        time.sleep(ctx.input.get("seconds", 0.2))
        return "called"


class Unlimited(Workflow):
    """A run of another queue, which must keep flowing beside a saturated one."""

    queue = "other"

    @step
    def quick(self, ctx):
        time.sleep(ctx.input.get("seconds", 0.05))
        return "done"
