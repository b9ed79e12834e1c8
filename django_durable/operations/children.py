"""Child workflows and parallel branches.

``ctx.call_workflow(Other, input)`` starts one child run and returns its result;
``ctx.parallel([(A, input), (B, input)])`` (or ``durable.parallel(...)`` inside
a step) starts several and returns their results in order. Children start
without a key (keys aren't inherited); ``call_workflow(..., key=...)`` opts in
to the child workflow's own key rules.

While children run, the parent is ``waiting`` (``waiting_for="children"``) and
holds no worker. A finishing child wakes it; the step then runs again from its
start and the call returns at once. The ids of the children a call started are
recorded in ``run.state["children"]`` under ``"<step index>:<call number>"`` in
the same transaction that starts them, so a step that runs again (after a wait,
a crash, a resume) finds the same children instead of starting new ones. A
call whose children failed forgets them when it raises, so a retry of the
step starts fresh ones.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

from django_durable import store, telemetry
from django_durable.exceptions import ChildFailed, KeyTaken, ParallelFailed
from django_durable.models import Run
from django_durable.operations import finish, inputs, keys, parents
from django_durable.operations import state as run_state
from django_durable.operations.start import checked, start_run
from django_durable.operations.state import Suspend
from django_durable.workflows.definition import (
    OnDuplicate,
    Workflow,
    registry,
)
from django_durable.workflows.flow import flow_key_of

logger = logging.getLogger("django_durable.operations.children")

MODES = ("fail_fast", "complete_all")
# A parent awaiting a run that is not its child (a keyed call answered by an
# existing holder) isn't woken by that run; it looks again this often.
FOREIGN_POLL = timedelta(seconds=30)

_current: contextvars.ContextVar = contextvars.ContextVar("django_durable_ctx", default=None)


@contextlib.contextmanager
def current_step(ctx) -> Iterator[None]:
    """Make ``ctx`` the one ``durable.parallel(...)`` uses while a step runs."""
    token = _current.set(ctx)
    try:
        yield
    finally:
        _current.reset(token)


# --- the calls a step makes -------------------------------------------------------


def call_workflow(
    ctx, workflow: type[Workflow] | str, input: dict | None = None, *, key: str | None = None
) -> Any:
    """Start ``workflow`` as a child of the running step's run and return its result.

    Raises ``ChildFailed`` when the child ends without completing.
    """
    definition = registry.resolve(workflow)
    spec = (definition, inputs.validate_input(input), keys.validate_key(key))
    return _await(ctx, [spec], "complete_all", single=True)[0]


def parallel(*args, mode: str = "fail_fast") -> list[Any]:
    """Run branches as child runs at once; return their results in branch order.

    ``durable.parallel([(A, input), B, ...], mode=...)`` inside a step, or
    ``ctx.parallel([...], mode=...)``. A branch is a workflow (class or name) or
    a ``(workflow, input)`` pair. ``fail_fast`` (default): the first branch that
    fails cancels the others and raises ``ParallelFailed``; ``complete_all``:
    every branch runs to its end, then ``ParallelFailed`` lists every outcome if
    any failed.
    """
    if len(args) == 2:
        ctx, branches = args
    elif len(args) == 1:
        ctx, branches = _current.get(), args[0]
        if ctx is None:
            raise RuntimeError("durable.parallel() is called inside a step (or use ctx.parallel)")
    else:
        raise TypeError("parallel() takes a list of branches")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    return _await(ctx, _branch_specs(branches), mode, single=False)


def _branch_specs(branches: Sequence) -> list[tuple[type[Workflow], dict, None]]:
    if isinstance(branches, str | bytes) or not isinstance(branches, Sequence) or not branches:
        raise TypeError("branches must be a non-empty list of workflows or (workflow, input) pairs")
    specs = []
    for branch in branches:
        workflow, payload = branch if isinstance(branch, tuple) else (branch, None)
        specs.append((registry.resolve(workflow), inputs.validate_input(payload), None))
    return specs


def start_from_step(
    ctx,
    workflow: type[Workflow] | str,
    input: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    on_duplicate: OnDuplicate | None = None,
    flow_key: str | None = None,
) -> uuid.UUID:
    """``ctx.start``: start another run (not a child: nothing waits for it, and it
    outlives this one) and return its id, at most once per call of the step.

    The id is recorded in the run's state under ``"<step index>:<call number>"`` in
    the transaction that starts it, so the same call in a step that runs again
    (after a wait, a retry, a lost worker) returns it and starts nothing.
    """
    definition, (payload, text), key, policy = checked(
        workflow, input, key, on_duplicate, "ctx.start()"
    )
    flow = flow_key_of(definition, payload, flow_key)
    run: Run = ctx._run
    call_no = getattr(ctx, "_durable_start_calls", 0)
    ctx._durable_start_calls = call_no + 1
    call_key = f"{run.step_index}:{call_no}"
    recorded = run_state.recorded_start(run.state, call_key)
    if recorded is not None:
        return uuid.UUID(recorded)
    with store.atomic():
        state = store.lock_owned_state(run)
        recorded = run_state.recorded_start(state, call_key)
        if recorded is not None:
            return uuid.UUID(recorded)
        started = start_run(definition, payload, key, policy, input_json=text, flow_key=flow).run_id
        store.save_owned_state(run, run_state.with_start(state, call_key, started))
    return started


# --- waiting for children ------------------------------------------------------------


def _await(ctx, specs: list, mode: str, *, single: bool) -> list[Any]:
    run: Run = ctx._run
    wait_index = ctx._wait_calls
    passed, _ = ctx._next_wait()  # a child call is a wait: it takes its place in the order
    call_no = getattr(ctx, "_durable_child_calls", 0)
    ctx._durable_child_calls = call_no + 1
    call_key = f"{run.step_index}:{call_no}"

    recorded = run_state.recorded_children(run.state, call_key)
    if recorded is None:
        ids = _start(run, call_key, specs, mode)
    else:
        ids = [uuid.UUID(i) for i in recorded]

    outcomes = store.run_outcomes(ids)
    verdict = parents.verdict(ids, outcomes, mode)
    if verdict == "completed":
        if not passed:
            ctx._waits.append(None)  # keep later waits of this step in their places
        return [outcomes[i][1] for i in ids]
    if verdict == "failed":
        _fail(run, call_key, ids, outcomes, mode, single=single)

    if passed:
        # Woken before the children were done: this wait is not passed after all.
        del ctx._waits[wait_index:]
        ctx._wait_calls = wait_index
    _set_awaiting(run, ids, mode)
    foreign = any(outcome[3] != run.id for outcome in outcomes.values())
    raise Suspend("children", None, store.now() + FOREIGN_POLL if foreign else None)


def _start(run: Run, call_key: str, specs: list, mode: str) -> list[uuid.UUID]:
    """Start the children and record their ids in the parent in one transaction."""
    taken: KeyTaken | None = None
    with store.atomic():
        state = store.lock_owned_state(run)
        recorded = run_state.recorded_children(state, call_key)
        if recorded is not None:
            return [uuid.UUID(i) for i in recorded]
        ids = []
        for workflow, payload, key in specs:
            policy = workflow.on_duplicate if key is not None else "use_existing"
            try:
                ids.append(start_run(workflow, payload, key, policy, parent_id=run.id).run_id)
            except KeyTaken as exc:
                taken = exc  # the duplicate's activity is kept; the step fails
                break
        if taken is None:
            store.save_owned_state(run, run_state.with_children(state, call_key, ids, mode))
    if taken is not None:
        raise taken
    logger.info("run %s started %d child runs", run.id, len(ids), extra=telemetry.log_fields(run))
    return ids


def _fail(run: Run, call_key: str, ids, outcomes, mode: str, *, single: bool) -> None:
    if mode == "fail_fast":
        finish.cancel_runs(ids, "another parallel branch failed")
        outcomes = store.run_outcomes(ids)
    _forget(run, call_key)
    report = [
        {
            "run_id": i,
            "status": outcomes[i][0] if i in outcomes else "deleted",
            "result": outcomes[i][1] if i in outcomes else None,
            "error": outcomes[i][2] if i in outcomes else None,
        }
        for i in ids
    ]
    if single:
        child = report[0]
        reason = (child["error"] or {}).get("message") if isinstance(child["error"], dict) else None
        raise ChildFailed(
            child["run_id"],
            child["status"],
            child["error"],
            f"child run {child['run_id']} ended {child['status']}"
            + (f": {reason}" if reason else ""),
        )
    raise ParallelFailed(report)


def _forget(run: Run, call_key: str) -> None:
    """Drop a failed call's children so a retry of the step starts new ones."""
    with store.atomic():
        state = store.lock_owned_state(run)
        store.save_owned_state(run, run_state.forget_call(state, call_key))


def _set_awaiting(run: Run, ids: list[uuid.UUID], mode: str) -> None:
    if run_state.awaiting(run.state) == run_state.awaiting(
        run_state.with_awaiting(None, ids, mode)
    ):
        return
    with store.atomic():
        state = store.lock_owned_state(run)
        store.save_owned_state(run, run_state.with_awaiting(state, ids, mode))
