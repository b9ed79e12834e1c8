"""The flow limits as a claim takes them (``store.claim(flow_limits=...)``): the
parameter's type. The store reads no declaration: its caller (the worker,
``testing.drain``) translates the workflows' declarations into these values
(operations/flow.py) and passes them to each claim; a claim without them applies
no flow limit."""

from __future__ import annotations

from datetime import timedelta
from typing import NamedTuple

__all__ = ["FlowLimit"]


class FlowLimit(NamedTuple):
    """One workflow's flow limits as the claim takes them (None: no such limit):
    ``concurrency_per_key``, the workflow's ``concurrency``, and ``rate_per_key``'s
    limit and window."""

    key_cap: int | None
    cap: int | None
    rate: int | None
    per: timedelta | None
