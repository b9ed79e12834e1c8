"""Replay and repair: ``rerun()`` of a finished run, from its first step or from a
later one, with its input or another (docs/replay-and-repair.md).

A rerun is a start: it follows the workflow's key rules (``on_duplicate="error"``:
the key's holder is named by ``KeyTaken`` unless ``reuse`` lets the rerun take the
key), and its run is inserted as every start's is. In the same transaction, before
any worker can see it, the new run is made a rerun: its origin, and, from a step,
that step's index and the context the original had when the step began
(``replay.context_before``, from what each completed attempt of the original
replaced, kept with its record).

Everything a rerun can refuse for itself is checked before anything is written,
before the key rules: the run is finished (``NotFinished``), the step is one the run
has and began and the deployed definition still has (``ValueError``), the input is
a JSON object (``TypeError``).
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from django_durable import store
from django_durable.exceptions import KeyTaken, NotFinished
from django_durable.models import FINISHED_STATUSES, Run
from django_durable.operations import inputs, replay
from django_durable.operations import state as run_state
from django_durable.operations.calls import public_call
from django_durable.operations.explain import explain
from django_durable.operations.start import start_run
from django_durable.workflows.definition import Workflow, registry

__all__ = ["SAME_INPUT", "RerunPlan", "explain_rerun", "plan_rerun", "rerun", "rerun_steps"]


class _SameInput:
    """``rerun()``'s default ``input``: the run's own."""

    def __repr__(self) -> str:
        return "<the run's input>"


SAME_INPUT: Any = _SameInput()


class RerunPlan(NamedTuple):
    """What a rerun of ``run`` would start: checked, nothing written yet."""

    run: Run
    workflow: type[Workflow]
    input: dict[str, Any]
    input_json: str | None
    from_step: str | None
    step_index: int  # in the deployed definition
    context: dict[str, Any]
    state: dict[str, Any]


def plan_rerun(run: Run, from_step: str | None = None, input: Any = SAME_INPUT) -> RerunPlan:
    """Check a rerun of ``run`` and say what it would start; raises what ``rerun()``
    raises before the key rules, writing nothing."""
    if run.status not in FINISHED_STATUSES:
        raise NotFinished(f"run {run.id} is {run.status}; rerun takes a finished run")
    if input is SAME_INPUT:
        payload, text = run.input, None
    else:
        payload, text = inputs.validated_input(input)
    workflow = registry.get(run.workflow)
    if from_step is None:
        return RerunPlan(run, workflow, payload, text, None, 0, {}, {})
    if not isinstance(from_step, str):
        raise TypeError(f"from_step is a step's name, got {type(from_step).__name__}")
    recorded = list(run.step_names or workflow.step_names())
    deployed = list(workflow.step_names())
    if from_step not in recorded:
        raise ValueError(
            f"run {run.id} has no step {from_step!r}; its steps are {', '.join(recorded)}"
        )
    if from_step not in deployed:
        raise ValueError(
            f"the deployed definition of {workflow.name} has no step {from_step!r}; "
            f"its steps are {', '.join(deployed)}"
        )
    index = recorded.index(from_step)
    if not _began(run, index, recorded, store.began_steps(run.id)):
        raise ValueError(f"run {run.id} never began step {from_step!r}")
    steps, compensations = store.replaced_values(run.id)
    context = replay.context_before(run.context, run.state, index, steps, compensations)
    new_index = deployed.index(from_step)
    # What the steps before it replaced goes along, so that the rerun can itself be
    # rerun from one of them (while their positions are those of the definition).
    same = deployed[:index] == recorded[:index]
    state = run_state.rerun_state(replay.undo_before(run.state, index, steps) if same else {})
    return RerunPlan(run, workflow, payload, text, from_step, new_index, context, state)


def rerun_steps(run: Run) -> list[str]:
    """The steps ``run`` may be rerun from: those it began that the deployed definition
    still has, in order (one query)."""
    try:
        deployed = set(registry.get(run.workflow).step_names())
    except LookupError:
        return []
    began = store.began_steps(run.id)
    recorded = list(run.step_names or [])
    return [
        name
        for index, name in enumerate(recorded)
        if name in deployed and _began(run, index, recorded, began)
    ]


def _began(run: Run, index: int, recorded: list[str], began: set[int]) -> bool:
    """Whether the run began step ``index``: it has an attempt of it (``began``: the
    indexes of those), or it is a rerun that began after it (its original began it)."""
    origin = run.rerun_from_step
    if origin is not None and origin in recorded and index < recorded.index(origin):
        return True
    return index in began


@public_call("arerun")
def rerun(
    run_id: uuid.UUID | str, *, from_step: str | None = None, input: Any = SAME_INPUT
) -> uuid.UUID:
    """Start a fresh copy of a finished run: same workflow and key (the start rules
    apply: ``KeyTaken`` names a holder that keeps the key), its input unless
    ``input`` replaces it. ``from_step`` begins the new run at that step, with the
    context as the steps before it left it; they are not run again. ``NotFinished``
    for a run still going, ``ValueError`` for a step the run does not have or never
    began: both before the key rules, writing nothing. The new run records
    ``rerun_of_id`` and ``rerun_from_step``; the original is not changed (but for
    its key, when the rerun takes it)."""
    plan = plan_rerun(Run.objects.get(id=run_id), from_step, input)
    return start_planned(plan)


def start_planned(plan: RerunPlan) -> uuid.UUID:
    """Start the rerun ``plan`` describes: the start and the marks, one transaction."""
    fields = {"input_json": plan.input_json} if plan.input_json is not None else {}
    if plan.run.flow_key is not None:  # the original's (else its workflow's function's)
        fields["flow_key"] = plan.run.flow_key
    with store.atomic():
        try:
            result = start_run(plan.workflow, plan.input, plan.run.key, "error", **fields)
        except KeyTaken as exc:
            # Refused as a start is: caught inside the transaction, so the
            # key_duplicate activity the start recorded is kept (nothing else was written).
            refused = exc
        else:
            refused = None
            store.make_rerun(
                result.run_id,
                rerun_of=plan.run.id,
                from_step=plan.from_step,
                step_index=plan.step_index,
                context=plan.context,
                state=plan.state,
            )
    if refused is not None:
        raise refused
    return result.run_id


def explain_rerun(
    run: Run, from_step: str | None = None, input: Any = SAME_INPUT
) -> tuple[bool, str]:
    """Whether a rerun of ``run`` would start now, and one sentence saying why not (or
    what it would do), writing nothing: the dashboard and ``durable rerun`` without
    ``--yes`` show it."""
    try:
        plan = plan_rerun(run, from_step, input)
    except (NotFinished, ValueError, TypeError, LookupError) as exc:
        return False, str(exc)
    where = f"from step {from_step!r}" if from_step else "from its first step"
    if run.key is None:
        return True, f"a new run of {plan.workflow.name} {where}."
    answer = explain(plan.workflow, plan.input, key=run.key, on_duplicate="error")
    if answer.outcome == "key_taken":
        return False, answer.reason
    return True, f"a new run of {plan.workflow.name} {where}: {answer.reason}"


def refusal(exc: Exception) -> str:
    """What to show for a refused rerun (``KeyTaken`` names the holder)."""
    if isinstance(exc, KeyTaken):
        return f"refused: key held by run {exc.holder_id}"
    return f"refused: {exc}"
