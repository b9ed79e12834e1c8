"""``ctx.inputs``: every input folded into a run by debounce or run_again, oldest
first, bounded by ``DURABLE["MAX_FOLDED_INPUTS"]``."""

import pytest

import django_durable as durable
from django_durable import step
from django_durable.models import Status
from django_durable.testing import drain
from tests.helpers import fresh

pytestmark = pytest.mark.django_db


def _inputs(self, ctx):
    if ctx.input.get("sleep"):
        ctx.sleep(durable.seconds(1))
    return {"inputs": ctx.inputs, "input": ctx.input}


def test_a_debounce_of_three_starts_gives_the_run_each_input_in_order(define):
    folds = define(
        "folds_debounced", debounce=durable.Debounce(period=durable.seconds(5)), work=step(_inputs)
    )
    first = durable.start(folds, {"n": 1}, key="k")
    assert durable.start_detailed(folds, {"n": 2}, key="k").outcome == "debounced"
    assert durable.start_detailed(folds, {"n": 3}, key="k").outcome == "debounced"
    drain(run_timers=True)
    run = fresh(first)
    assert run.status == Status.COMPLETED
    assert run.result == {"inputs": [{"n": 1}, {"n": 2}, {"n": 3}], "input": {"n": 3}}


def test_run_again_of_three_duplicates_gives_the_waiting_run_each_input(define):
    folds = define("folds_run_again", on_duplicate="run_again", work=step(_inputs))
    holder = durable.start(folds, {"sleep": True, "n": 0}, key="k")
    drain()  # the holder sleeps: picked up, still going
    answers = [durable.start_detailed(folds, {"n": n}, key="k") for n in (1, 2, 3)]
    assert {a.outcome for a in answers} == {"run_again"}
    waiting = answers[0].run_id
    assert {a.run_id for a in answers} == {waiting}
    drain(run_timers=True)
    assert fresh(holder).result["inputs"] == [{"sleep": True, "n": 0}]
    run = fresh(waiting)
    assert run.status == Status.COMPLETED
    assert run.result == {"inputs": [{"n": 1}, {"n": 2}, {"n": 3}], "input": {"n": 3}}


def test_without_folds_and_in_a_rerun_inputs_is_the_input(define):
    folds = define(
        "folds_none", debounce=durable.Debounce(period=durable.seconds(5)), work=step(_inputs)
    )
    run_id = durable.start(folds, {"n": 1}, key="k")
    durable.start(folds, {"n": 2}, key="k")
    drain(run_timers=True)
    assert fresh(run_id).result["inputs"] == [{"n": 1}, {"n": 2}]
    plain = durable.start(folds, {"n": 9})  # no key: nothing to fold
    drain(run_timers=True)
    assert fresh(plain).result["inputs"] == [{"n": 9}]
    rerun = durable.rerun(run_id)
    drain(run_timers=True)
    assert fresh(rerun).result == {"inputs": [{"n": 2}], "input": {"n": 2}}


def test_the_bound_keeps_the_newest_first_input_counted(define, settings):
    settings.DURABLE = {**getattr(settings, "DURABLE", {}), "MAX_FOLDED_INPUTS": 2}
    folds = define(
        "folds_bounded", debounce=durable.Debounce(period=durable.seconds(5)), work=step(_inputs)
    )
    run_id = durable.start(folds, {"n": 1}, key="k")
    durable.start(folds, {"n": 2}, key="k")
    assert fresh(run_id).inputs == [{"n": 1}, {"n": 2}]
    durable.start(folds, {"n": 3}, key="k")
    durable.start(folds, {"n": 4}, key="k")
    drain(run_timers=True)
    assert fresh(run_id).result["inputs"] == [{"n": 3}, {"n": 4}]


def test_use_existing_is_not_folded(define):
    folds = define("folds_used", work=step(_inputs))
    run_id = durable.start(folds, {"sleep": True}, key="k")
    assert durable.start_detailed(folds, {"n": 2}, key="k").outcome == "use_existing"
    drain(run_timers=True)
    assert fresh(run_id).result["inputs"] == [{"sleep": True}]
    assert fresh(run_id).inputs is None
