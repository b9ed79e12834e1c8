"""Giving back the runs a worker still holds but will not execute further: at
shutdown, when its step was interrupted, when its connection was lost.

A run whose database connection was lost (a restart, a failover, a terminated
backend, a session on a standby) is handed back at once when the database answers;
while it is out of reach the worker keeps the run (``HandBacks``: the heartbeat
renews its lease with the others') and hands it back at its first statement that
succeeds again, so the run never waits for its lease and is not counted as a lost
worker (``MAX_RECOVERIES``). Every hand-back is fenced by the run's claim: a run
another worker took meanwhile is left to it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import DatabaseError

from django_durable import store, telemetry
from django_durable.runtime import executor
from django_durable.runtime.errors import is_connection_fault

logger = logging.getLogger("django_durable.runtime.worker")

__all__ = ["HandBacks", "hand_back_quietly", "hand_back_unknown_claims"]


class HandBacks:
    """The runs a worker gave up while the database was out of reach."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[Any] = []  # the worker's ``Held`` records
        # Those being handed back now: still the worker's until that is done (a claim
        # in doubt must not take them for runs it never heard of).
        self._handing: list[Any] = []

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def held(self) -> list[Any]:
        with self._lock:
            return [*self._waiting, *self._handing]

    def take_all(self) -> list[Any]:
        with self._lock:
            waiting, self._waiting = self._waiting, []
            return waiting

    def give_up(self, held: Any) -> str:
        """Hand back ``held``'s run, still claimed in memory, or say who has it now;
        kept for later when the database is out of reach."""
        run = held.run
        try:
            if executor.hand_back(run):
                return "handed back"
            status = store.current_status(run.id)
        except DatabaseError as exc:
            if is_connection_fault(exc):
                store.reset_connection_after_error(drop=True)
                with self._lock:
                    self._waiting.append(held)
                return "to be handed back as soon as the database answers"
            store.reset_connection_after_error()
            return f"left to lease expiry ({exc})"
        if status is None:
            return "stopped: the run was deleted"
        if status[1] != held.fence:
            telemetry.lease_lost(run)
            return f"stopped: another worker took it over ({status[0]})"
        return f"stopped: it is {status[0]} now"

    def hand_back_all(self) -> None:
        """Hand back the runs kept during an outage, now that the database answers
        (the dispatcher and the heartbeat call it); what meets the outage again is
        kept for the next call."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
            self._handing.extend(waiting)
        try:
            self._hand_back(waiting)
        finally:
            with self._lock:
                self._handing = [held for held in self._handing if held not in waiting]

    def _hand_back(self, waiting: list[Any]) -> None:
        for number, held in enumerate(waiting):
            run = held.run
            try:
                handed = executor.hand_back(run)
            except DatabaseError as exc:
                if is_connection_fault(exc):
                    store.reset_connection_after_error(drop=True)
                    with self._lock:
                        self._waiting.extend(waiting[number:])
                    return
                store.reset_connection_after_error()
                logger.warning(
                    "could not hand back run %s (%s); its lease will expire",
                    run.id,
                    exc,
                    extra=telemetry.log_fields(run),
                )
                continue
            logger.info(
                "run %s (%s) %s once the database answered again",
                run.id,
                run.workflow,
                "handed back" if handed else "not handed back: no longer this worker's",
                extra=telemetry.log_fields(run),
            )


def hand_back_quietly(held: Any) -> None:
    """Hand back ``held``'s run at shutdown; its lease expires if that fails."""
    try:
        executor.hand_back(held.run)
    except DatabaseError as exc:
        logger.warning(
            "could not hand back run %s (%s); its lease will expire",
            held.run.id,
            exc,
            extra=telemetry.log_fields(held.run),
        )


def hand_back_unknown_claims(worker_id: str, known: list) -> None:
    """Hand back the runs a claim gave the worker though it never had the answer (a
    failover at the claim's commit; ``known``: the ids of the runs it holds): unknown
    to it, nothing renews their leases, and they would wait for the lease's expiry
    and count as a lost worker's. Fenced by the claim, as every hand-back."""
    for run in store.claims_unknown_to(worker_id, known):
        if executor.hand_back(run):
            logger.info(
                "run %s (%s) handed back: claimed when the database went away, "
                "before the claim's answer came back",
                run.id,
                run.workflow,
                extra=telemetry.log_fields(run),
            )
