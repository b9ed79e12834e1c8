"""Exceptions raised by django-durable's public API."""

import uuid


class DurableError(Exception):
    """Base class of every django-durable error."""


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
