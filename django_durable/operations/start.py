"""Starting runs: ``start()`` and what a start does when its key is taken.

A start validates its arguments before anything is written, asks ``keys`` what
the rules say about the key's holder, makes its writes through ``store`` (one
statement where it can, else one short transaction, a savepoint inside the
caller's), and announces what happened with activity rows and signals sent
after commit.
"""

from __future__ import annotations

import functools
import uuid
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple, TypeAlias

from django_durable import conf, signals, store, telemetry
from django_durable.exceptions import KeyContended, KeyTaken
from django_durable.models import (
    FINISHED_STATUSES,
    Activity,
    Run,
    Status,
)
from django_durable.operations import deliveries, finish, inputs, keys, options
from django_durable.operations.calls import public_call
from django_durable.operations.keys import Action
from django_durable.workflows.definition import (
    OnDuplicate,
    Workflow,
    registry,
    validate_on_duplicate,
)
from django_durable.workflows.flow import flow_key_of

MAX_CHANGES_OF_HANDS = 3


# What answered a start (``StartResult.outcome``).
StartOutcome: TypeAlias = Literal[
    "started",
    "use_existing",
    "cancel_existing",
    "run_again",
    "send_event",
    "debounced",
    "handed_off",
]


class StartResult(NamedTuple):
    """What answered a start: ``run_id`` and the ``outcome`` that produced it."""

    run_id: uuid.UUID
    outcome: StartOutcome


def _new_run(
    workflow: type[Workflow],
    payload: dict,
    key: str | None,
    *,
    holds_key: bool = False,
    input_json: str | None = None,
    connection=None,
    **fields: Any,
) -> store.NewRun:
    """The run a start inserts; ``fields`` set more of the columns a start sets
    (``store.starts.START_COLUMNS``: ``parent_id``, ``context``, ``runs_after_id``...);
    ``input_json``: the input's JSON text, when the start has it; ``connection``:
    ``store.db()``, when the caller has it already."""
    at = store.now(connection)
    timeout = workflow.timeout
    run = store.NewRun(
        id=uuid.uuid4(),
        workflow=workflow.name,
        queue=workflow.queue,
        priority=workflow.priority,
        input=payload,
        input_json=input_json,
        key=key,
        holds_key=holds_key,
        created_at=at,
        due_at=at,
        timeout_at=at + timeout if timeout else None,
        step_names=workflow.step_names(),
        trace_context=telemetry.trace_context(),  # the span this start runs in, if any
    )
    for name, value in fields.items():  # options (run_after, priority, queue), a child's
        setattr(run, name, value)
    if key is not None and workflow.debounce is not None and "due_at" not in fields:
        deadline = workflow.debounce.timeout
        run.debounce_deadline = at + deadline if deadline is not None else None
        _set_debounced_due(run, workflow, run.debounce_deadline)
    return run


def _set_debounced_due(run: Run | store.NewRun, workflow: type[Workflow], deadline) -> None:
    """A debounced run is due one period from now, but never after its deadline;
    the workflow timeout counts from when it is due."""
    due = store.now() + workflow.debounce.period
    if deadline is not None and due > deadline:
        due = deadline
    run.due_at = due
    run.timeout_at = due + workflow.timeout if workflow.timeout else None


@public_call("astart")
def start(
    workflow: type[Workflow] | str,
    input: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    on_duplicate: OnDuplicate | None = None,
    run_after: datetime | timedelta | None = None,
    priority: int | None = None,
    queue: str | None = None,
    flow_key: str | None = None,
) -> uuid.UUID:
    """Start ``workflow`` with ``input``, at most once per ``key``.

    Returns the id of the run that answers: the new run, the holder, or the waiting run.
    ``run_after`` (an aware datetime, or a timedelta from now) delays the run,
    ``priority`` orders it within its queue (higher first), ``queue`` overrides the
    workflow's. ``flow_key`` names whose work the run is, for the workflow's flow
    limits (None: the workflow's ``flow_key`` function decides; docs/flow-control.md).
    """
    return start_detailed(
        workflow,
        input,
        key=key,
        on_duplicate=on_duplicate,
        run_after=run_after,
        priority=priority,
        queue=queue,
        flow_key=flow_key,
    ).run_id


@public_call("astart_detailed")
def start_detailed(
    workflow: type[Workflow] | str,
    input: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    on_duplicate: OnDuplicate | None = None,
    run_after: datetime | timedelta | None = None,
    priority: int | None = None,
    queue: str | None = None,
    flow_key: str | None = None,
) -> StartResult:
    """Like ``start()``, and say what happened: ``StartResult(run_id, outcome)``."""
    definition, (payload, text), key, policy = checked(workflow, input, key, on_duplicate)
    fields = options.run_fields(definition, run_after=run_after, priority=priority, queue=queue)
    fields["flow_key"] = flow_key_of(definition, payload, flow_key)
    return start_run(definition, payload, key, policy, input_json=text, **fields)


def checked(
    workflow: type[Workflow] | str, input: Any, key: Any, on_duplicate: Any, where: str = "start()"
) -> tuple[type[Workflow], tuple[dict, str], str | None, str | tuple[str, str]]:
    """The start's arguments checked, before anything is written: the definition, the
    input with its JSON text (what the start sends), the key and the duplicate policy
    that applies. Every way in (``start``, ``start_many``, ``explain``, ``ctx.start``)
    checks here, so each mistake raises the same exception (docs/keys.md)."""
    definition = registry.resolve(workflow)
    payload = inputs.validated_input(input)
    key = keys.validate_key(key)
    policy = definition.on_duplicate
    if on_duplicate is not None:
        policy = validate_on_duplicate(on_duplicate, where)
        if policy == "run_again" and definition.reuse == "never":
            raise ValueError(
                f"on_duplicate='run_again' cannot be used with {definition.name}'s reuse='never'"
            )
    return definition, payload, key, policy


@store.retry_deadlocks  # PostgreSQL broke a deadlock by aborting this start: start again
def start_run(
    workflow: type[Workflow],
    payload: dict,
    key: str | None,
    policy: str | tuple[str, str],
    **fields: Any,
) -> StartResult:
    """Start with validated arguments (``fields`` set extra columns such as ``parent``;
    without ``flow_key`` among them, the workflow's ``flow_key`` function gives it)."""
    if "flow_key" not in fields:
        fields["flow_key"] = flow_key_of(workflow, payload)
    connection = store.db()  # looked up once: each look-up costs a thread-local read
    if key is None:
        run = _new_run(workflow, payload, None, connection=connection, **fields)
        # One statement (INSERT and NOTIFY), atomic on its own; inside the caller's
        # transaction, in a savepoint that keeps that transaction usable whatever happens.
        if store.in_autocommit(connection):
            store.insert_or_get_holder(run, connection=connection)  # no key: always inserted
        else:
            with store.atomic():
                store.insert_or_get_holder(run, connection=connection)
        _announce_new_run(workflow, run, notify=False, connection=connection)
        return StartResult(run.id, "started")

    answer = (
        _start_keyed_alone(connection, workflow, payload, key, policy, fields)
        if store.in_autocommit(connection)
        else None
    )
    if answer is None or isinstance(answer, store.InsertOrHolder):
        with store.atomic():
            result, taken_by = _start_keyed(workflow, payload, key, policy, fields, answer)
    else:
        result, taken_by = answer
    if taken_by is not None:
        raise KeyTaken(taken_by, f"key {key!r} of {workflow.name} is held by run {taken_by}")
    return result


def _start_keyed_alone(
    connection, workflow, payload, key, policy, fields
) -> tuple[StartResult | None, Any] | store.InsertOrHolder:
    """The common keyed starts of a caller in autocommit, without a transaction.

    A new key is one statement, and so is a duplicate that its holder answers
    (``use_existing``, ``error``; the statement writes the activity row). Any
    other answer (hand-off, cancel, debounce, run_again, send_event) needs
    several writes together: what the statement found is returned, and the
    caller goes on from there in a transaction. ``connection``: ``store.db()``,
    looked up once for the whole start.
    """
    run = _new_run(workflow, payload, key, holds_key=True, connection=connection, **fields)
    note = _duplicate_note(workflow, policy)
    found = store.insert_or_get_holder(run, note=note, connection=connection)
    if found.inserted:
        # The insert sent the NOTIFY.
        _announce_new_run(workflow, run, notify=False, connection=connection)
        return StartResult(run.id, "started"), None
    if found.noted:
        return _noted_answer(workflow, key, payload, note, found, connection)
    holder = found.holder
    if holder is None:
        return found
    action = _decide(workflow, policy, holder)
    if action in _HOLDER_ANSWERS:
        return _holder_answers(workflow, key, holder, payload, action)
    if action is Action.HAND_OFF:
        if store.hand_off(run, holder.id, holder.status):
            _announce_handed_off(workflow, key, holder.id, run)
            return StartResult(run.id, "handed_off"), None
        return None  # the holder moved on: start again, in a transaction
    return found


_HOLDER_ANSWERS = {Action.USE_EXISTING: "use_existing", Action.RAISE_TAKEN: "error"}


def _holder_answers(workflow, key, holder: Run, payload, action) -> tuple[StartResult | None, Any]:
    """The holder answers the start (``use_existing``), or KeyTaken names it (``error``):
    the duplicate is recorded either way."""
    outcome = _HOLDER_ANSWERS[action]
    _duplicate(workflow, key, holder, payload, outcome)
    return _answered_by(holder.id, outcome)


def _answered_by(holder_id: uuid.UUID, outcome: str) -> tuple[StartResult | None, Any]:
    return (None, holder_id) if outcome == "error" else (StartResult(holder_id, outcome), None)


def _noted_answer(
    workflow, key, payload, note, found, connection=None
) -> tuple[StartResult | None, Any]:
    """The statement recorded the duplicate: the holder answers (or KeyTaken names it)."""
    holder_id = found.holder_id
    _announce_duplicate(
        workflow, key, holder_id, payload, note.outcome, found.input_changed, connection
    )
    return _answered_by(holder_id, note.outcome)


def _duplicate_note(workflow, policy) -> store.DuplicateNote | None:
    """For ``use_existing`` and ``error``: let the insert record the duplicate itself."""
    if policy not in ("use_existing", "error"):
        return None
    return _note(workflow.reuse, policy, workflow.debounce is not None)


@functools.lru_cache(maxsize=256)
def _note(reuse: str, policy: str, debounced: bool) -> store.DuplicateNote:
    """The note of a workflow's duplicates under ``policy``: the same at every start,
    so it is made once (``keys.holder_answers`` asks the rules of every holder state)."""
    states = keys.holder_answers(reuse=reuse, on_duplicate=policy, debounce=debounced)
    return store.DuplicateNote(policy, states)


def _decide(workflow, policy, holder: Run) -> Action:
    return keys.decide(
        reuse=workflow.reuse,
        on_duplicate=policy,
        holder=keys.Holder(status=holder.status, picked_up=holder.started_at is not None),
        debounce=workflow.debounce is not None,
    )


def _start_keyed(
    workflow, payload, key, policy, fields, found: store.InsertOrHolder | None = None
) -> tuple[StartResult | None, Any]:
    """One keyed start inside a transaction; returns (result, holder id to raise KeyTaken for).

    ``found``: what a first try outside the transaction found (its run was not
    inserted); the start goes on from its holder instead of trying again. What it
    then does to the holder is conditional on the holder's state, so a holder that
    moved on since is seen, and the start decides again.
    """
    run = _new_run(workflow, payload, key, holds_key=True, **fields)
    replaced: Run | None = None  # the holder this start took the key from
    outcome_if_inserted = "started"
    changes = 0
    seen: uuid.UUID | None = None
    note = _duplicate_note(workflow, policy)
    while True:
        if found is None:
            found = store.insert_or_get_holder(run, note=note)
        current, found = found, None  # the next round tries the insert again
        holder = current.holder
        if current.inserted:
            _announce_new_run(workflow, run, notify=False)  # the insert sent the NOTIFY
            if replaced is not None:
                _record_handoff(workflow, key, replaced.id, run.id)
            if outcome_if_inserted == "cancel_existing":
                store.move_waiting_behind(workflow.name, key, run.id)
            return StartResult(run.id, outcome_if_inserted), None

        if current.noted:
            return _noted_answer(workflow, key, payload, note, current)
        if holder is None:
            holder = store.get_holder(workflow.name, key)
        if holder is None or (seen is not None and holder.id != seen):
            changes += 1
        if changes >= MAX_CHANGES_OF_HANDS:
            raise KeyContended(f"key {key!r} of {workflow.name} changed hands during the start")
        if holder is None:
            continue
        seen = holder.id

        action = _decide(workflow, policy, holder)
        if action is Action.HAND_OFF:
            if store.hand_off(run, holder.id, holder.status):
                _announce_handed_off(workflow, key, holder.id, run)
                return StartResult(run.id, "handed_off"), None
            changes += 1  # the holder moved on: decide again
            continue
        if action is Action.CANCEL_EXISTING:
            error = {
                "type": "Replaced",
                "message": f"cancelled by a start of key {key!r}; replaced by run {run.id}",
                "replaced_by": str(run.id),
            }
            if store.replace_holder(holder.id, error):
                holder.status = Status.CANCELLED
                _duplicate(workflow, key, holder, payload, "cancel_existing")
                replaced, outcome_if_inserted = holder, "cancel_existing"
                # Its waiting run moves behind the new run (below), not on.
                finish.run_finished(Run.objects.get(id=holder.id), promote=False)
            else:
                changes += 1
            continue
        if action in _HOLDER_ANSWERS:
            return _holder_answers(workflow, key, holder, payload, action)
        if action is Action.SEND_EVENT:
            deliveries.deliver(holder.id, "event", policy[1], payload, keep=True)
            _duplicate(workflow, key, holder, payload, "send_event")
            return StartResult(holder.id, "send_event"), None
        if action is Action.DEBOUNCE:
            outcome = "debounced" if workflow.debounce is not None else "run_again"
            if _give_newer_input(workflow, holder, payload):
                _duplicate(workflow, key, holder, payload, outcome)
                return StartResult(holder.id, outcome), None
            changes += 1  # a worker picked it up meanwhile: decide again
            continue
        if action is Action.RUN_AGAIN:
            answer = _run_again(workflow, key, holder, payload, fields)
            if answer is not None:
                return answer, None
            changes += 1
            continue
        raise AssertionError(f"unhandled key action {action}")


def _give_newer_input(workflow, holder: Run, payload: dict) -> bool:
    """A holder no worker has picked up takes the newer input (and, debounced, waits again)."""
    fields: dict[str, Any] = {}
    if workflow.debounce is not None:
        _set_debounced_due(holder, workflow, holder.debounce_deadline)
        fields = {"due_at": holder.due_at, "timeout_at": holder.timeout_at}
    keep = conf.get("MAX_FOLDED_INPUTS")  # ctx.inputs keeps the newest
    return store.update_pending_input(holder.id, payload, keep=keep, **fields)


def _run_again(workflow, key, holder: Run, payload: dict, fields) -> StartResult | None:
    """Leave one run waiting behind ``holder`` (or give the waiting one the newest input)."""
    locked = store.get_holder(workflow.name, key, lock=True)
    if locked is None or locked.id != holder.id or locked.status in FINISHED_STATUSES:
        return None  # the holder finished or changed: decide again
    waiting = store.get_waiting_behind(workflow.name, key, lock=True)
    if waiting is not None:
        store.update_waiting_input(waiting.id, payload, keep=conf.get("MAX_FOLDED_INPUTS"))
        waiting_id = waiting.id
    else:
        # It becomes due when it takes the key (a run_after of its start is not kept).
        behind_fields = {**fields, "due_at": None, "timeout_at": None}
        behind = _new_run(
            workflow, payload, key, holds_key=False, runs_after_id=holder.id, **behind_fields
        )
        if not store.insert_run(behind):
            return None  # another start left its waiting run first: update that one
        _announce_new_run(workflow, behind, notify=False)
        waiting_id = behind.id
    _duplicate(workflow, key, holder, payload, "run_again", runs_after=holder.id)
    return StartResult(waiting_id, "run_again")


def _announce_new_run(workflow, run: store.NewRun, *, notify: bool = True, connection=None) -> None:
    if notify and run.due_at is not None and run.due_at <= store.now():
        store.notify_due(run.queue)
    store.send_after_commit(
        signals.run_started,
        workflow,
        connection=connection,
        run_id=run.id,
        workflow=run.workflow,
        key=run.key,
    )


def _duplicate(workflow, key, holder: Run, payload: dict, outcome: str, **extra) -> None:
    """Record a start that found its key taken: activity now, a signal after commit."""
    input_changed = payload != holder.input
    details = {"outcome": outcome, "input_changed": input_changed, "input": payload}
    if "runs_after" in extra:
        details["runs_after"] = str(extra["runs_after"])
    store.record_activity(
        Activity.Kind.KEY_DUPLICATE,
        run_id=holder.id,
        workflow=workflow.name,
        key=key,
        details=details,
    )
    _announce_duplicate(workflow, key, holder.id, payload, outcome, input_changed)


def _announce_duplicate(
    workflow, key, holder_id, payload, outcome, input_changed, connection=None
) -> None:
    store.send_after_commit(
        signals.key_duplicate,
        workflow,
        connection=connection,
        run_id=holder_id,
        workflow=workflow.name,
        key=key,
        outcome=outcome,
        input_changed=input_changed,
        input=payload,
    )


def _record_handoff(workflow, key: str, from_id: uuid.UUID, to_id: uuid.UUID) -> None:
    store.record_activity(
        Activity.Kind.KEY_HANDED_OFF,
        run_id=to_id,
        workflow=workflow.name,
        key=key,
        details={"from_run_id": str(from_id), "to_run_id": str(to_id)},
    )
    _announce_handoff(workflow, key, from_id, to_id)


def _announce_handed_off(workflow, key: str, from_id: uuid.UUID, run: store.NewRun) -> None:
    """A start took the key of a finished holder (``store.hand_off`` wrote it all)."""
    _announce_new_run(workflow, run, notify=False)  # the statement sent the NOTIFY
    _announce_handoff(workflow, key, from_id, run.id)


def _announce_handoff(workflow, key: str, from_id: uuid.UUID, to_id: uuid.UUID) -> None:
    store.send_after_commit(
        signals.key_handoff,
        workflow,
        from_run_id=from_id,
        to_run_id=to_id,
        workflow=workflow.name,
        key=key,
    )
