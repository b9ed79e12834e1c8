"""The waits of ``ctx``: sleeps, events (one, any of several, all of several) and inputs.

A wait that has nothing to return yet suspends the run by raising ``Suspend``;
the executor records it (``store.record_suspended``) and frees the worker. When
the run resumes, the step runs again from its start and each wait it already
passed returns the value recorded for it, in call order (``state.resume`` turns
the wait the run was suspended in into that value). No wait touches the
database: they read what the run already holds, so ``async def`` steps call them
as they are.

What a wait records, and so returns when the step runs again:

- ``sleep``, ``sleep_until``: ``None``;
- ``wait_for_event``, ``wait_for_input``: the payload (or ``timeout_value``);
- ``wait_for_any``: ``[name, payload]`` (``[None, timeout_value]`` on timeout);
- ``wait_for_all``: ``{"payloads": {name: payload}, "timed_out": bool}``; a
  timed-out one raises ``WaitTimeout`` each time the step reaches it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django_durable import store
from django_durable.exceptions import WaitTimeout
from django_durable.operations import state as run_state
from django_durable.operations.inputs import validate_name
from django_durable.operations.state import Suspend
from django_durable.workflows import input_kinds
from django_durable.workflows.durations import as_timedelta
from django_durable.workflows.values import check_json

__all__ = ["Suspend", "WaitMethods"]


def event_names(names: Any) -> list[str]:
    """``wait_for_any`` / ``wait_for_all``'s names: a non-empty list of distinct,
    non-empty strings of at most 200 characters."""
    if isinstance(names, set | frozenset):
        names = sorted(names)
    if not isinstance(names, list | tuple):
        raise TypeError(f"names must be a list of event names, got {type(names).__name__}")
    if not names:
        raise ValueError("names must name at least one event")
    for name in names:
        validate_name(name, "event")
    if len(set(names)) != len(names):
        raise ValueError(f"names must be distinct, got {list(names)!r}")
    return list(names)


def _until(timeout: Any, what: str) -> datetime | None:
    return None if timeout is None else store.now() + as_timedelta(timeout, what)


class WaitMethods:
    """Mixed into ``Context``, which gives ``_run`` and ``_waits`` (the recorded values
    of the waits this execution of the step already passed)."""

    _run: Any
    _waits: list[Any]
    _wait_calls: int = 0

    def _next_wait(self) -> tuple[bool, Any]:
        """The value of this wait if the step passed it before a resume."""
        index = self._wait_calls
        self._wait_calls += 1
        if index < len(self._waits):
            return True, self._waits[index]
        return False, None

    def _passed(self, value: Any) -> Any:
        # A wait answered without suspending is recorded too, so that the waits after
        # it keep their place in call order when the step runs again.
        self._waits.append(value)
        return value

    def _wait_for_one(
        self, kind: str, name: str, until: datetime | None, timeout_value: Any, **suspend: Any
    ) -> Any:
        """An event or input wait: its replayed value, the value already delivered
        (a buffered event, an input given early), or suspend until it comes."""
        done, value = self._next_wait()
        if done:
            return value
        received = run_state.received(self._run.state)
        slot = run_state.event_slot(kind, name)
        if slot in received:
            return self._passed(received[slot])
        raise Suspend(kind, name, until, timeout_value, **suspend)

    def sleep(self, duration: timedelta | float) -> None:
        """Suspend the run for ``duration``; the worker is free meanwhile."""
        duration = as_timedelta(duration, "sleep duration")
        done, _ = self._next_wait()
        if done:
            return None
        raise Suspend("sleep", None, store.now() + duration)

    def sleep_until(self, when: datetime) -> None:
        """Suspend the run until ``when`` (an aware datetime; one in the past resumes
        at once); the worker is free meanwhile."""
        if not isinstance(when, datetime):
            raise TypeError(f"sleep_until takes an aware datetime, got {type(when).__name__}")
        if when.tzinfo is None or when.utcoffset() is None:
            raise TypeError("sleep_until takes an aware datetime (a naive one has no time zone)")
        done, _ = self._next_wait()
        if done:
            return None
        raise Suspend("sleep", None, when)

    def wait_for_event(
        self, name: str, timeout: timedelta | float | None = None, timeout_value: Any = None
    ) -> Any:
        """Return the payload of event ``name`` sent to this run, waiting for it if needed.

        A run gets one event per name: once one was received, every wait for that
        name returns it. Returns ``timeout_value`` when ``timeout`` passes first.
        """
        validate_name(name, "event")
        until = _until(timeout, "event timeout")
        check_json(timeout_value, "timeout_value")
        return self._wait_for_one("event", name, until, timeout_value)

    def wait_for_any(
        self,
        names: list[str],
        timeout: timedelta | float | None = None,
        timeout_value: Any = None,
    ) -> tuple[str | None, Any]:
        """Wait for the first of the events ``names``; return ``(name, payload)``, or
        ``(None, timeout_value)`` when ``timeout`` passes first.

        An event of one of the names that this run already received (or that was sent
        with ``buffer=True`` before the run waited) answers at once: of several, the
        first in ``names`` already received, else the newest kept.
        """
        names = event_names(names)
        until = _until(timeout, "wait_for_any timeout")
        check_json(timeout_value, "timeout_value")
        done, value = self._next_wait()
        if done:
            return value[0], value[1]
        received = run_state.received(self._run.state)
        for name in names:
            slot = run_state.event_slot("event", name)
            if slot in received:
                self._passed([name, received[slot]])
                return name, received[slot]
        raise Suspend("any", None, until, timeout_value, names=tuple(names))

    def wait_for_all(
        self, names: list[str], timeout: timedelta | float | None = None
    ) -> dict[str, Any]:
        """Wait until every event of ``names`` arrived, in any order and over as many
        deliveries as it takes (each is kept as it arrives); return ``{name: payload}``.

        Raises ``durable.WaitTimeout`` (its ``received`` holds what did arrive, its
        ``missing`` the names that did not) when ``timeout`` passes first.
        """
        names = event_names(names)
        until = _until(timeout, "wait_for_all timeout")
        done, value = self._next_wait()
        if not done:
            received = run_state.received(self._run.state)
            slots = {name: run_state.event_slot("event", name) for name in names}
            if any(slot not in received for slot in slots.values()):
                raise Suspend("all", None, until, None, names=tuple(names))
            payloads = {name: received[slot] for name, slot in slots.items()}
            value = self._passed({"payloads": payloads, "timed_out": False})
        if value["timed_out"]:
            got = value["payloads"]
            missing = [name for name in names if name not in got]
            raise WaitTimeout(
                f"wait_for_all timed out without the events {', '.join(map(repr, missing))}",
                received=got,
                missing=missing,
            )
        return dict(value["payloads"])

    def wait_for_input(
        self,
        name: str,
        *,
        kind: str = "any",
        prompt: str | None = None,
        choices: list | None = None,
        timeout: timedelta | float | None = None,
        timeout_value: Any = None,
        on_timeout: str = "resume",
    ) -> Any:
        """Return the value given with ``durable.provide_input(run_id, name, value)``.

        ``kind`` says what fits (``workflows.input_kinds``: ``any``, ``free_text``,
        ``approval``, ``single_choice``, ``multi_choice``, ``form``) and
        ``provide_input`` refuses anything else; ``prompt`` and ``choices`` are shown
        on the dashboard's inputs page. When ``timeout`` passes first the call returns
        ``timeout_value`` (``on_timeout="resume"``), or the run fails
        (``on_timeout="fail"``) without the step running again.
        """
        validate_name(name, "input")
        spec = input_kinds.check_spec(kind, prompt, choices, on_timeout)
        until = _until(timeout, "input timeout")
        check_json(timeout_value, "timeout_value")
        return self._wait_for_one("input", name, until, timeout_value, input_spec=spec)
