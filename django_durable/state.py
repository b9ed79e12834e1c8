"""What ``Run.state`` holds: the one module that reads and writes its JSON keys.

``Run.state`` is the run's bookkeeping between executions of a step (a step
runs again from its start when the run resumes, and its waits return what was
recorded for them):

- ``waits``: the values of the current step's waits that already passed, in
  call order;
- ``pending``: the wait the run is suspended in (``kind``, ``name``,
  ``timeout_value``);
- ``received``: the event or input received per ``"<kind>:<name>"`` slot (one per
  name for the whole run);
- ``children``: the ids of the child runs each call started, by
  ``"<step index>:<call number>"``, and ``awaiting``: the runs the step waits for
  (``ids``, ``mode``);
- ``starts``: the id of the run each ``ctx.start`` call started (or was answered
  with), by ``"<step index>:<call number>"``, so the call starts nothing new when
  the step runs again;
- ``compensation``: the steps still to undo (``pending``, step indexes in the
  order to undo them) and the step that failed (``failed_step``).

Every function returns a new dict; none changes the one it is given.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "awaiting",
    "between_steps",
    "compensation_pending",
    "delivered",
    "event_slot",
    "forget_call",
    "has_children",
    "received",
    "recorded_children",
    "recorded_start",
    "resume",
    "slot_of",
    "suspended",
    "with_awaiting",
    "with_children",
    "with_compensation",
    "with_start",
    "without_compensated",
]


def event_slot(kind: str, name: str) -> str:
    return f"{kind}:{name}"


def slot_of(wait) -> str | None:
    """The ``received`` slot a wait takes its value from (a sleep or children: none)."""
    return None if wait.kind in ("sleep", "children") else event_slot(wait.kind, wait.name)


def received(state: dict | None) -> dict[str, Any]:
    return dict((state or {}).get("received") or {})


# --- waits -----------------------------------------------------------------------


def between_steps(state: dict | None) -> dict:
    """A step that completed or failed leaves no waits behind. Events received stay
    (one per name for the whole run), and so do the children each call started, so a
    retried step finds the children that completed instead of starting them again."""
    state = state or {}
    return {name: state[name] for name in ("received", "children", "starts") if state.get(name)}


def suspended(state: dict | None, waits: list, wait, kept_payload: Any = None) -> dict:
    """The step suspends in ``wait`` after passing ``waits``; ``kept_payload``: an event
    sent before the run waited for it, delivered now."""
    new = dict(state or {})
    new["waits"] = waits
    new["pending"] = {"kind": wait.kind, "name": wait.name, "timeout_value": wait.timeout_value}
    got = received(state)
    if kept_payload is not None:
        got[slot_of(wait)] = kept_payload
    new["received"] = got
    return new


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
        if pending["kind"] == "sleep":
            waits.append(None)
        else:
            slot = event_slot(pending["kind"], pending["name"])
            got = rest.get("received", {})
            waits.append(got[slot] if slot in got else pending.get("timeout_value"))
    return waits, rest


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
