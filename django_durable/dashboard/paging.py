"""Pages of lists without counting them, and with a bounded page number.

Counting a list of millions of runs costs more than showing a page of it, so a
page knows only whether a next one exists. The page number is bounded: an
offset deeper than ``MAX_PAGE`` pages reads more rows than a person pages
through (and ``?page=9223372036854775807`` must not reach the database).
"""

from __future__ import annotations

from dataclasses import dataclass

PER_PAGE = 50
MAX_PAGE = 200


@dataclass
class Page:
    items: list
    number: int
    has_next: bool
    clamped: bool = False  # the asked-for page was out of bounds

    @property
    def has_previous(self) -> bool:
        return self.number > 1

    @property
    def next_number(self) -> int:
        return self.number + 1

    @property
    def previous_number(self) -> int:
        return self.number - 1


def page_number(raw: str | None) -> tuple[int, bool]:
    """The page asked for, within 1..MAX_PAGE, and whether it had to be bounded."""
    if raw is None or raw == "":
        return 1, False
    text = raw.strip()
    if not text.isdigit() or len(text) > 6:
        return (MAX_PAGE, True) if text.isdigit() else (1, True)
    number = int(text)
    if number < 1:
        return 1, True
    if number > MAX_PAGE:
        return MAX_PAGE, True
    return number, False


def page_of(queryset, request, per_page: int = PER_PAGE) -> Page:
    number, clamped = page_number(request.GET.get("page"))
    start = (number - 1) * per_page
    items = list(queryset[start : start + per_page + 1])
    has_next = len(items) > per_page and number < MAX_PAGE
    return Page(items[:per_page], number, has_next, clamped)
