"""How an exception is kept in a run's or an attempt's ``error``."""

from __future__ import annotations

import traceback
from typing import Any

# The end of a traceback is the part that says where it failed.
TRACEBACK_CHARS = 8000


def describe_error(exc: BaseException) -> dict[str, Any]:
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(exc))[-TRACEBACK_CHARS:],
    }
