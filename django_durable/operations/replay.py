"""The replay algebra: what a step changed in a run's context, and, from those
changes, the context a step began with (``rerun(from_step=...)`` begins with it:
docs/replay-and-repair.md). Pure functions, no database: ``operations.state`` holds
the state's keys they read, and ``operations.rerun`` reads the attempts' records
(``StepAttempt.replaced``) from the store.

A change is recorded as the values it replaced (``state.Changes``): ``{name: [old
value]}``, or ``{name: []}`` for a name that was not there. Taking changes back, newest
first, from the run's context gives the context before them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

from django_durable.operations import state as run_state
from django_durable.operations.state import Changes, RunState

__all__ = ["changes", "context_before", "step_changes", "undo_before"]

_ABSENT = object()


def changes(before: dict | None, after: dict | None) -> Changes:
    """What turned ``before`` into ``after``, as ``before``'s values of the names that
    differ: ``[value]``, or ``[]`` for a name ``before`` did not have."""
    before, after = before or {}, after or {}
    if before is after or before == after:
        return {}
    changed: Changes = {}
    for name in before.keys() | after.keys():
        old = before.get(name, _ABSENT)
        if old is _ABSENT:
            changed[name] = []
        elif after.get(name, _ABSENT) is _ABSENT or after[name] != old:
            changed[name] = [old]
    return changed


def _undo(context: dict, changes: Changes | None) -> None:
    """Put back, in ``context``, the values ``changes`` replaced (in place)."""
    for name, old in (changes or {}).items():
        if old:
            context[name] = old[0]
        else:
            context.pop(name, None)


def _began_with(state: RunState | None, context: dict | None) -> dict:
    """The context when the current step began: ``context`` without what its suspended
    executions saved (``partial``)."""
    partial = run_state.partial(state)
    began = dict(context or {})
    _undo(began, partial)
    return began


def step_changes(state: RunState | None, context: dict | None, data: dict) -> Changes:
    """What the current step replaced, in all its executions so far, now that one
    ends with ``data`` as the context (``context``: the run's context when this
    execution began): when it suspends, the state's ``partial``; when it completes,
    its attempt's record (``StepAttempt.replaced``)."""
    return changes(_began_with(state, context), data)


def _steps(state: RunState | None, replaced: Mapping[int, Changes]) -> dict[int, Changes]:
    """Every step's changes: the state's (a rerun's earlier steps, or a run recorded by
    an earlier version) and the attempts' (``replaced``)."""
    return {**run_state.undo(state), **replaced}


def context_before(
    context: dict | None,
    state: RunState | None,
    index: int,
    replaced: Mapping[int, Changes],
    compensated: Sequence[Changes] = (),
) -> dict:
    """The context as it was when step ``index`` began: nothing that step or a later
    one put, in any execution, nor what compensations changed since. From the run's
    ``context`` now, its ``state``, and its completed attempts' records: ``replaced``,
    each step's by index, and ``compensated``, each compensation's, oldest first. A
    new dict."""
    began = copy.deepcopy(dict(context or {}))
    for undone in reversed([*run_state.compensations_undone(state), *compensated]):
        _undo(began, undone)
    _undo(began, run_state.partial(state))
    steps = _steps(state, replaced)
    for step in sorted(steps, reverse=True):
        if step >= index:
            _undo(began, copy.deepcopy(steps[step]))
    return began


def undo_before(
    state: RunState | None, index: int, replaced: Mapping[int, Changes]
) -> dict[int, Changes]:
    """The changes of the steps before ``index``: a rerun from that step keeps them
    (``state.rerun_state``), so that it can itself be rerun from an earlier step."""
    return {step: c for step, c in _steps(state, replaced).items() if step < index}
