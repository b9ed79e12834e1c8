"""``explain()``: what a ``start()`` with these arguments would do now, and why,
writing nothing.

It asks the same questions a start asks, in the same order: the arguments are
checked (the same exceptions), the key's holder is read, and ``keys.decide`` (the
pure rules ``start`` follows) names the action. A start that runs right after may
still find another answer if the holder moves on in between; the answer is the
one the rules give for the holder as it is now.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal, NamedTuple

from django_durable import store
from django_durable.models import ACTIVE_STATUSES
from django_durable.operations import keys
from django_durable.operations.calls import public_call
from django_durable.operations.keys import Action
from django_durable.operations.start import StartOutcome, checked
from django_durable.workflows.definition import OnDuplicate, Workflow

__all__ = ["Explanation", "explain"]


class Explanation(NamedTuple):
    """What a start would do: ``outcome`` (one of ``start_detailed``'s outcomes, or
    ``"key_taken"`` when it would raise ``KeyTaken``), the key's ``holder_id`` (None
    when the key is free or there is none) and the ``reason``, one sentence."""

    outcome: StartOutcome | Literal["key_taken"]
    holder_id: uuid.UUID | None
    reason: str


def _policy_name(policy: str | tuple[str, str]) -> str:
    return f"('send_event', {policy[1]!r})" if isinstance(policy, tuple) else repr(policy)


@public_call("aexplain")
def explain(
    workflow: type[Workflow] | str,
    input: dict[str, Any] | None = None,
    *,
    key: str | None = None,
    on_duplicate: OnDuplicate | None = None,
) -> Explanation:
    """What ``start(workflow, input, key=key, on_duplicate=on_duplicate)`` would do now.

    Raises what that start would raise for bad arguments; writes nothing.
    """
    definition, _input, key, policy = checked(workflow, input, key, on_duplicate)
    if key is None:
        return Explanation("started", None, "Without a key, every start makes a new run.")
    holder = store.get_holder(definition.name, key)
    if holder is None:
        return Explanation("started", None, f"No run holds key {key!r}: a new run takes it.")
    picked_up = holder.started_at is not None
    debounce = definition.debounce is not None
    action = keys.decide(
        reuse=definition.reuse,
        on_duplicate=policy,
        holder=keys.Holder(status=holder.status, picked_up=picked_up),
        debounce=debounce,
    )
    outcome, reason = _say(action, definition, policy, holder.status, picked_up)
    return Explanation(outcome, holder.id, reason)


def _say(action: Action, definition, policy, status: str, picked_up: bool) -> tuple[str, str]:
    reuse = repr(definition.reuse)
    held = f"The holder is {status}"
    if status not in ACTIVE_STATUSES:
        if action is Action.HAND_OFF:
            return "handed_off", f"{held} and reuse={reuse} lets its key go to a new run."
        keeps = f"{held} and reuse={reuse} keeps its key"
        if action is Action.USE_EXISTING:
            return "use_existing", f"{keeps}: on_duplicate='use_existing' answers it."
        return "key_taken", (
            f"{keeps}: on_duplicate={_policy_name(policy)} has nothing to act "
            "on, so KeyTaken is raised."
        )
    not_picked = "" if picked_up else ", not yet picked up by a worker"
    held = f"{held}{not_picked}"
    if action is Action.DEBOUNCE:
        if definition.debounce is not None:
            return "debounced", f"{held}: debounce gives it the newer input and waits again."
        return "run_again", (
            f"{held}: on_duplicate='run_again' gives it the newer input instead of "
            "leaving a run behind it."
        )
    if action is Action.USE_EXISTING:
        return "use_existing", f"{held}: on_duplicate='use_existing' answers with it."
    if action is Action.RAISE_TAKEN:
        if policy == "cancel_existing":
            return "key_taken", (
                f"{held}: on_duplicate='cancel_existing' cannot cancel a compensating run, "
                "so KeyTaken is raised."
            )
        return "key_taken", f"{held}: on_duplicate='error' raises KeyTaken."
    if action is Action.CANCEL_EXISTING:
        return "cancel_existing", (
            f"{held}: on_duplicate='cancel_existing' cancels it and starts a new run."
        )
    if action is Action.RUN_AGAIN:
        return "run_again", (
            f"{held}: on_duplicate='run_again' leaves one run waiting behind it "
            "(or gives the waiting one the newer input)."
        )
    return "send_event", (
        f"{held}: on_duplicate={_policy_name(policy)} sends the input to it as an event."
    )
