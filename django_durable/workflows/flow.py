"""Flow control by key (docs/flow-control.md): what a workflow declares about *when*
its runs may run, per flow key, and the flow key of a new run.

```
class SyncAccount(Workflow):
    flow_key = staticmethod(lambda input: f"tenant:{input['tenant']}")
    concurrency_per_key = 2
    rate_per_key = durable.Rate(10, per=durable.minutes(1))
    concurrency = 50
```

A flow key is not a workflow key: keys decide whether a start creates a run, flow
keys decide when a run may run. It is computed once, at the start, and stored on
the run (``Run.flow_key``); the claim (store/claims.py, the function durable_claim) enforces
the limits in its own transaction. A bad declaration fails when the class is
defined (``ImproperlyConfigured``) and again as a system check error
(``django_durable.E040``), which also sees a value set afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

__all__ = [
    "MAX_FLOW_KEY_BYTES",
    "FlowLimits",
    "Rate",
    "check_flow_key",
    "flow_key_of",
    "flow_limits",
    "flow_problem",
]

# A flow key is 1 to 255 bytes of UTF-8 (durable_run_flow_key_length).
MAX_FLOW_KEY_BYTES = 255


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``limit`` runs begin per flow key in any window of length ``per`` (a
    positive ``timedelta``; a bare number is refused: seconds or minutes?)."""

    limit: int
    per: timedelta

    def __post_init__(self) -> None:
        if not isinstance(self.limit, int) or isinstance(self.limit, bool):
            raise TypeError(f"Rate's limit must be an int, got {self.limit!r}")
        if self.limit < 1:
            raise ValueError(f"Rate's limit must be at least 1, got {self.limit}")
        if not isinstance(self.per, timedelta):
            raise TypeError(
                f"Rate's per must be a timedelta (durable.seconds(n), durable.minutes(n)), "
                f"got {self.per!r}"
            )
        if self.per <= timedelta(0):
            raise ValueError(f"Rate's per must be positive, got {self.per}")

    def __str__(self) -> str:
        return f"{self.limit} per {_span(self.per)}"


def _span(per: timedelta) -> str:
    seconds = per.total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{unit}" if n == 1 else f"{n} {unit}s"
    return f"{seconds:g} s"


class FlowLimits(NamedTuple):
    """A workflow's flow limits, as the claim takes them (None: no such limit)."""

    concurrency_per_key: int | None
    concurrency: int | None
    rate: Rate | None


def _limit_problem(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        return f"{name} must be an int of at least 1 or None, got {value!r}"
    if value < 1:
        return f"{name} must be at least 1, got {value}"
    return None


def flow_problem(cls: Any) -> str | None:
    """What is wrong with a workflow's flow declaration, or None when it is good."""
    function = getattr(cls, "flow_key", None)
    if function is not None and not callable(function):
        return f"flow_key must be a function of the input or None, got {function!r}"
    for name in ("concurrency_per_key", "concurrency"):
        problem = _limit_problem(name, getattr(cls, name, None))
        if problem:
            return problem
    rate = getattr(cls, "rate_per_key", None)
    if rate is not None and not isinstance(rate, Rate):
        return f"rate_per_key must be a durable.Rate(limit, per=timedelta) or None, got {rate!r}"
    if function is None:
        for name in ("concurrency_per_key", "rate_per_key"):
            if getattr(cls, name, None) is not None:
                return (
                    f"{name} needs a flow_key (a function of the input naming whose work a "
                    "run is); without one no run would have a key to count by"
                )
    return None


def flow_limits(cls: Any) -> FlowLimits | None:
    """The limits the claim enforces for the workflow ``cls``; None when it has none."""
    limits = FlowLimits(
        getattr(cls, "concurrency_per_key", None),
        getattr(cls, "concurrency", None),
        getattr(cls, "rate_per_key", None),
    )
    return None if limits == (None, None, None) else limits


def check_flow_key(value: object, where: str = "flow_key") -> str:
    """A ``str`` of 1 to 255 bytes of UTF-8: ``TypeError`` or ``ValueError`` otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{where} must be a str, got {type(value).__name__}")
    size = len(value) if value.isascii() else len(value.encode("utf-8", errors="surrogatepass"))
    if not 1 <= size <= MAX_FLOW_KEY_BYTES:
        raise ValueError(
            f"{where} must be 1 to {MAX_FLOW_KEY_BYTES} bytes of UTF-8, got {size} bytes"
        )
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{where} must be valid UTF-8 text (it holds a surrogate)") from None
    if "\x00" in value:
        raise ValueError(f"{where} must not hold NUL")
    return value


def flow_key_of(workflow: Any, input: dict, given: object = None) -> str | None:
    """The flow key of a new run of ``workflow`` with ``input``: ``given`` when not
    None (checked), else what the workflow's ``flow_key`` function returns (None: no
    flow key). A function that raises, or returns anything but None or a good str,
    raises ``TypeError``/``ValueError`` naming the workflow, before anything is written."""
    if given is not None:
        return check_flow_key(given)
    function = getattr(workflow, "flow_key", None)
    if function is None:
        return None
    where = f"{workflow.name}'s flow_key"
    try:
        value = function(input)
    except Exception as exc:
        raise ValueError(f"{where} raised {type(exc).__name__}: {exc}") from exc
    if value is None:
        return None
    return check_flow_key(value, f"{where}(input)")
