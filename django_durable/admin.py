"""Admin registrations: runs (read-only, linked to the dashboard), keys, activity,
schedules and workers. The admin index links to the dashboard."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpResponseRedirect
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html

from django_durable.dashboard import search
from django_durable.models import (
    Activity,
    HeldKey,
    Run,
    Schedule,
    WorkerNode,
)

# The admin index gains a box of links to the dashboard, unless the project
# already chose its own index template.
if admin.site.index_template is None:
    admin.site.index_template = "django_durable/admin_index.html"


def _dashboard_url(name: str, *args) -> str | None:
    try:
        return reverse(f"django_durable:{name}", args=args)
    except NoReverseMatch:
        return None


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows change only through django_durable's operations, never by editing."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


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
    list_filter = ("status", "workflow", "queue", "holds_key")
    search_fields = ("=id", "key", "workflow")
    search_help_text = "key:article:42, status:failed, workflow:name, or text"
    date_hierarchy = None
    ordering = ("-created_at",)
    show_full_result_count = False
    list_select_related = False

    @admin.display(description="dashboard")
    def dashboard(self, run):
        url = _dashboard_url("run", run.id)
        return format_html('<a href="{}">open</a>', url) if url else "—"

    def get_search_results(self, request, queryset, search_term):
        """The admin's search box understands the dashboard's syntax too."""
        parsed = search.parse(search_term)
        if not parsed.errors:
            return parsed.apply(queryset), False
        return queryset.none(), False


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
