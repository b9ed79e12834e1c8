"""Workflows of the fault proofs (tests/test_pg_restart.py, tests/test_terminated_backends.py,
tests/test_failover.py).

Each step body adds an ``Execution`` row before it returns, so a test counts how
often each step ran (repeats allowed: at-least-once per step is what is measured).
"""

import os
import time

from django.db import connection, connections, transaction

from django_durable import Workflow, step

from .models import Execution

__all__ = ["BusySteps", "LandsOnAStandby", "RestartSteps", "WritesToAReadOnlyDatabase"]


def ran(ctx, step_name: str) -> None:
    Execution.objects.create(run_id=ctx.run_id, step=step_name, pid=os.getpid())


class RestartSteps(Workflow):
    """Three steps, each pausing ``input["pause"]`` seconds after its effect."""

    name = "restart_steps"

    @step
    def one(self, ctx):
        ran(ctx, "one")
        time.sleep(ctx.input.get("pause", 0))

    @step
    def two(self, ctx):
        ran(ctx, "two")
        time.sleep(ctx.input.get("pause", 0))

    @step
    def three(self, ctx):
        ran(ctx, "three")
        time.sleep(ctx.input.get("pause", 0))
        return "done"


def busy(rounds: int) -> None:
    """Real work on the database: a few short statements, each taking a moment."""
    with connection.cursor() as cursor:
        for _ in range(rounds):
            cursor.execute("SELECT pg_sleep(0.01), count(*) FROM pg_class")


class BusySteps(Workflow):
    """Steps that talk to the database for a while; with ``input["atomic"]`` the middle
    one does it inside its own ``transaction.atomic()``, as application code does."""

    name = "busy_steps"

    @step
    def load(self, ctx):
        busy(ctx.input.get("rounds", 5))
        ran(ctx, "load")

    @step
    def save(self, ctx):
        if ctx.input.get("atomic"):
            with transaction.atomic():
                ran(ctx, "save")
                busy(ctx.input.get("rounds", 5))
        else:
            ran(ctx, "save")
            busy(ctx.input.get("rounds", 5))

    @step
    def done(self, ctx):
        ran(ctx, "done")
        return ctx.input.get("n")


class LandsOnAStandby(Workflow):
    """Its first attempt's session refuses writes, as a standby's does (SQLSTATE 25006):
    the step's own write fails. Its later attempts write."""

    name = "lands_on_a_standby"

    @step
    def write(self, ctx):
        if ctx.attempt == 1:
            with connection.cursor() as cursor:
                cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
        ran(ctx, "write")
        return ctx.attempt


class WritesToAReadOnlyDatabase(Workflow):
    """Its step writes through a connection of its own that refuses writes (a replica,
    say) while django-durable's database accepts them: the step's own failure."""

    name = "writes_to_a_read_only_database"

    @step
    def write(self, ctx):
        own = connections.create_connection("default")
        try:
            with own.cursor() as cursor:
                cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
                cursor.execute("CREATE TEMPORARY TABLE refused (n int)")
        finally:
            own.close()
