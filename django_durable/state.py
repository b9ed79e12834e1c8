"""What ``Run.state`` holds: the one module that reads and writes its JSON keys.

``Run.state`` is the run's bookkeeping between executions of a step (a step
runs again from its start when the run resumes, and its waits return what was
recorded for them):

- ``waits``: the values of the current step's waits that already passed, in
  call order;
- ``pending``: the wait the run is suspended in (``kind``, ``name``,
  ``timeout_value``; ``names`` for ``wait_for_any`` / ``wait_for_all``; ``input``,
  the kind, prompt, choices and ``on_timeout`` of an input; ``since`` and
  ``timeout_at``, ISO 8601 times);
- ``received``: the event or input received per ``"<kind>:<name>"`` slot (one per
  name for the whole run; the events of a ``wait_for_all`` that arrived so far are
  kept here, one delivery at a time);
- ``children``: the ids of the child runs each call started, by
  ``"<step index>:<call number>"``, and ``awaiting``: the runs the step waits for
  (``ids``, ``mode``);
- ``starts``: the id of the run each ``ctx.start`` call started (or was answered
  with), by ``"<step index>:<call number>"``, so the call starts nothing new when
  the step runs again;
- ``compensation``: the steps still to undo (``pending``, step indexes in the
  order to undo them) and the step that failed (``failed_step``);
- ``undo``: what each completed step changed in the context, by step index (a
  string), as the values it replaced: ``{name: [old value]}``, or ``{name: []}`` for
  a name the step added; a step that changed nothing has no entry. ``partial``: the
  same for what the current step's suspended executions saved so far, and
  ``undo_comp``: for each completed compensation, in order. From them and the run's
  context, ``context_before`` gives the context as it was when a step began (a rerun
  from that step begins with it: ``operations.rerun``).

Every function returns a new dict; none changes the one it is given.
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

__all__ = [
    "awaited_slots",
    "awaiting",
    "between_steps",
    "compensation_changed",
    "compensation_pending",
    "context_before",
    "delivered",
    "event_slot",
    "forget_call",
    "has_children",
    "partial_changes",
    "pending_wait",
    "received",
    "recorded_children",
    "recorded_start",
    "resume",
    "retried",
    "satisfied",
    "slot_of",
    "step_completed",
    "suspended",
    "unanswered_input",
    "undo_before",
    "waiting_label",
    "with_awaiting",
    "with_children",
    "with_compensation",
    "with_partial",
    "with_start",
    "without_compensated",
]


def event_slot(kind: str, name: str) -> str:
    return f"{kind}:{name}"


def slot_of(wait) -> str | None:
    """The ``received`` slot a single wait takes its value from (none for a sleep,
    children, or a wait for several events: ``awaited_slots``)."""
    if wait.kind in ("event", "input"):
        return event_slot(wait.kind, wait.name)
    return None


def received(state: dict | None) -> dict[str, Any]:
    return dict((state or {}).get("received") or {})


# The column ``Run.waiting_for`` is 300 characters; the state keeps every name.
WAITING_FOR_CHARS = 300


# --- waits -----------------------------------------------------------------------


def between_steps(state: dict | None) -> dict:
    """A step that completed or failed leaves no waits behind. Events received stay
    (one per name for the whole run), and so do the children each call started, so a
    retried step finds the children that completed instead of starting them again."""
    state = state or {}
    return {name: state[name] for name in _KEPT_BETWEEN_STEPS if state.get(name)}


# What a step's end (completed or failed) leaves of the state: the events received,
# the children and starts of calls, and the record of context changes (a failed
# step's ``partial`` stays: its suspended executions' values are still in the context).
_KEPT_BETWEEN_STEPS = ("received", "children", "starts", "undo", "partial", "undo_comp")


def suspended(
    state: dict | None,
    waits: list,
    wait,
    kept: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> dict:
    """The step suspends in ``wait`` after passing ``waits`` (at ``at``); ``kept``: the
    events (by slot) sent before the run waited for them, delivered now."""
    new = dict(state or {})
    new["waits"] = waits
    pending: dict[str, Any] = {"kind": wait.kind, "name": wait.name}
    pending["timeout_value"] = wait.timeout_value
    if wait.kind in ("any", "all"):
        pending["names"] = list(wait.names)
    if wait.kind == "input":
        pending["input"] = dict(wait.input_spec or {"kind": "any"})
    pending["since"] = at.isoformat() if at else None
    pending["timeout_at"] = wait.until.isoformat() if wait.until else None
    new["pending"] = pending
    new["received"] = {**received(state), **(kept or {})}
    return new


def _slots(pending: dict) -> list[str]:
    """Every slot the pending wait takes a value from."""
    if pending.get("kind") in ("event", "input"):
        return [event_slot(pending["kind"], pending["name"])]
    if pending.get("kind") in ("any", "all"):
        return [event_slot("event", name) for name in pending.get("names") or []]
    return []


def awaited_slots(state: dict | None) -> list[str]:
    """The slots a delivery may fill now: the pending wait's, less those it has (for
    ``all``, the events still missing)."""
    got = received(state)
    return [slot for slot in _slots((state or {}).get("pending") or {}) if slot not in got]


def satisfied(state: dict | None) -> bool:
    """Whether the pending wait has what it waits for: the event or input, one of the
    events (``any``), every event (``all``)."""
    pending = (state or {}).get("pending") or {}
    slots, got = _slots(pending), received(state)
    if not slots:
        return False
    have = [slot in got for slot in slots]
    return all(have) if pending["kind"] == "all" else any(have)


def waiting_label(state: dict | None) -> str:
    """``Run.waiting_for`` of a run suspended in the pending wait: ``"event:<name>"``,
    ``"input:<name>"``, ``"any:<a>, <b>"``, ``"all:<the names still missing>"``."""
    pending = (state or {}).get("pending") or {}
    kind = pending.get("kind")
    if kind in ("event", "input"):
        label = event_slot(kind, pending["name"])
    elif kind == "any":
        label = "any:" + ", ".join(pending.get("names") or [])
    elif kind == "all":
        missing = [slot.partition(":")[2] for slot in awaited_slots(state)]
        label = "all:" + ", ".join(missing)
    else:
        label = kind or ""
    return label[:WAITING_FOR_CHARS]


def delivered(state: dict | None, slot: str, payload: Any) -> dict:
    """An event or input arrived for the wait in ``slot``."""
    return {**(state or {}), "received": {**received(state), slot: payload}}


def resume(state: dict | None) -> tuple[list[Any], dict]:
    """The values of the current step's passed waits, resolving the one it suspended in
    (a sleep is over; an event or input was received, or its timeout passed), and the
    state left for the step's execution."""
    rest = dict(state or {})
    waits = list(rest.pop("waits", []))
    pending = rest.pop("pending", None)
    if pending:
        waits.append(_resolved(pending, rest.get("received") or {}))
    return waits, rest


def _resolved(pending: dict, got: dict) -> Any:
    """The value recorded for the wait the run was suspended in (``workflows.waits``)."""
    kind = pending["kind"]
    if kind in ("event", "input"):
        slot = event_slot(kind, pending["name"])
        return got[slot] if slot in got else pending.get("timeout_value")
    names = pending.get("names") or []
    if kind == "any":
        for name in names:
            if (slot := event_slot("event", name)) in got:
                return [name, got[slot]]
        return [None, pending.get("timeout_value")]
    if kind == "all":
        payloads = {n: got[event_slot("event", n)] for n in names if event_slot("event", n) in got}
        return {"payloads": payloads, "timed_out": len(payloads) < len(names)}
    return None  # a sleep is over; children are read again by the step


def retried(state: dict | None, at: datetime) -> dict:
    """The state a failed run resumes with after ``retry()``: its step runs again from
    its start. The wait it was suspended in when it failed (a timeout passed while it
    waited) is kept only when it is over (what it waited for arrived, its sleep ended);
    otherwise it is forgotten, so the step's call waits again, its timeout counted
    afresh, and never returns the timed-out wait's ``timeout_value``. The waits the step
    passed before it, and what the run received, stay."""
    new = dict(state or {})
    pending = new.get("pending")
    if pending and not (satisfied(new) or _slept(pending, at)):
        del new["pending"]
    return new


def _slept(pending: dict, at: datetime) -> bool:
    """A sleep whose time has come."""
    until = pending.get("timeout_at")
    if pending.get("kind") != "sleep" or until is None:
        return False
    return datetime.fromisoformat(until) <= at


def unanswered_input(state: dict | None) -> dict | None:
    """The pending input wait, when it ended without a value and its ``on_timeout`` is
    ``"fail"`` (then the run fails instead of the step running again); else None."""
    pending = (state or {}).get("pending") or {}
    if pending.get("kind") != "input" or (pending.get("input") or {}).get("on_timeout") != "fail":
        return None
    if event_slot("input", pending["name"]) in received(state):
        return None
    return {"name": pending["name"], "timeout_at": pending.get("timeout_at")}


def pending_wait(state: dict | None) -> dict[str, Any]:
    """What a waiting run waits for, for people (``list_pending_inputs``, the dashboard):
    ``kind``, ``name``, ``missing`` (the event names still awaited), ``input_kind``,
    ``prompt``, ``choices``, ``since`` and ``timeout_at`` (ISO 8601 or None)."""
    pending = (state or {}).get("pending") or {}
    spec = pending.get("input") or {}
    return {
        "kind": pending.get("kind"),
        "name": pending.get("name"),
        "missing": [slot.partition(":")[2] for slot in awaited_slots(state)],
        "input_kind": spec.get("kind") or "any",
        "prompt": spec.get("prompt"),
        "choices": spec.get("choices"),
        "since": pending.get("since"),
        "timeout_at": pending.get("timeout_at"),
    }


# --- children --------------------------------------------------------------------


def has_children(state: dict | None) -> bool:
    return bool((state or {}).get("children"))


def recorded_children(state: dict | None, call_key: str) -> list[str] | None:
    return ((state or {}).get("children") or {}).get(call_key)


def with_children(state: dict | None, call_key: str, ids: list, mode: str) -> dict:
    """A call started the children ``ids`` and the step now awaits them."""
    new = dict(state or {})
    new["children"] = {**(new.get("children") or {}), call_key: [str(i) for i in ids]}
    return with_awaiting(new, ids, mode)


def recorded_start(state: dict | None, call_key: str) -> str | None:
    return ((state or {}).get("starts") or {}).get(call_key)


def with_start(state: dict | None, call_key: str, run_id) -> dict:
    """A ``ctx.start`` call started (or was answered by) ``run_id``."""
    new = dict(state or {})
    new["starts"] = {**(new.get("starts") or {}), call_key: str(run_id)}
    return new


def awaiting(state: dict | None) -> dict:
    """``{"ids": [...], "mode": ...}`` of the runs the step waits for ({} if none)."""
    return dict((state or {}).get("awaiting") or {})


def with_awaiting(state: dict | None, ids: list, mode: str) -> dict:
    return {**(state or {}), "awaiting": {"ids": [str(i) for i in ids], "mode": mode}}


def forget_call(state: dict | None, call_key: str) -> dict:
    """A failed call's children are forgotten, so a retry of the step starts new ones."""
    new = dict(state or {})
    children = dict(new.get("children") or {})
    children.pop(call_key, None)
    new["children"] = children
    new.pop("awaiting", None)
    return new


# --- compensation ------------------------------------------------------------------


def compensation_pending(state: dict | None) -> list[int]:
    return list(((state or {}).get("compensation") or {}).get("pending") or [])


def with_compensation(state: dict | None, pending: list[int], failed_step: str | None) -> dict:
    return {**(state or {}), "compensation": {"pending": pending, "failed_step": failed_step}}


def without_compensated(state: dict | None, index: int) -> dict:
    """The compensation of step ``index`` is done."""
    new = dict(state or {})
    compensation = dict(new.get("compensation") or {})
    compensation["pending"] = [i for i in compensation.get("pending", []) if i != index]
    new["compensation"] = compensation
    return new


# --- context changes (replay and repair) --------------------------------------------

_ABSENT = object()


def _changes(before: dict, after: dict) -> dict:
    """What turned ``before`` into ``after``, as ``before``'s values of the names that
    differ: ``[value]``, or ``[]`` for a name ``before`` did not have."""
    if before is after or before == after:
        return {}
    changed = {}
    for name in before.keys() | after.keys():
        old = before.get(name, _ABSENT)
        if old is _ABSENT:
            changed[name] = []
        elif after.get(name, _ABSENT) is _ABSENT or after[name] != old:
            changed[name] = [old]
    return changed


def _undo(context: dict, changes: dict | None) -> None:
    """Put back, in ``context``, the values ``changes`` replaced (in place)."""
    for name, old in (changes or {}).items():
        if old:
            context[name] = old[0]
        else:
            context.pop(name, None)


def _began_with(state: dict | None, context: dict) -> dict:
    """The context when the current step began: ``context`` without what its suspended
    executions saved (``partial``)."""
    partial = (state or {}).get("partial")
    if not partial:
        return context
    began = dict(context)
    _undo(began, partial)
    return began


def partial_changes(state: dict | None, context: dict, data: dict) -> dict:
    """What the current step changed so far, when it suspends with ``data`` as its
    context (``context``: the run's context when this execution began)."""
    return _changes(_began_with(state, context or {}), data)


def with_partial(state: dict | None, partial: dict) -> dict:
    new = dict(state or {})
    if partial:
        new["partial"] = partial
    else:
        new.pop("partial", None)
    return new


def step_completed(state: dict | None, index: int, context: dict, data: dict) -> dict:
    """The state once step ``index`` completed with ``data`` as the context
    (``context``: the run's context when this execution began): its changes recorded
    under ``undo``, its ``partial`` gone. The same dict when nothing changed."""
    state = state or {}
    changes = _changes(_began_with(state, context or {}), data)
    if not changes and "partial" not in state:
        return state
    new = {name: value for name, value in state.items() if name != "partial"}
    if changes:
        new["undo"] = {**(state.get("undo") or {}), str(index): changes}
    return new


def compensation_changed(state: dict | None, context: dict, data: dict) -> dict:
    """The state once a compensation completed with ``data`` as the context."""
    changes = _changes(context or {}, data)
    if not changes:
        return state or {}
    return {**(state or {}), "undo_comp": [*((state or {}).get("undo_comp") or []), changes]}


def context_before(context: dict | None, state: dict | None, index: int) -> dict:
    """The context as it was when step ``index`` began, from the run's ``context`` now
    and what its state recorded: nothing that step or a later one put, in any
    execution, nor what compensations changed since. A new dict."""
    state = state or {}
    began = dict(context or {})
    for changes in reversed(state.get("undo_comp") or []):
        _undo(began, changes)
    _undo(began, state.get("partial"))
    undo = state.get("undo") or {}
    for step in sorted((int(name) for name in undo), reverse=True):
        if step >= index:
            _undo(began, undo[str(step)])
    return copy.deepcopy(began)


def undo_before(state: dict | None, index: int) -> dict:
    """The ``undo`` entries of the steps before ``index``: a rerun from that step keeps
    them, so that it can itself be rerun from an earlier step."""
    undo = (state or {}).get("undo") or {}
    return {name: changes for name, changes in undo.items() if int(name) < index}
