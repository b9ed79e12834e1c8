"""Workflows of tests/test_stopping_processes.py: one run of a flow key at a time,
each execution of its step writing, to a file of its own, when it began, that it
still runs (every few milliseconds) and when it ended -- what a process really
executed, whatever the database says."""

import os
import time
import uuid
from pathlib import Path

from django_durable import Workflow, step

from .workflows_flow import tenant

__all__ = ["OneAtATimeLong"]

TICK = 0.01


class OneAtATimeLong(Workflow):
    """``concurrency_per_key = 1``; the first execution of each run's step takes
    ``input["long"]`` seconds (calling ``ctx.heartbeat()`` at each tick with
    ``input["heartbeat"]``), the next ones ``input.get("seconds", 0.1)``."""

    name = "one_at_a_time_long"
    queue = "stopping"
    flow_key = staticmethod(tenant)
    concurrency_per_key = 1

    @step
    def work(self, ctx):
        folder = Path(ctx.input["dir"])
        first = folder / f"{ctx.run_id}.first"
        long = "long" in ctx.input and not first.exists()
        first.touch()
        seconds = ctx.input["long"] if long else ctx.input.get("seconds", 0.1)
        name = f"{ctx.run_id}-{os.getpid()}-{uuid.uuid4().hex[:6]}.span"
        with open(folder / name, "a", buffering=1) as span:
            span.write(f"began {time.time()}\n")
            try:
                until = time.monotonic() + seconds
                while time.monotonic() < until:
                    if ctx.input.get("heartbeat"):
                        ctx.heartbeat()
                    time.sleep(TICK)
                    span.write(f"alive {time.time()}\n")
            finally:
                span.write(f"ended {time.time()}\n")
