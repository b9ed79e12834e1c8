"""``{% load durable_time %}``: a time said as past or future, as a person reads it.

Django's ``timesince`` says "0 minutes" for any time ahead, so "… ago" next to a
schedule's next fire or an input's timeout reads as overdue; ``relative_time``
says "in 2 days" for those and "3 hours ago" for the past.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django import template
from django.utils import timezone
from django.utils.timesince import timesince, timeuntil

register = template.Library()

# Closer than this to now, a time is "less than a minute" away (timesince says "0 minutes").
NOW = timedelta(minutes=1)


@register.filter
def relative_time(at: datetime | None, now: datetime | None = None) -> str:
    """``at`` from now: "in 2 days", "3 hours ago", "in less than a minute"."""
    if not at:
        return ""
    now = now or timezone.now()
    if at > now:
        return "in less than a minute" if at - now < NOW else f"in {timeuntil(at, now, depth=1)}"
    return "less than a minute ago" if now - at < NOW else f"{timesince(at, now, depth=1)} ago"
