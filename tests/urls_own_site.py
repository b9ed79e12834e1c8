"""A project with its own AdminSite serving the dashboard (test_dashboard_site.py)."""

from django.contrib import admin
from django.urls import include, path

from django_durable.admin import RunAdmin
from django_durable.models import Run


class OpsSite(admin.AdminSite):
    site_header = "Ops console"
    site_title = "Ops"


ops_site = OpsSite(name="ops")
ops_site.register(Run, RunAdmin)

urlpatterns = [
    path("ops/durable/", include(ops_site.get_model_admin(Run).dashboard_urls())),
    path("ops/", ops_site.urls),
]
