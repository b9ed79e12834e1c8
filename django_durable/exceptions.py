"""Exceptions raised by django-durable's public API.

Mistakes in a call's arguments raise Python's usual kinds, so that ``except
ValueError`` and friends work as anywhere: ``LookupError`` (an unknown workflow:
``UnknownWorkflow``), ``TypeError`` (an argument of the wrong type), ``ValueError``
(a refused value; a bad key: ``InvalidKey``, also Django's ``ValidationError``).
Those of them that are ours also derive from ``DurableError`` (docs/keys.md).
"""

import uuid

from django.core.exceptions import (
    ImproperlyConfigured,
    SynchronousOnlyOperation,
    ValidationError,
)


class DurableError(Exception):
    """Base class of every django-durable error."""


class UnknownWorkflow(DurableError, LookupError):
    """No workflow of that name is defined in this process (or the class given is
    abstract): a ``LookupError``."""


class InvalidKey(DurableError, ValidationError, ValueError):
    """A key that is not 1 to 255 bytes of text with something besides whitespace in
    it: a ``ValueError``, and Django's ``ValidationError`` (``.code`` says which rule:
    ``key_type``, ``key_empty``, ``key_blank``, ``key_too_long``, ``key_nul``,
    ``key_encoding``). A key that is not a ``str`` raises ``InvalidKeyType``, a
    ``TypeError`` too."""

    def __init__(self, message: str, code: str, params: dict | None = None):
        super().__init__(message, code=code, params=params)

    def __str__(self) -> str:
        return self.messages[0]

    def __reduce__(self):
        return (type(self), (self.message, self.code, self.params))


class InvalidKeyType(InvalidKey, TypeError):
    """A key that is not a ``str`` (nor ``None``): an ``InvalidKey`` and a ``TypeError``."""


class CalledFromAsync(DurableError, SynchronousOnlyOperation):
    """A synchronous call (``start()``...) made from async code, where Django refuses
    database work: the message names the ``a*`` twin to await instead (``astart()``).
    A subclass of Django's ``SynchronousOnlyOperation``."""


class NotMigrated(DurableError, ImproperlyConfigured):
    """django-durable's tables are missing or behind this version: ``python manage.py
    migrate`` was not run. Raised by the public calls, and said by the worker, the
    dashboard and ``manage.py durable``, instead of the database's "no such table"."""


class KeyTaken(DurableError):
    """The key is held by another run, and this call may not take it.

    ``holder_id`` is the id of the run that holds the key.
    """

    def __init__(self, holder_id: uuid.UUID, message: str | None = None):
        self.holder_id = holder_id
        super().__init__(message or f"the key is held by run {holder_id}")

    def __reduce__(self):
        return (type(self), (self.holder_id, str(self)))


class KeyContended(DurableError):
    """The key changed hands three times during one start; retrying is safe."""


class NotFinished(DurableError):
    """The run is still going (pending, running, waiting or compensating)."""


class NoKey(DurableError):
    """The run holds no key."""


class NotFailed(DurableError):
    """Only a failed run can be retried."""


class AlreadyFinished(DurableError):
    """The run has finished and cannot be cancelled."""


class NotCancellable(AlreadyFinished):
    """The run is compensating: its compensations must run to their end."""


class NotWaiting(DurableError):
    """The run is not waiting for that event or input."""


class Cancelled(DurableError):
    """Raised inside a step (by ``ctx.heartbeat()``) when the run was cancelled."""


class ChildFailed(DurableError):
    """A child run (``ctx.call_workflow``) ended without completing.

    ``run_id`` is the child's id, ``status`` how it ended (``failed``,
    ``cancelled``, ``compensated``, ``compensation_failed``) and ``error`` its error.
    """

    def __init__(self, run_id: uuid.UUID, status: str, error=None, message: str | None = None):
        self.run_id = run_id
        self.status = status
        self.error = error
        super().__init__(message or f"child run {run_id} ended {status}")

    def __reduce__(self):
        return (type(self), (self.run_id, self.status, self.error, str(self)))


class ParallelFailed(ChildFailed):
    """A branch of ``durable.parallel`` ended without completing.

    ``outcomes`` lists every branch in order, each a dict with ``run_id``,
    ``status``, ``result`` and ``error``; ``run_id``/``status``/``error`` are
    those of the first branch that failed.
    """

    def __init__(self, outcomes: list[dict], message: str | None = None):
        self.outcomes = outcomes
        first = next(o for o in outcomes if o["status"] != "completed")
        failed = sum(1 for o in outcomes if o["status"] != "completed")
        super().__init__(
            first["run_id"],
            first["status"],
            first["error"],
            message or f"{failed} of {len(outcomes)} parallel branches did not complete",
        )

    def __reduce__(self):
        return (type(self), (self.outcomes, str(self)))


class NonRetryable(DurableError):
    """Raised by a step to fail it at once: no further attempt, whatever its ``retries``."""


class StepTimeout(DurableError):
    """An attempt of a step ran past the step's ``timeout``; it counts as a failed attempt."""


class RunTimedOut(Cancelled):
    """Raised inside a step (by ``ctx.heartbeat()``) when the run passed its ``timeout``
    or the attempt passed its step's ``timeout``: the step should stop; the attempt
    ends as failed and nothing it returns is recorded."""


class StreamClosed(DurableError):
    """A write to a stream that was closed (``writer.close()``), or whose run finished."""


class DefinitionChanged(DurableError):
    """The run's next step is not the step it was started with (the workflow's code
    changed under it: a step removed, renamed or moved). The run fails instead of
    running a different step; ``retry()`` resumes it once a matching definition is
    deployed."""


class WaitTimeout(DurableError):
    """``ctx.wait_for_all`` timed out before every event arrived; a step may catch it
    (uncaught, it fails the attempt like any exception).

    ``received`` is a dict of the events that did arrive (name -> payload),
    ``missing`` the list of names that did not.
    """

    def __init__(
        self, message: str, received: dict | None = None, missing: list[str] | None = None
    ):
        self.received = dict(received or {})
        self.missing = list(missing or [])
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.received, self.missing))
