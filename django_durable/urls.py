"""The dashboard's URLs. Include them under the admin, e.g.
``path("admin/durable/", include("django_durable.urls"))`` before ``admin.site.urls``."""

from django.urls import path

from django_durable.dashboard import actions, views

app_name = "django_durable"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("keys/", views.keys, name="keys"),
    path("runs/", views.runs, name="runs"),
    path("runs/<uuid:run_id>/", views.run, name="run"),
    path("runs/<uuid:run_id>/<slug:action>/", actions.run_action, name="run_action"),
    path("workflows/<str:name>/", views.workflow, name="workflow"),
]
