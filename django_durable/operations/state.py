"""What ``Run.state`` holds: the one module that reads and writes its JSON keys.

A typed value that operations own: ``RunState`` (its keys below) and ``Suspend``,
the wait a step suspends in; pure functions, no database. Operations and the
runtime decide with them; the store writes what they return. ``Run.state`` is the
run's bookkeeping between executions of a step (a step runs again from its start
when the run resumes, and its waits return what was recorded for them):

- ``waits``: the values of the current step's waits that already passed, in call
  order; ``pending``: the wait the run is suspended in (``PendingWait``);
- ``received``: the event or input received per ``"<kind>:<name>"`` slot (one per
  name for the whole run; a ``wait_for_all``'s events are kept as they arrive);
- ``children``: the ids of the child runs each call started, by ``"<step
  index>:<call number>"``; ``awaiting``: the runs the step waits for; ``starts``: the
  run each ``ctx.start`` call started (or was answered with), by call, so the call
  starts nothing new when the step runs again; ``compensation``: what is left to undo;
- ``partial``: what the current step's suspended executions changed in the context
  so far, as the values they replaced: ``{name: [old value]}``, or ``{name: []}`` for
  a name added (``Changes``). What a completed step or compensation replaced is not
  here: it is written once, with its attempt (``StepAttempt.replaced``);
- ``undo``: on a rerun from a step, what each step before it replaced in its origin,
  by step index (a string), copied once when the rerun starts, so that the rerun can
  itself be rerun from one of them. (A run recorded by an earlier version keeps
  its own steps' here, and its compensations' in ``undo_comp``: still read.)
  ``operations.replay`` finds from these, the attempts' and the run's context the
  context a step began with (a rerun from that step begins with it).

Every function returns a new dict; none changes the one it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

__all__ = [
    "Awaiting",
    "Changes",
    "Compensation",
    "PendingWait",
    "RunState",
    "Suspend",
    "awaited_slots",
    "awaiting",
    "between_steps",
    "compensation_pending",
    "compensations_undone",
    "delivered",
    "event_slot",
    "forget_call",
    "has_children",
    "partial",
    "pending_wait",
    "received",
    "recorded_children",
    "recorded_start",
    "resume",
    "retried",
    "rerun_state",
    "satisfied",
    "slot_of",
    "step_completed",
    "suspended",
    "unanswered_input",
    "undo",
    "waiting_label",
    "with_awaiting",
    "with_children",
    "with_compensation",
    "with_partial",
    "with_start",
    "without_compensated",
]


# Changes to a context, by name: ``[the value replaced]``, or ``[]`` for a name added.
Changes = dict[str, list[Any]]


class PendingWait(TypedDict, total=False):
    """``Run.state["pending"]``: the wait the run is suspended in."""

    kind: str  # "sleep" | "event" | "input" | "any" | "all" | "children"
    name: str | None
    timeout_value: Any
    names: list[str]  # "any" and "all"
    input: dict[str, Any]  # "input": kind, prompt, choices, on_timeout
    since: str | None  # ISO 8601
    timeout_at: str | None  # ISO 8601


class Awaiting(TypedDict):
    """``Run.state["awaiting"]``: the runs the step waits for."""

    ids: list[str]
    mode: str


class Compensation(TypedDict):
    """``Run.state["compensation"]``: the steps still to undo, and the one that failed."""

    pending: list[int]
    failed_step: str | None


class RunState(TypedDict, total=False):
    """``Run.state``, every key optional (the module's docstring says what each holds)."""

    waits: list[Any]
    pending: PendingWait
    received: dict[str, Any]
    children: dict[str, list[str]]
    awaiting: Awaiting
    starts: dict[str, str]
    compensation: Compensation
    undo: dict[str, Changes]
    partial: Changes
    undo_comp: list[Changes]


@dataclass
class Suspend(Exception):
    """The wait a step suspends in (raised by ``runtime.waits`` and ``operations.children``,
    caught by the executor, recorded as ``RunState["pending"]`` by ``suspended``)."""

    kind: str  # "sleep" | "event" | "input" | "any" | "all" | "children"
    name: str | None
    until: datetime | None
    timeout_value: Any = None
    names: tuple[str, ...] = ()  # "any", "all": the events, in the order the step named them
    input_spec: dict | None = None  # "input": what ``check_spec`` recorded


def _of(state: RunState | None) -> RunState:
    return state if state is not None else RunState()


def event_slot(kind: str, name: str | None) -> str:
    return f"{kind}:{name}"


def slot_of(wait: Suspend) -> str | None:
    """The ``received`` slot a single wait takes its value from (none for a sleep,
    children, or a wait for several events: ``awaited_slots``)."""
    if wait.kind in ("event", "input"):
        return event_slot(wait.kind, wait.name)
    return None


def received(state: RunState | None) -> dict[str, Any]:
    return dict(_of(state).get("received") or {})


# The column ``Run.waiting_for`` is 300 characters; the state keeps every name.
WAITING_FOR_CHARS = 300


# --- waits -----------------------------------------------------------------------


def between_steps(state: RunState | None) -> RunState:
    """A step that completed or failed leaves no waits behind. Events received stay
    (one per name for the whole run), and so do the children each call started, so a
    retried step finds the children that completed instead of starting them again."""
    kept = _of(state).copy()
    for name in list(kept):
        if name not in _KEPT_BETWEEN_STEPS or not kept[name]:  # type: ignore[literal-required]
            del kept[name]  # type: ignore[misc]
    return kept


# What a step's end (completed or failed) leaves of the state: the events received,
# the children and starts of calls, and the record of context changes (a failed
# step's ``partial`` stays: its suspended executions' values are still in the context).
_KEPT_BETWEEN_STEPS = ("received", "children", "starts", "undo", "partial", "undo_comp")


def suspended(
    state: RunState | None,
    waits: list,
    wait: Suspend,
    kept: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> RunState:
    """The step suspends in ``wait`` after passing ``waits`` (at ``at``); ``kept``: the
    events (by slot) sent before the run waited for them, delivered now."""
    new = _of(state).copy()
    new["waits"] = waits
    pending = PendingWait(kind=wait.kind, name=wait.name)
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


def _slots(pending: PendingWait) -> list[str]:
    """Every slot the pending wait takes a value from."""
    if pending.get("kind") in ("event", "input"):
        return [event_slot(pending["kind"], pending["name"])]
    if pending.get("kind") in ("any", "all"):
        return [event_slot("event", name) for name in pending.get("names") or []]
    return []


def awaited_slots(state: RunState | None) -> list[str]:
    """The slots a delivery may fill now: the pending wait's, less those it has (for
    ``all``, the events still missing)."""
    got = received(state)
    return [slot for slot in _slots(_of(state).get("pending") or {}) if slot not in got]


def satisfied(state: RunState | None) -> bool:
    """Whether the pending wait has what it waits for: the event or input, one of the
    events (``any``), every event (``all``)."""
    pending = _of(state).get("pending") or {}
    slots, got = _slots(pending), received(state)
    if not slots:
        return False
    have = [slot in got for slot in slots]
    return all(have) if pending["kind"] == "all" else any(have)


def waiting_label(state: RunState | None) -> str:
    """``Run.waiting_for`` of a run suspended in the pending wait: ``"event:<name>"``,
    ``"input:<name>"``, ``"any:<a>, <b>"``, ``"all:<the names still missing>"``."""
    pending = _of(state).get("pending") or {}
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


def delivered(state: RunState | None, slot: str, payload: Any) -> RunState:
    """An event or input arrived for the wait in ``slot``."""
    return {**_of(state), "received": {**received(state), slot: payload}}


def resume(state: RunState | None) -> tuple[list[Any], RunState]:
    """The values of the current step's passed waits, resolving the one it suspended in
    (a sleep is over; an event or input was received, or its timeout passed), and the
    state left for the step's execution."""
    rest = _of(state).copy()
    waits = list(rest.pop("waits", []))
    pending = rest.pop("pending", None)
    if pending:
        waits.append(_resolved(pending, rest.get("received") or {}))
    return waits, rest


def _resolved(pending: PendingWait, got: dict[str, Any]) -> Any:
    """The value recorded for the wait the run was suspended in (``runtime.waits``)."""
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


def retried(state: RunState | None, at: datetime) -> RunState:
    """The state a failed run resumes with after ``retry()``: its step runs again from
    its start. The wait it was suspended in when it failed (a timeout passed while it
    waited) is kept only when it is over (what it waited for arrived, its sleep ended);
    otherwise it is forgotten, so the step's call waits again, its timeout counted
    afresh, and never returns the timed-out wait's ``timeout_value``. The waits the step
    passed before it, and what the run received, stay."""
    new = _of(state).copy()
    pending = new.get("pending")
    if pending and not (satisfied(new) or _slept(pending, at)):
        del new["pending"]
    return new


def _slept(pending: PendingWait, at: datetime) -> bool:
    """A sleep whose time has come."""
    until = pending.get("timeout_at")
    if pending.get("kind") != "sleep" or until is None:
        return False
    return datetime.fromisoformat(until) <= at


def unanswered_input(state: RunState | None) -> dict | None:
    """The pending input wait, when it ended without a value and its ``on_timeout`` is
    ``"fail"`` (then the run fails instead of the step running again); else None."""
    pending = _of(state).get("pending") or {}
    if pending.get("kind") != "input" or (pending.get("input") or {}).get("on_timeout") != "fail":
        return None
    if event_slot("input", pending["name"]) in received(state):
        return None
    return {"name": pending["name"], "timeout_at": pending.get("timeout_at")}


def pending_wait(state: RunState | None) -> dict[str, Any]:
    """What a waiting run waits for, for people (``list_pending_inputs``, the dashboard):
    ``kind``, ``name``, ``missing`` (the event names still awaited), ``input_kind``,
    ``prompt``, ``choices``, ``since`` and ``timeout_at`` (ISO 8601 or None)."""
    pending = _of(state).get("pending") or {}
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


def has_children(state: RunState | None) -> bool:
    return bool(_of(state).get("children"))


def recorded_children(state: RunState | None, call_key: str) -> list[str] | None:
    return (_of(state).get("children") or {}).get(call_key)


def with_children(state: RunState | None, call_key: str, ids: list, mode: str) -> RunState:
    """A call started the children ``ids`` and the step now awaits them."""
    new = _of(state).copy()
    new["children"] = {**(new.get("children") or {}), call_key: [str(i) for i in ids]}
    return with_awaiting(new, ids, mode)


def recorded_start(state: RunState | None, call_key: str) -> str | None:
    return (_of(state).get("starts") or {}).get(call_key)


def with_start(state: RunState | None, call_key: str, run_id) -> RunState:
    """A ``ctx.start`` call started (or was answered by) ``run_id``."""
    new = _of(state).copy()
    new["starts"] = {**(new.get("starts") or {}), call_key: str(run_id)}
    return new


def awaiting(state: RunState | None) -> dict[str, Any]:
    """``{"ids": [...], "mode": ...}`` of the runs the step waits for ({} if none)."""
    return dict(_of(state).get("awaiting") or {})


def with_awaiting(state: RunState | None, ids: list, mode: str) -> RunState:
    return {**_of(state), "awaiting": {"ids": [str(i) for i in ids], "mode": mode}}


def forget_call(state: RunState | None, call_key: str) -> RunState:
    """A failed call's children are forgotten, so a retry of the step starts new ones."""
    new = _of(state).copy()
    children = dict(new.get("children") or {})
    children.pop(call_key, None)
    new["children"] = children
    new.pop("awaiting", None)
    return new


# --- compensation ------------------------------------------------------------------


def compensation_pending(state: RunState | None) -> list[int]:
    compensation = _of(state).get("compensation")
    return list(compensation.get("pending") or []) if compensation else []


def with_compensation(
    state: RunState | None, pending: list[int], failed_step: str | None
) -> RunState:
    return {**_of(state), "compensation": {"pending": pending, "failed_step": failed_step}}


def without_compensated(state: RunState | None, index: int) -> RunState:
    """The compensation of step ``index`` is done."""
    new = _of(state).copy()
    compensation = new.get("compensation") or Compensation(pending=[], failed_step=None)
    pending = [i for i in compensation.get("pending") or [] if i != index]
    new["compensation"] = {**compensation, "pending": pending}
    return new


# --- context changes (replay and repair: the algebra is operations.replay) -----------


def partial(state: RunState | None) -> Changes:
    """What the current step's suspended executions changed in the context so far."""
    return dict(_of(state).get("partial") or {})


def with_partial(state: RunState | None, changes: Changes) -> RunState:
    new = _of(state).copy()
    if changes:
        new["partial"] = changes
    else:
        new.pop("partial", None)
    return new


def step_completed(state: RunState | None) -> RunState:
    """The state once the current step completed: its ``partial`` gone (what it
    replaced goes with its attempt's record). The same dict when it had none."""
    state = _of(state)
    if "partial" not in state:
        return state
    new = state.copy()
    del new["partial"]
    return new


def undo(state: RunState | None) -> dict[int, Changes]:
    """The ``undo`` entries, by step index."""
    return {int(index): changes for index, changes in (_of(state).get("undo") or {}).items()}


def compensations_undone(state: RunState | None) -> list[Changes]:
    """The ``undo_comp`` entries, oldest first (a run recorded by an earlier version)."""
    return list(_of(state).get("undo_comp") or [])


def rerun_state(undo: dict[int, Changes]) -> RunState:
    """A rerun's first state: what the steps before its first one replaced (``undo``)."""
    return {"undo": {str(index): undo[index] for index in sorted(undo)}} if undo else {}
