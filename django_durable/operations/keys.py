"""The key rules: what a start does when its key is already held.

Pure functions of the workflow's policies and the holder's state: no I/O, so
every cell of the reuse table and the on_duplicate table is tested directly.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from django_durable.exceptions import InvalidKey, InvalidKeyType
from django_durable.models import ACTIVE_STATUSES, Status

MAX_KEY_BYTES = 255

# Statuses of a finished holder that each reuse policy lets a new start take.
_FREE_WHEN_FINISHED = {
    "after_close": frozenset(
        {
            Status.COMPLETED,
            Status.FAILED,
            Status.CANCELLED,
            Status.COMPENSATED,
            Status.COMPENSATION_FAILED,
        }
    ),
    "after_failure": frozenset(
        {Status.FAILED, Status.CANCELLED, Status.COMPENSATED, Status.COMPENSATION_FAILED}
    ),
    "never": frozenset(),
}


class Action(enum.Enum):
    HAND_OFF = "hand_off"  # the holder has finished and reuse lets it go
    USE_EXISTING = "use_existing"  # answer with the holder
    RAISE_TAKEN = "raise_taken"  # KeyTaken(holder)
    CANCEL_EXISTING = "cancel_existing"  # cancel the holder, start a new run
    RUN_AGAIN = "run_again"  # one run waits behind the holder
    SEND_EVENT = "send_event"  # hand the input to the holder as an event
    DEBOUNCE = "debounce"  # the not-yet-picked-up holder takes the newer input


@dataclass(frozen=True)
class Holder:
    """What the rules need to know about the run that holds a key."""

    status: str
    picked_up: bool  # a worker has claimed it at least once


def validate_key(key: object) -> str | None:
    """Return the key, or raise ``InvalidKey`` (a ``ValueError`` and a ``ValidationError``)
    when it is not 1 to 255 bytes of text with something besides whitespace in it;
    ``InvalidKeyType`` (a ``TypeError`` too) when it is not a ``str``."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise InvalidKeyType(
            f"A key must be a string, got {type(key).__name__}.",
            code="key_type",
            params={"type": type(key)},
        )
    # Most keys are ASCII: their length is their size in UTF-8, and they hold no
    # surrogate (one scan in C instead of two encodings).
    is_ascii = key.isascii()
    size = len(key) if is_ascii else len(key.encode("utf-8", errors="surrogatepass"))
    if size == 0:
        raise InvalidKey(
            'A key must not be empty: "" is not "no key" (pass None for no key).',
            code="key_empty",
        )
    if key.isspace():  # stops at the first character that is not whitespace
        raise InvalidKey(
            f"A key must not be only whitespace, got {key!r} (pass None for no key).",
            code="key_blank",
        )
    if size > MAX_KEY_BYTES:
        raise InvalidKey(
            f"A key must be at most {MAX_KEY_BYTES} bytes of UTF-8, got {size}.",
            code="key_too_long",
            params={"max": MAX_KEY_BYTES, "size": size},
        )
    if "\x00" in key:
        raise InvalidKey("A key must not contain NUL characters.", code="key_nul")
    if not is_ascii:
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidKey("A key must be valid Unicode text.", code="key_encoding") from None
    return key


def reuse_frees(reuse: str, holder_status: str) -> bool:
    """Whether a finished holder in ``holder_status`` lets a new start take its key."""
    return holder_status in _FREE_WHEN_FINISHED[reuse]


def decide(
    *, reuse: str, on_duplicate: str | tuple[str, str], holder: Holder, debounce: bool = False
) -> Action:
    """What a start does when ``holder`` holds its key."""
    if holder.status not in ACTIVE_STATUSES:
        if reuse_frees(reuse, holder.status):
            return Action.HAND_OFF
        # A finished holder that reuse keeps: nothing to cancel, wait behind or send to.
        return Action.USE_EXISTING if on_duplicate == "use_existing" else Action.RAISE_TAKEN

    # The holder is still going.
    if debounce and holder.status == Status.PENDING and not holder.picked_up:
        return Action.DEBOUNCE
    if on_duplicate == "use_existing":
        return Action.USE_EXISTING
    if on_duplicate == "error":
        return Action.RAISE_TAKEN
    if on_duplicate == "cancel_existing":
        # Compensations must run to their end; a compensating run can't be replaced.
        if holder.status == Status.COMPENSATING:
            return Action.RAISE_TAKEN
        return Action.CANCEL_EXISTING
    if on_duplicate == "run_again":
        # Nothing waits behind a run that no worker has picked up: it takes the input itself.
        if not holder.picked_up and holder.status == Status.PENDING:
            return Action.DEBOUNCE
        return Action.RUN_AGAIN
    return Action.SEND_EVENT


def retake_allowed(reuse: str, holder_status: str) -> bool:
    """A retry takes its key back from a newer run by the start rules."""
    return holder_status not in ACTIVE_STATUSES and reuse_frees(reuse, holder_status)


_ANSWERS = {"use_existing": Action.USE_EXISTING, "error": Action.RAISE_TAKEN}


def holder_answers(
    *, reuse: str, on_duplicate: str | tuple[str, str], debounce: bool = False
) -> frozenset[tuple[str, bool]]:
    """The holder states ``(status, picked_up)`` in which a start just answers with the
    holder (``use_existing``) or refuses (``error``), writing nothing but the duplicate's
    activity row; empty for the policies whose duplicates write more. The store records
    such a duplicate in the same statement that found the key taken."""
    answer = _ANSWERS.get(on_duplicate) if isinstance(on_duplicate, str) else None
    if answer is None:
        return frozenset()
    return frozenset(
        (status, picked_up)
        for status in Status.values
        for picked_up in (False, True)
        if decide(
            reuse=reuse,
            on_duplicate=on_duplicate,
            holder=Holder(status=status, picked_up=picked_up),
            debounce=debounce,
        )
        is answer
    )
