"""Keys in the order a person expects: ``article:2`` before ``article:11``.

The database orders keys as strings (``article:1``, ``article:11``, ``article:2``):
the Keys page walks the (workflow, key) index in that order to read one page
without a count, and an index in natural order would need a collation the
database may not have. So each page shown is sorted naturally, and the pages
follow the index: with more keys than a page holds, ``article:2`` is on the page
where the string order puts it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

DIGITS = re.compile(r"(\d+)")


def natural(text: str | None) -> tuple:
    """A sort key: runs of digits compare as numbers, the rest as text."""
    parts = DIGITS.split(text or "")
    return tuple((0, int(p), p) if i % 2 else (1, 0, p) for i, p in enumerate(parts) if p)


def sorted_keys(rows: Iterable[dict]) -> list[dict]:
    """Key rows (``workflow``, ``key``...) in natural order of workflow, then key."""
    return sorted(rows, key=lambda row: (row["workflow"], natural(row["key"])))
