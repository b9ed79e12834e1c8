"""Signals sent by django-durable. All are sent after the transaction that
caused them commits, so a receiver never sees work that was rolled back.

- ``run_started(sender=WorkflowClass, run_id, workflow, key)``: a run was created.
- ``run_finished(sender=WorkflowClass, run_id, workflow, key, status)``: a run finished.
- ``key_duplicate(sender=WorkflowClass, run_id, workflow, key, outcome,
  input_changed, input)``: a start found its key taken; ``run_id`` is the run
  that answered it.
- ``key_handoff(sender=WorkflowClass, from_run_id, to_run_id, workflow, key)``:
  a new run took the key from a finished or replaced run.
- ``key_release(sender=WorkflowClass, run_id, workflow, key, by)``: a finished
  run's key was released.
- ``attempt_recorded(sender=StepAttempt, attempt)``: an attempt of a step or a
  compensation was recorded (completed, failed, suspended, cancelled or lost).
  The store writes attempts with the run's update in one statement, not with
  ``save()``: listen to this, not to ``post_save`` of ``StepAttempt``.

django-durable's own telemetry is not a receiver but each signal's *observer*
(``observe``): a plain call made where the signal is sent, before its receivers.
A signal no project connected to then costs its sender a dictionary look-up and,
with telemetry installed, the question whether a provider listens (asked of the
API at most once a second); as a receiver, telemetry cost a start Django's
dispatch (about 5 µs of CPU) even then.
"""

import logging
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_durable")

run_started = Signal()
run_finished = Signal()
key_duplicate = Signal()
key_handoff = Signal()
key_release = Signal()
attempt_recorded = Signal()

# Each signal's observer (telemetry's spans and metrics) and what says whether it
# observes now, set by ``observe``.
_observers: dict[Signal, tuple[Callable[..., Any], Callable[[], bool]]] = {}


def _always() -> bool:
    return True


def observe(
    signal: Signal,
    observer: Callable[..., Any] | None,
    *,
    when: Callable[[], bool] | None = None,
) -> None:
    """Make ``observer(sender, **kwargs)`` django-durable's own observer of
    ``signal`` (at most one per signal); ``None`` removes it. ``when()``, if given,
    says whether it observes at the moment (telemetry: whether a provider
    listens): while it says no, the signal costs its sender nothing more than a
    signal nobody listens to."""
    if observer is None:
        _observers.pop(signal, None)
    else:
        _observers[signal] = (observer, when or _always)


def _observer(signal: Signal) -> Callable[..., Any] | None:
    """The observer of ``signal``, if it observes now."""
    found = _observers.get(signal)
    return found[0] if found is not None and found[1]() else None


def listened(signal: Signal) -> bool:
    """Whether sending ``signal`` reaches anything: a receiver or an observer."""
    return bool(signal.receivers) or _observer(signal) is not None


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` to its observer, then to its receivers (``send_robust``). An
    exception in either is logged, never raised: what the signal tells has happened."""
    observer = _observer(signal)
    if observer is not None:
        try:
            observer(sender, **kwargs)
        except Exception:
            logger.exception("the observer of a django-durable signal failed")
    if signal.receivers:
        signal.send_robust(sender=sender, **kwargs)
