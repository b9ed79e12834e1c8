"""The dashboard's filters (django-filter): runs and keys."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta

import django_filters
from django import forms
from django.utils import timezone

from django_durable import query
from django_durable.dashboard import search
from django_durable.models import Run, Status
from django_durable.workflows.definition import registry

HOLDER_STATUSES = [*Status.choices, ("none", "no holder (released)")]


def _choices(names) -> list[tuple[str, str]]:
    return [(name, name) for name in sorted(set(names))]


class _DefinedChoices:
    """Workflow and queue choices come from the defined workflows (reading them
    from a table of millions of runs would cost a scan per page view); a value
    asked for in the URL is accepted too, so links to old workflows work."""

    def __init__(self, data=None, *args, **kwargs):
        super().__init__(data, *args, **kwargs)
        data = data or {}
        workflows = [w.name for w in registry.all()]
        queues = [w.queue for w in registry.all()]
        for name, defined in (("workflow", workflows), ("queue", queues)):
            if name in self.filters:
                asked = [data.get(name)] if data.get(name) else []
                self.filters[name].extra["choices"] = _choices([*defined, *asked])


class RunFilter(_DefinedChoices, django_filters.FilterSet):
    """Runs by workflow, status, queue, creation dates and the search box (``q``)."""

    q = django_filters.CharFilter(
        method="filter_search",
        label="Search",
        widget=forms.TextInput(attrs={"placeholder": "key:article:42 status:failed text"}),
    )
    workflow = django_filters.ChoiceFilter(choices=[])
    status = django_filters.ChoiceFilter(choices=Status.choices)
    queue = django_filters.ChoiceFilter(choices=[])
    created_after = django_filters.DateFilter(
        method="filter_created_after",
        label="Created on or after",
        widget=forms.DateInput(attrs={"type": "date"}),
    )
    created_before = django_filters.DateFilter(
        method="filter_created_before",
        label="Created on or before",
        widget=forms.DateInput(attrs={"type": "date"}),
    )

    class Meta:
        model = Run
        fields: list[str] = []

    def filter_search(self, runs, name, value):
        self.search = search.parse(value)
        return self.search.apply(runs, window=True)

    # Dates are days in the user's current timezone; the bounds are instants, so
    # the filter reads the ``created_at`` index (``created_at::date`` would not).
    def filter_created_after(self, runs, name, value):
        return runs.filter(created_at__gte=_start_of(value))

    def filter_created_before(self, runs, name, value):
        return runs.filter(created_at__lt=_start_of(value + timedelta(days=1)))


def _start_of(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min))


class KeyFilter(_DefinedChoices, django_filters.FilterSet):
    """Keys by workflow, the holder's status, and a key prefix (``q``)."""

    q = django_filters.CharFilter(
        field_name="key",
        lookup_expr="startswith",
        label="Key starts with",
        widget=forms.TextInput(attrs={"placeholder": "article:"}),
    )
    workflow = django_filters.ChoiceFilter(choices=[])
    status = django_filters.ChoiceFilter(
        choices=HOLDER_STATUSES, method="filter_holder_status", label="Holder status"
    )

    class Meta:
        model = Run
        fields: list[str] = []

    def filter_holder_status(self, runs, name, value):
        return query.with_holder_status(runs, value)
