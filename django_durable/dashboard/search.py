"""The runs search box: ``key:article:42 status:failed workflow:process_article text``.

``key:`` takes everything after the first colon up to the next space (so
``key:article:42`` is the key ``article:42``); wrap a value in double quotes
to include spaces (``key:"order 7"``). ``status:``, ``workflow:``, ``queue:`` and
``flow:`` (or ``flow_key:``, a run's flow key) match exactly. Anything else is
free text: a run id, or a part of a key or a workflow name.

A search is bounded whatever is typed: the text is cut at ``MAX_CHARS`` and at
most ``MAX_WORDS`` free-text words are searched, each a ``LIKE`` in the one
statement; ``notes`` says what was left out. A page asked for a longer search
is sent to the same page with the search cut (``cut_search_url``), so the page
never repeats a 60 KB search in its links and forms. No index serves ``LIKE '%word%'``,
so free text (other than a run id) looks through the newest ``TEXT_WINDOW``
runs only, a range of the ``created_at`` index: without the bound a word that
matches nothing reads the whole table (a second at a million runs).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Q

from django_durable.models import Run, Status

FILTERS = ("key", "status", "workflow", "queue", "flow_key")
# Other names a filter answers to: ``flow:tenant:7`` is ``flow_key:tenant:7``.
ALIASES = {"flow": "flow_key"}
MAX_CHARS = 1000
MAX_WORDS = 8
TEXT_WINDOW = 10_000
TOKEN = re.compile(r'(?:(?P<name>[a-z_]+):)?(?:"(?P<quoted>[^"]*)"?|(?P<bare>\S+))')


@dataclass
class RunSearch:
    """A parsed search: exact filters and the free text left over."""

    filters: dict[str, str] = field(default_factory=dict)
    text: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def apply(self, runs, *, window: bool = False):
        """Filter a ``Run`` queryset by this search (nothing when it has errors).

        ``window=True`` (the dashboard's pages): free text looks through the
        newest ``TEXT_WINDOW`` runs only, and ``notes`` says so. Without it (the
        ``durable list`` command) free text reads every run.
        """
        if self.errors:
            return runs.none()
        condition = Q(**self.filters)
        for word in self.text:
            condition &= _text_filter(word)
        if window and self.scans_text:
            self.notes.append(
                f"Free text looks through the newest {TEXT_WINDOW:,} runs; "
                "key:, status:, workflow:, queue: and flow: search every run."
            )
            start = window_start()
            if start is not None:
                condition &= Q(created_at__gte=start)
        return runs.filter(condition)

    @property
    def scans_text(self) -> bool:
        """Some free-text word is not a run id (a ``LIKE`` no index serves)."""
        return any(not _is_uuid(word) for word in self.text)


def parse(query: str | None) -> RunSearch:
    """Parse the search box's text; unknown statuses become ``errors``."""
    search = RunSearch()
    query = query or ""
    if len(query) > MAX_CHARS:
        search.notes.append(cut_message())
        query = query[:MAX_CHARS]
    for match in TOKEN.finditer(query):
        name = match.group("name")
        value = match.group("quoted") if match.group("quoted") is not None else match.group("bare")
        name = ALIASES.get(name, name)
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
    if len(search.text) > MAX_WORDS:
        left = len(search.text) - MAX_WORDS
        search.notes.append(
            f"Only the first {MAX_WORDS} words were searched; {left} more were left out."
        )
        del search.text[MAX_WORDS:]
    return search


def window_start() -> datetime | None:
    """The creation time of the ``TEXT_WINDOW``-th newest run (None when there
    are fewer): one short walk of the ``created_at`` index. It is read first and
    given to the search as a value, so the planner sees a range of about
    ``TEXT_WINDOW`` rows (as a subquery it guesses a third of the table and
    plans a parallel scan)."""
    nth = Run.objects.order_by("-created_at").values_list("created_at", flat=True)
    found = list(nth[TEXT_WINDOW - 1 : TEXT_WINDOW])
    return found[0] if found else None


def cut_search_url(request, name: str = "q") -> str | None:
    """This page's URL with its search cut to ``MAX_CHARS``, when it is longer."""
    query = request.GET.get(name, "")
    if len(query) <= MAX_CHARS:
        return None
    params = request.GET.copy()
    params[name] = query[:MAX_CHARS]
    return f"{request.path}?{params.urlencode()}"


def cut_message() -> str:
    return f"The search was cut to its first {MAX_CHARS} characters."


def _is_uuid(word: str) -> bool:
    try:
        uuid.UUID(word)
    except ValueError:
        return False
    return True


def _text_filter(word: str) -> Q:
    try:
        return Q(id=uuid.UUID(word))
    except ValueError:
        return Q(key__contains=word) | Q(workflow__contains=word)
