"""Workflows for compensations, children, parallel branches and schedules."""

import django_durable as durable
from django_durable import Workflow, step

from .models import SideEffect


def effect(ctx, name, note=""):
    SideEffect.objects.create(run_id=ctx.run_id, step=name, note=note)


class BookTrip(Workflow):
    """A saga: book a flight and a hotel, charge the card; undo on failure.

    Input: ``fail_at`` (a step that raises), ``fail_undo`` (a compensation that
    raises on its first ``undo_failures`` attempts, or always).
    """

    @step(compensate="cancel_flight")
    def book_flight(self, ctx):
        effect(ctx, "book_flight")
        ctx.put("flight", "F1")
        self._maybe_fail(ctx, "book_flight")
        return "F1"

    @step
    def notify(self, ctx):
        effect(ctx, "notify")
        self._maybe_fail(ctx, "notify")

    @step(compensate="cancel_hotel", compensate_retries=2, backoff=durable.seconds(0))
    def book_hotel(self, ctx):
        effect(ctx, "book_hotel")
        self._maybe_fail(ctx, "book_hotel")
        return "H1"

    @step(retries=1, backoff=durable.seconds(0))
    def charge(self, ctx):
        effect(ctx, f"charge-{ctx.attempt}")
        self._maybe_fail(ctx, "charge")
        return "charged"

    def cancel_flight(self, ctx):
        self._undo(ctx, "cancel_flight")
        return {"cancelled": ctx.get("flight")}

    def cancel_hotel(self, ctx):
        self._undo(ctx, "cancel_hotel")

    def _maybe_fail(self, ctx, name):
        if ctx.input.get("fail_at") == name:
            raise RuntimeError(f"{name} failed")

    def _undo(self, ctx, name):
        effect(ctx, f"{name}-{ctx.attempt}")
        failing = ctx.input.get("fail_undo") == name
        if failing and ctx.attempt <= ctx.input.get("undo_failures", 99):
            raise RuntimeError(f"{name} could not undo")


class SlowUndo(Workflow):
    """Its compensation fails and waits an hour before the next try: the run stays
    compensating, holding its key."""

    on_duplicate = "cancel_existing"

    @step(compensate="undo", compensate_retries=1, backoff=durable.hours(1))
    def do(self, ctx):
        return "done"

    @step
    def explode(self, ctx):
        raise RuntimeError("boom")

    def undo(self, ctx):
        raise RuntimeError("undo not possible yet")


class Double(Workflow):
    """A child: doubles ``n``, or fails when ``fail`` is set."""

    @step
    def double(self, ctx):
        effect(ctx, "double")
        if ctx.input.get("fail"):
            raise ValueError(f"cannot double {ctx.input.get('n')}")
        return ctx.input["n"] * 2


class SlowChild(Workflow):
    """A child that sleeps an hour, so it stays going."""

    @step
    def nap(self, ctx):
        ctx.sleep(durable.hours(1))
        return "rested"


class CallDouble(Workflow):
    """A parent: calls Double, then sleeps (a wait after the call), then returns."""

    @step
    def prepare(self, ctx):
        ctx.put("n", ctx.input.get("n", 1))

    @step
    def compute(self, ctx):
        SideEffect.objects.create(
            run_id=ctx.run_id,
            step=f"compute-{SideEffect.objects.filter(run_id=ctx.run_id).count()}",
        )
        doubled = ctx.call_workflow(
            Double,
            {"n": ctx.get("n"), "fail": ctx.input.get("child_fails", False)},
            key=ctx.input.get("child_key"),
        )
        ctx.sleep(0)
        return doubled


class Fanout(Workflow):
    """Runs Double branches (and a SlowChild when asked) in parallel."""

    @step
    def fan(self, ctx):
        branches = [
            (Double, {"n": n, "fail": n in ctx.input.get("fail", [])}) for n in ctx.input["ns"]
        ]
        if ctx.input.get("slow"):
            branches.append(SlowChild)
        return durable.parallel(branches, mode=ctx.input.get("mode", "fail_fast"))


class FanoutCtx(Workflow):
    @step
    def fan(self, ctx):
        return ctx.parallel([(Double, {"n": 1}), ("double", {"n": 2})], mode="complete_all")


class WaitForChildForever(Workflow):
    @step
    def call(self, ctx):
        return ctx.call_workflow(SlowChild)


class Cleanup(Workflow):
    """Scheduled with a key; the default on_duplicate (use_existing)."""

    schedules = [durable.Cron("0 3 * * *", key="nightly", name="cleanup-nightly")]

    @step
    def clean(self, ctx):
        ctx.sleep(durable.hours(1))  # still going at the next fire
        return "clean"


class StrictCleanup(Workflow):
    on_duplicate = "error"

    @step
    def clean(self, ctx):
        ctx.sleep(durable.hours(1))
        return "clean"


class Tick(Workflow):
    """Fired every second by the exactly-once test."""

    @step
    def tick(self, ctx):
        return (ctx.get("durable.schedule") or {}).get("tick")


class HangingUndo(Workflow):
    """Its compensation hangs the first time (the test kills the worker there)."""

    @step(compensate="undo")
    def book(self, ctx):
        return "booked"

    @step
    def fail(self, ctx):
        raise RuntimeError("payment refused")

    def undo(self, ctx):
        import time

        if not SideEffect.objects.filter(run_id=ctx.run_id, step="undo-started").exists():
            effect(ctx, "undo-started")
            time.sleep(600)
        effect(ctx, "undo-finished")
