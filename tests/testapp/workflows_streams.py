"""Workflows of the stream failure tests (tests/test_stream_failures.py) and the streams
benchmark (bench/streams_suite.py), run by real worker processes."""

import time

from django.db import transaction

from django_durable import Workflow, step

from .models import Execution

__all__ = ["StreamsSlowly", "WritesInsideItsTransaction"]


class StreamsSlowly(Workflow):
    """Writes ``input["items"]`` items ``"tok-<i>"`` to the stream "text", pausing
    ``input["pause"]`` seconds after each, then closes it. Each execution of the step
    adds an ``Execution`` row first (a test counts them)."""

    name = "streams_slowly"

    @step(retries=5)
    def generate(self, ctx):
        Execution.objects.create(run_id=ctx.run_id, step="generate")
        out = ctx.stream("text")
        for i in range(ctx.input["items"]):
            out.write(f"tok-{i}")
            time.sleep(ctx.input.get("pause", 0))
        out.close()


class WritesInsideItsTransaction(Workflow):
    """Writes "kept" inside a transaction the step opens and rolls back (an error),
    then fails: what the docs say of a write in the step's own transaction."""

    name = "writes_inside_its_transaction"

    @step
    def generate(self, ctx):
        out = ctx.stream("text")
        try:
            with transaction.atomic():
                Execution.objects.create(run_id=ctx.run_id, step="rolled back")
                out.write("kept")
                raise ValueError("the step's transaction rolls back")
        except ValueError:
            pass
        out.write("after")
        out.close()
