"""``{% load durable_names %}``: long names (keys, ids, class paths) that wrap only
at their separators, never mid-word.

``{{ run.key|breakable }}`` escapes the value and puts a ``<wbr>`` (a line-break
opportunity that shows nothing) after each ``:``, ``/``, ``.``, ``-``, ``_`` or
``@``: ``invoice:2026-12-07`` may break after ``invoice:``, not inside ``invoice``.
"""

from __future__ import annotations

import re

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

register = template.Library()

SEPARATORS = re.compile(r"([:/.\-_@])")


@register.filter
def breakable(value) -> SafeString:
    if value is None:
        return mark_safe("")
    return mark_safe(SEPARATORS.sub(r"\1<wbr>", str(escape(value))))
