from django.contrib import admin
from django.urls import include, path

from tests import async_views

urlpatterns = [
    path("admin/durable/", include("django_durable.urls")),
    path("admin/", admin.site.urls),
    path("async/start/", async_views.start),
    path("async/runs/<uuid:run_id>/", async_views.run),
    path("async/runs/<uuid:run_id>/<str:action>/", async_views.act),
]
