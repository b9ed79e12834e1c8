"""Admin registrations: runs (read-only, linked to the dashboard), keys, activity,
schedules and workers. The admin index links to the dashboard.

``RunAdmin`` also serves the dashboard: ``dashboard_urls()`` are its pages, each
wrapped in its site's ``admin_view`` and rendered with the site's
``each_context``, so a project's own ``AdminSite`` gives them its login page,
chrome and sidebar. Its change list never counts the runs table (a bounded
count) and never scans it for filter choices (they come from the defined
workflows).
"""

from __future__ import annotations

from functools import cached_property

from django.contrib import admin, messages
from django.contrib.admin.exceptions import NotRegistered
from django.contrib.admin.views.main import SEARCH_VAR
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpResponseRedirect
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from django_durable.dashboard import search, values
from django_durable.dashboard.counts import BOUND
from django_durable.dashboard.urls import APP_NAME, patterns
from django_durable.models import (
    Activity,
    HeldKey,
    QueueState,
    Run,
    Schedule,
    WorkerNode,
)
from django_durable.workflows.definition import registry

# The admin index gains a box of links to the dashboard, unless the project
# already chose its own index template.
if admin.site.index_template is None:
    admin.site.index_template = "django_durable/admin_index.html"


# The JSON columns of a run that may be large (what callers pass in is capped by
# DURABLE["MAX_VALUE_BYTES"], but folded inputs, the state and old rows are not).
_BIG_VALUES = ("input", "inputs", "context", "result", "error", "state")


def _dashboard_url(name: str, *args) -> str | None:
    try:
        return reverse(f"django_durable:{name}", args=args)
    except NoReverseMatch:
        return None


def _run_link(run_id) -> str:
    url = _dashboard_url("run", run_id) if run_id else None
    return format_html('<a href="{}">{}</a>', url, run_id) if url else (str(run_id or "—"))


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows change only through django_durable's operations, never by editing."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class BoundedPaginator(Paginator):
    """Counts at most ``BOUND`` rows: the change list of a million runs pages
    through the newest ones without counting them all."""

    @cached_property
    def count(self) -> int:
        return self.object_list.order_by()[:BOUND].count()


class _DefinedValues(admin.SimpleListFilter):
    """Choices from the defined workflows, not a DISTINCT over every run."""

    def values(self) -> list[str]:
        raise NotImplementedError

    def lookups(self, request, model_admin):
        return [(v, v) for v in sorted(set(self.values()))]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(**{self.parameter_name: value}) if value else queryset


class WorkflowFilter(_DefinedValues):
    title = "workflow"
    parameter_name = "workflow"

    def values(self):
        return [w.name for w in registry.all()]


class QueueFilter(_DefinedValues):
    title = "queue"
    parameter_name = "queue"

    def values(self):
        return [w.queue for w in registry.all()]


_run_admins: list[RunAdmin] = []


def dashboard_admin() -> RunAdmin:
    """The ``RunAdmin`` whose site serves ``django_durable.urls``: the default
    site's, else the last one a project registered on its own site."""
    try:
        return admin.site.get_model_admin(Run)
    except NotRegistered:
        if not _run_admins:
            raise
        return _run_admins[-1]


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "workflow",
        "key",
        "holds_key",
        "status",
        "queue",
        "created_at",
        "finished_at",
        "dashboard",
    )
    list_filter = ("status", WorkflowFilter, QueueFilter, "holds_key")
    search_fields = ("=id", "key", "workflow")
    search_help_text = "key:article:42, status:failed, workflow:name, or text"
    date_hierarchy = None
    ordering = ("-created_at",)
    show_full_result_count = False
    list_select_related = False
    list_per_page = 50  # as the dashboard's lists: half the rendering of the default 100
    paginator = BoundedPaginator

    def __init__(self, model, admin_site):
        super().__init__(model, admin_site)
        _run_admins.append(self)

    def dashboard_urls(self) -> tuple[list, str]:
        """The dashboard's pages on this admin's site, for ``include()``."""
        return patterns(self), APP_NAME

    # The change page never renders a JSON value whole (a run's input was once 209 MB
    # of page): each is read as its head and length (dashboard.values) and shown
    # read-only, cut, with its size and a link to the dashboard. Its links to the
    # parent and the run waiting behind are ids, not the related runs loaded whole.
    exclude = (*_BIG_VALUES, "runs_after", "parent")
    readonly_fields = (
        "parent_run",
        "runs_after_run",
        *(f"{name}_shown" for name in _BIG_VALUES),
    )

    def get_queryset(self, request):
        return super().get_queryset(request).defer(*_BIG_VALUES)

    def get_object(self, request, object_id, from_field=None):
        """The run with each big value's head and length, never the value whole."""
        runs = values.with_heads(self.get_queryset(request), _BIG_VALUES)
        field = Run._meta.pk if from_field is None else Run._meta.get_field(from_field)
        try:
            return runs.get(**{field.name: field.to_python(object_id)})
        except (Run.DoesNotExist, ValidationError, ValueError):
            return None

    @admin.display(description="dashboard")
    def dashboard(self, run):
        url = _dashboard_url("run", run.id)
        return format_html('<a href="{}">open</a>', url) if url else "—"

    @admin.display(description="parent")
    def parent_run(self, run):
        return _run_link(run.parent_id)

    @admin.display(description="runs after")
    def runs_after_run(self, run):
        return _run_link(run.runs_after_id)

    def _shown(self, run, name: str):
        value = values.heads(run, (name,))[name]
        if value.text is None:
            return "—"
        if not value.truncated:
            return format_html('<pre style="white-space: pre-wrap">{}</pre>', value.text)
        url = _dashboard_url("run", run.id)
        whole = (
            format_html(' The whole value: <a href="{}">the run on the dashboard</a>.', url)
            if url
            else ""
        )
        return format_html(
            '<pre style="white-space: pre-wrap">{}…</pre><p class="help">Shown: the first '
            "{} of {} characters of JSON.{}</p>",
            value.text,
            f"{len(value.text):,}",
            f"{value.size:,}",
            whole,
        )

    @admin.display(description="input")
    def input_shown(self, run):
        return self._shown(run, "input")

    @admin.display(description="inputs")
    def inputs_shown(self, run):
        return self._shown(run, "inputs")

    @admin.display(description="context")
    def context_shown(self, run):
        return self._shown(run, "context")

    @admin.display(description="result")
    def result_shown(self, run):
        return self._shown(run, "result")

    @admin.display(description="error")
    def error_shown(self, run):
        return self._shown(run, "error")

    @admin.display(description="state")
    def state_shown(self, run):
        return self._shown(run, "state")

    def changelist_view(self, request, extra_context=None):
        cut = search.cut_search_url(request, SEARCH_VAR)
        if cut is not None:
            messages.warning(request, f"Search: {search.cut_message()}")
            return HttpResponseRedirect(cut)
        return super().changelist_view(request, extra_context)

    def get_search_results(self, request, queryset, search_term):
        """The admin's search box understands the dashboard's syntax too."""
        parsed = search.parse(search_term)
        found = parsed.apply(queryset, window=True)
        for problem in parsed.errors:
            messages.error(request, f"Search: {problem}. No run is shown.")
        for note in parsed.notes:
            messages.warning(request, f"Search: {note}")
        return found, False


@admin.register(HeldKey)
class HeldKeyAdmin(ReadOnlyAdmin):
    """ "Keys" in the admin index opens the dashboard's Keys page."""

    list_display = ("workflow", "key", "id", "status")

    def get_queryset(self, request):
        return super().get_queryset(request).filter(holds_key=True)

    def changelist_view(self, request, extra_context=None):
        url = _dashboard_url("keys")
        if url is None:
            return super().changelist_view(request, extra_context)
        return HttpResponseRedirect(url)


@admin.register(Activity)
class ActivityAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "kind", "workflow", "key", "run_link", "outcome")
    list_filter = ("kind", "workflow")
    search_fields = ("key", "=run_id")
    ordering = ("-created_at", "-id")
    show_full_result_count = False

    @admin.display(description="run")
    def run_link(self, activity):
        url = _dashboard_url("run", activity.run_id) if activity.run_id else None
        return format_html('<a href="{}">{}</a>', url, activity.run_id) if url else "—"

    @admin.display(description="outcome")
    def outcome(self, activity):
        return (activity.details or {}).get("outcome", "")


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "workflow",
        "cron",
        "key",
        "enabled",
        "next_fire_at",
        "last_fired_at",
        "last_run",
    )
    list_filter = ("enabled", "workflow")
    search_fields = ("name", "workflow", "key")
    list_editable = ("enabled",)
    readonly_fields = ("next_fire_at", "last_fired_at", "last_run_id", "failures", "created_at")

    @admin.display(description="last run")
    def last_run(self, schedule):
        url = _dashboard_url("run", schedule.last_run_id) if schedule.last_run_id else None
        return format_html('<a href="{}">{}</a>', url, schedule.last_run_id) if url else "—"


@admin.register(WorkerNode)
class WorkerNodeAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "hostname",
        "pid",
        "queues",
        "concurrency",
        "started_at",
        "heartbeat_at",
        "stopping",
    )
    ordering = ("id",)


@admin.register(QueueState)
class QueueStateAdmin(ReadOnlyAdmin):
    """Queues an operator paused or resumed; each pause and resume in the dashboard
    is in a queue's history."""

    list_display = ("name", "paused", "changed_at")
