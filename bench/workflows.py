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


# worker_c4_flow: the flow keys its runs are spread over.
FLOW_KEYS = 20


class BenchFlowed(BenchTwoSteps):
    """bench_two_steps (its steps, inherited) with a flow key per run (``tenant:N``,
    set when the runs are queued) and a per-key limit it never reaches:
    ``worker_c4_flow``, the cost of flow control's claim in a worker."""

    name = "bench_flowed"
    flow_key = staticmethod(lambda input: f"tenant:{input['i'] % FLOW_KEYS}")
    concurrency_per_key = 10_000


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


class ScaleSmall(Workflow):
    """A workflow with a few keys on a big table (the scale suite's ``list_keys``)."""

    name = "scale_small"

    @step
    def only(self, ctx):
        return None


class BenchSoak(Workflow):
    """The soak's traffic: keyed, one step. A completed run keeps its key until it is
    pruned (``reuse="after_failure"``), so a repeated key is a duplicate whether its
    holder is still going or done."""

    name = "bench_soak"
    reuse = "after_failure"

    @step
    def only(self, ctx):
        return None


class BenchHot(Workflow):
    """The many-producer suite's traffic: half of the starts on 100 hot keys."""

    name = "bench_hot"

    @step
    def only(self, ctx):
        return None
