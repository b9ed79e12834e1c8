"""The runs search box: ``key:article:42 status:failed workflow:process_article text``.

``key:`` takes everything after the first colon up to the next space (so
``key:article:42`` is the key ``article:42``); wrap a value in double quotes
to include spaces (``key:"order 7"``). ``status:`` and ``workflow:`` match
exactly. Anything else is free text: a run id, or a part of a key or a
workflow name.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

from django.db.models import Q

from django_durable.models import Status

FILTERS = ("key", "status", "workflow", "queue")
TOKEN = re.compile(r'(?:(?P<name>[a-z]+):)?(?:"(?P<quoted>[^"]*)"?|(?P<bare>\S+))')


@dataclass
class RunSearch:
    """A parsed search: exact filters and the free text left over."""

    filters: dict[str, str] = field(default_factory=dict)
    text: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def apply(self, runs):
        """Filter a ``Run`` queryset by this search."""
        for name, value in self.filters.items():
            runs = runs.filter(**{name: value})
        for word in self.text:
            runs = runs.filter(_text_filter(word))
        return runs


def parse(query: str | None) -> RunSearch:
    """Parse the search box's text; unknown statuses become ``errors``."""
    search = RunSearch()
    for match in TOKEN.finditer(query or ""):
        name = match.group("name")
        value = match.group("quoted") if match.group("quoted") is not None else match.group("bare")
        if name in FILTERS and value:
            if name == "status" and value not in Status.values:
                search.errors.append(
                    f"unknown status {value!r}; statuses are {', '.join(Status.values)}"
                )
                continue
            search.filters[name] = value
        elif name is not None:
            # Not one of ours (e.g. "article:42"): the whole token is text.
            search.text.append(f"{name}:{value}")
        elif value:
            search.text.append(value)
    return search


def _text_filter(word: str) -> Q:
    try:
        return Q(id=uuid.UUID(word))
    except ValueError:
        return Q(key__contains=word) | Q(workflow__contains=word)
