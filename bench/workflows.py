"""The workflows the benchmark runs: no-op steps, so only the engine is measured."""

from django_durable import Workflow, step


class BenchTwoSteps(Workflow):
    name = "bench_two_steps"

    @step
    def first(self, ctx):
        return None

    @step
    def second(self, ctx):
        return None


class BenchOneStep(Workflow):
    name = "bench_one_step"

    @step
    def only(self, ctx):
        return None


class BenchKeyed(Workflow):
    """Started with keys; default reuse (after_close) and on_duplicate (use_existing)."""

    name = "bench_keyed"

    @step
    def only(self, ctx):
        return None


class BenchBacklog(Workflow):
    """The runs that wait in another queue during ``worker_c4_backlog``."""

    name = "bench_backlog"
    queue = "backlog"

    @step
    def only(self, ctx):
        return None
