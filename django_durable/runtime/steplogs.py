"""Step logs: what a step logged, kept with the attempt that logged it.

A worker runs many steps at once on its threads, and an ``async def`` step runs
on an event loop thread while its database calls run on the worker thread. So
the records of one attempt are not "the records of a thread": they are the
records emitted in the *context* of that attempt. ``capture()`` sets a
``contextvars`` variable for the call; one handler on the root logger, installed
while at least one step is being captured, keeps a record only when the
variable is set where the record was emitted. Context variables follow the
step into its ``asyncio`` tasks and into ``sync_to_async`` / ``asyncio.to_thread``
calls; a thread the step starts itself begins with an empty context, so its
records are not kept.

What is kept is bounded per attempt (``DURABLE["STEP_LOG_RECORDS"]`` records and
``DURABLE["STEP_LOG_BYTES"]`` bytes of JSON, a message at most
``MESSAGE_CHARS``); what does not fit is counted and ends the list with one
marker record (``"truncated": true``). Levels are the logging configuration's:
a record a logger's level drops is never created, so it cannot be kept.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from django_durable import conf

__all__ = ["MESSAGE_CHARS", "Capture", "capture"]

# A message (and its traceback) longer than this keeps its start and its end.
MESSAGE_CHARS = 8000

_current: ContextVar[Capture | None] = ContextVar("django_durable_step_logs", default=None)


class Capture:
    """The records of one call of a step or compensation, within the limits."""

    def __init__(self, max_records: int, max_bytes: int):
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._records: list[dict[str, Any]] = []
        self._bytes = 0
        self._dropped = 0
        self._open = True
        self._lock = threading.Lock()

    def add(self, entry: dict[str, Any]) -> None:
        size = len(json.dumps(entry, ensure_ascii=False).encode())
        with self._lock:
            if not self._open:
                return  # a task the step left behind, still logging after it returned
            if len(self._records) >= self.max_records or self._bytes + size > self.max_bytes:
                self._dropped += 1
                return
            self._records.append(entry)
            self._bytes += size

    def close(self) -> list[dict[str, Any]] | None:
        """The kept records (``None`` when nothing was logged); no record is added after."""
        with self._lock:
            self._open = False
            records = list(self._records)
            if self._dropped:
                records.append(
                    {
                        "at": _iso(datetime.now(UTC)),
                        "level": "WARNING",
                        "logger": "django_durable",
                        "message": (
                            f"{self._dropped} more record(s) not kept: an attempt keeps at most "
                            f"{self.max_records} records and {self.max_bytes} bytes"
                        ),
                        "truncated": True,
                    }
                )
        return records or None


class _StepLogHandler(logging.Handler):
    """On the root logger while steps run: passes each record to the capture of the
    context it was emitted in, if any."""

    def __init__(self):
        super().__init__(level=logging.NOTSET)
        self.setFormatter(logging.Formatter())

    def emit(self, record: logging.LogRecord) -> None:
        captured = _current.get()
        if captured is None:
            return
        try:
            captured.add(self.entry(record))
        except Exception:
            self.handleError(record)

    def entry(self, record: logging.LogRecord) -> dict[str, Any]:
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{self.formatter.formatException(record.exc_info)}"
        elif record.exc_text:
            message = f"{message}\n{record.exc_text}"
        return {
            "at": _iso(datetime.fromtimestamp(record.created, UTC)),
            "level": record.levelname,
            "logger": record.name,
            "message": _bounded(message),
        }


_handler = _StepLogHandler()
_installed = 0
_install_lock = threading.Lock()


@contextlib.contextmanager
def capture() -> Iterator[Capture]:
    """Keep what is logged in this context until the block ends; ``close()`` the
    capture for the records (the executor does, through ``runtime.calling``)."""
    max_records = conf.get("STEP_LOG_RECORDS")
    captured = Capture(max_records, conf.get("STEP_LOG_BYTES"))
    if max_records == 0:
        yield captured  # step logs are off
        return
    _install()
    token = _current.set(captured)
    try:
        yield captured
    finally:
        _current.reset(token)
        _uninstall()


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed == 0:
            logging.getLogger().addHandler(_handler)
        _installed += 1


def _uninstall() -> None:
    global _installed
    with _install_lock:
        _installed -= 1
        if _installed == 0:
            logging.getLogger().removeHandler(_handler)


def _bounded(message: str) -> str:
    # NUL is refused by PostgreSQL's jsonb: a log line must never fail a step.
    message = message.replace("\x00", "\\x00")
    if len(message) <= MESSAGE_CHARS:
        return message
    half = MESSAGE_CHARS // 2
    cut = len(message) - 2 * half
    return f"{message[:half]}\n[... {cut} characters not kept ...]\n{message[-half:]}"


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="microseconds")
